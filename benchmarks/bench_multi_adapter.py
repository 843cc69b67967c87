"""Many LoRA clients through one frozen backbone (issue 25, item 3): can batching the clients pay
on this CPU? Sequential vs one backbone pass over every client's batch, on the headline model.

    python benchmarks/bench_multi_adapter.py [--clients 10,20,50] [--batches 1] [--repeats 2] [--vmap]
                                             [--device cpu|cuda]

The model is the headline job's (``config.lora.RUN_DEFAULTS``: a 6-block ViT, embed 64, 3×32×32
inputs, 100 classes, LoRA rank 8 on attn.proj and mlp.fc2, the head trainable); the data are
random CIFAR-100-shaped images (the dataset ``cifar100_shaped`` of ``cifar_shaped.py``, sized per client count),
split iid so that every client holds about ``--batches`` batches of 32 (a real round has more; the ratios are per step). Every client trains
each round (FedAvg, ``--lora-rank 8``, Adam, one local epoch). Per client count, measured in one
process, interleaved (median of ``--repeats`` after a warm-up):

(a) ``sequential``: the sequential executor's round, ``executor.train`` over the round's jobs;
(b) ``loop``: the bare model work of that round: forward + backward of each client's batches, one
    client after another (no optimizer, no engine): the part a batched executor could speed up;
(c) ``multi-adapter``: the batched alternative: at each step the clients' batches (the same
    index batches, each client's own seeded order) concatenated into ONE backbone forward, each
    client's LoRA factors and head applied to its own rows as batched low-rank products
    (``torch.bmm`` over the stacked [clients, r, in] / [clients, out, r] factors, what
    multi-adapter serving systems do) and one backward that gives every client its own
    gradients (the sum of the clients' mean losses; checked against (b): max |Δ∇| printed);
(d) with ``--vmap``: the ``--executor vmap`` round (``torch.func`` over stacked client states).

(c) does (b)'s work without the optimizer step, so loop / multi-adapter is the most a
multi-adapter executor could gain; sequential / loop is the engine's own overhead. The FLOP rate
of (b) (``FlopCounterMode``) against a 2048² float32 matmul says how close to the core's dense
limit the one-by-one loop already runs (measured between the rounds: the machine's load
changes). Prints one line per client count and a final JSON line.

Measured (2026-11-25, 2-core machine shared with other jobs, load 8–11, 1 thread, 1 batch of 32
and a short one per client): loop / multi-adapter 1.05×, 1.05×, 0.94× at 10, 20, 50 clients, and
0.77× in a second 20-client run (4 repeats); sequential / vmap 0.63×, 0.91×, 0.97×. On this CPU
the clients' batches are already large enough: one client's step spends ~95% of its time in
kernels (cProfile: backward 52%, linear 19%, attention 8%, GELU 3%; Adam and the engine ~3%), and
a forward+backward costs nearly the same per sample from batch 32 up (640 samples, interleaved, 6
rounds: batch 64, 128, 320, 640 vs 32: medians 1.10×, 1.13×, 1.18×, 1.03×, bests 1.01×, 0.97×,
1.07×, 0.94×), so one backbone pass over every client's batch saves little or nothing, and the
per-client low-rank products cost some of it back; the gain is on a GPU, where a batch of 32
leaves the device idle.

Measured on an H200 (2026-11-26, ``--device cuda --batches 4 --repeats 3 --vmap``, one run after
vmap ran attention unfused): at 10, 20, 50 clients sequential / multi-adapter 4.30×, 9.12×,
13.75× (loop / multi-adapter 2.90×, 6.73×, 10.68×), sequential / vmap 1.82×, 3.63×, 5.88×; the
loop reaches under 1% of the GPU's 51 TFLOP/s fp32 matmul rate (launch-bound).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from collections.abc import Callable
from typing import Any

import cifar_shaped  # noqa: F401  # registers cifar100_shaped (benchmarks/ is on sys.path when run as a script)
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from pflbench.config.run_config import RunConfig
from pflbench.engine import ClientJob
from pflbench.engine.vmap import contiguous_runs
from pflbench.models.lora import LoRALinear, lora_layers
from pflbench.runs.prepare import prepare
from pflbench.util.seeding import derive_seed

BATCH = 32
TEST_FRAC = 0.2


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_gflops(device: torch.device) -> float:
    """The device's float32 n×n matmul rate (best of 3 after a warm-up), GFLOP/s: n = 2048 on a
    CPU, 8192 on a GPU (large enough to fill it)."""
    n = 8192 if device.type == "cuda" else 2048
    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    torch.mm(a, b)
    best = math.inf
    for _ in range(3):
        synchronize(device)
        started = time.perf_counter()
        torch.mm(a, b)
        synchronize(device)
        best = min(best, time.perf_counter() - started)
    return 2 * n**3 / best / 1e9


def run_config(clients: int, args: argparse.Namespace, executor: str = "sequential") -> RunConfig:
    per_client = args.batches * BATCH + BATCH // 4  # and a short trailing batch: its own step
    samples = math.ceil(clients * per_client / (1 - TEST_FRAC))
    return RunConfig(
        algo="fedavg",
        dataset="cifar100_shaped",  # registered by benchmarks/cifar_shaped.py (imported above)
        dataset_option=(f"samples={samples}",),
        partition="iid",
        num_clients=clients,
        rounds=1,
        test_frac=TEST_FRAC,
        val_frac=0.0,
        lora_rank=args.rank,
        backbone="random",
        batch_size=BATCH,
        device=args.device,
        threads=args.threads,
        executor=executor,
        out="/tmp/pflbench_bench_multi_adapter",
    )


def round_jobs(prepared: Any, clients: int, round_index: int) -> list[ClientJob]:
    algorithm, seed = prepared.algorithm, prepared.config.seed
    return [
        ClientJob(
            k,
            round_index,
            derive_seed(seed, "train", round_index, k),
            algorithm.broadcast(k),
            algorithm.store.get(k),
        )
        for k in range(clients)
    ]


def batch_plans(prepared: Any, jobs: list[ClientJob]) -> list[list[torch.Tensor]]:
    """Each client's index batches of one epoch, drawn as the sequential executor draws them."""
    data = prepared.data
    return [data.train_batch_indices(job.client_id, BATCH, torch.Generator().manual_seed(job.seed)) for job in jobs]


class MultiAdapter:
    """Per-client LoRA factors and heads, stacked, applied to each client's rows of one batch."""

    def __init__(self, model: nn.Module, clients: int) -> None:
        self.model, self.clients = model, clients
        self.layers: dict[str, LoRALinear] = lora_layers(model)
        self.head: nn.Linear = model.get_classifier()  # type: ignore[operator]
        self.factors = {
            name: (
                layer.lora_A.detach().expand(clients, -1, -1).clone().requires_grad_(True),
                layer.lora_B.detach().expand(clients, -1, -1).clone().requires_grad_(True),
            )
            for name, layer in self.layers.items()
        }
        self.head_weight = self.head.weight.detach().expand(clients, -1, -1).clone().requires_grad_(True)
        self.head_bias = self.head.bias.detach().expand(clients, -1).clone().requires_grad_(True)

    def leaves(self) -> list[torch.Tensor]:
        return [*(t for pair in self.factors.values() for t in pair), self.head_weight, self.head_bias]

    def step(self, inputs: torch.Tensor, targets: torch.Tensor, rows: slice) -> list[torch.Tensor]:
        """One forward + backward of the clients ``rows`` (equal batches, concatenated in
        ``inputs``); returns the gradients of every stacked leaf (rows outside: zero)."""
        count = rows.stop - rows.start

        def adapted(layer: LoRALinear, name: str) -> Callable[[torch.Tensor], torch.Tensor]:
            lora_A, lora_B = (t[rows] for t in self.factors[name])

            def forward(x: torch.Tensor) -> torch.Tensor:
                per_client = x.reshape(count, -1, x.shape[-1])  # [clients, rows·tokens, in]
                low = torch.bmm(torch.bmm(per_client, lora_A.transpose(1, 2)), lora_B.transpose(1, 2))
                return layer.base(x) + (low * layer.scaling).reshape(*x.shape[:-1], -1)

            return forward

        def head(x: torch.Tensor) -> torch.Tensor:
            per_client = x.reshape(count, -1, x.shape[-1])
            logits = torch.baddbmm(
                self.head_bias[rows].unsqueeze(1), per_client, self.head_weight[rows].transpose(1, 2)
            )
            return logits.reshape(*x.shape[:-1], -1)

        for name, layer in self.layers.items():
            layer.forward = adapted(layer, name)  # type: ignore[method-assign]
        self.head.forward = head  # type: ignore[method-assign]
        try:
            losses = F.cross_entropy(self.model(inputs), targets, reduction="none").view(count, -1).mean(dim=1)
            return list(torch.autograd.grad(losses.sum(), self.leaves()))
        finally:
            for layer in self.layers.values():
                del layer.forward
            del self.head.forward


def measure(clients: int, args: argparse.Namespace) -> dict[str, Any]:
    prepared = prepare(run_config(clients, args))
    model, data, executor, program = (
        prepared.executor.model,
        prepared.data,
        prepared.executor,
        prepared.algorithm.program,
    )
    trainable = [p for p in model.parameters() if p.requires_grad]
    plans = batch_plans(prepared, round_jobs(prepared, clients, 0))
    # clients sorted by their batch sizes: equal batches are contiguous rows of one concatenated step
    order = sorted(range(clients), key=lambda k: [-len(plans[k]), [len(b) for b in plans[k]]])
    plans = [plans[k] for k in order]
    steps = sum(len(plan) for plan in plans)
    multi = MultiAdapter(model, clients)
    model.train()

    def sequential(round_index: int) -> None:
        executor.train(program, round_jobs(prepared, clients, round_index))

    def loop() -> None:
        for plan in plans:
            for batch in plan:
                inputs, targets = data.gather(batch)
                F.cross_entropy(model(inputs), targets).backward()
                for p in trainable:
                    p.grad = None

    def multi_adapter() -> None:
        for t in range(max(len(plan) for plan in plans)):
            sizes = [len(plan[t]) if t < len(plan) else 0 for plan in plans]
            for rows in contiguous_runs(sizes):
                inputs, targets = data.gather(torch.cat([plans[k][t] for k in range(rows.start, rows.stop)]))
                multi.step(inputs, targets, rows)

    check = gradient_gap(model, data, plans[0][0], multi)
    works: dict[str, Callable[[int], None]] = {
        "sequential": sequential,
        "loop": lambda _: loop(),
        "multi_adapter": lambda _: multi_adapter(),
    }
    if args.vmap:
        vmap_prepared = prepare(run_config(clients, args, "vmap"))
        works["vmap"] = lambda round_index: vmap_prepared.executor.train(
            program, round_jobs(vmap_prepared, clients, round_index)
        )
    timings: dict[str, list[float]] = {key: [] for key in works}
    rates = []  # the matmul rate, measured between the rounds (the machine's load changes)
    device = torch.device(args.device)
    for repeat in range(args.repeats + 1):  # interleaved; the first pass warms up
        for key, work in works.items():
            synchronize(device)
            started = time.perf_counter()
            work(repeat)
            synchronize(device)
            if repeat:
                timings[key].append(time.perf_counter() - started)
        rates.append(matmul_gflops(device))
    medians = {key: statistics.median(values) for key, values in timings.items()}
    inputs, targets = data.gather(plans[0][0])
    with FlopCounterMode(display=False) as counter:
        F.cross_entropy(model(inputs), targets).backward()
    for p in trainable:
        p.grad = None
    flops = counter.get_total_flops() / len(targets) * sum(len(b) for plan in plans for b in plan)
    row = {
        "clients": clients,
        "steps": steps,
        "s_per_round": medians,
        "sequential_over_multi_adapter": medians["sequential"] / medians["multi_adapter"],
        "loop_over_multi_adapter": medians["loop"] / medians["multi_adapter"],
        "sequential_over_loop": medians["sequential"] / medians["loop"],
        "loop_gflops": flops / medians["loop"] / 1e9,
        "matmul_gflops": statistics.median(rates),
        "max_gradient_gap": check,
    }
    if "vmap" in medians:
        row["sequential_over_vmap"] = medians["sequential"] / medians["vmap"]
    return row


def gradient_gap(model: nn.Module, data: Any, batch: torch.Tensor, multi: MultiAdapter) -> float:
    """Max |∇ one-by-one − ∇ multi-adapter| of the first client's LoRA factors and head."""
    inputs, targets = data.gather(batch)
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
    reference = torch.autograd.grad(F.cross_entropy(model(inputs), targets), list(trainable.values()))
    by_name = dict(zip(trainable, reference))
    gradients = multi.step(inputs, targets, slice(0, 1))
    expected = [
        *(by_name[f"{name}.{suffix}"].unsqueeze(0) for name in multi.layers for suffix in ("lora_A", "lora_B")),
        by_name[f"{name_of(model, multi.head)}.weight"].unsqueeze(0),
        by_name[f"{name_of(model, multi.head)}.bias"].unsqueeze(0),
    ]
    return max(float((g[:1] - e).abs().max()) for g, e in zip(gradients, expected))


def name_of(model: nn.Module, module: nn.Module) -> str:
    return next(name for name, m in model.named_modules() if m is module)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", default="10,20,50")
    parser.add_argument("--batches", type=int, default=1, help="batches of 32 per client and round (about)")
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--vmap", action="store_true", help="also time --executor vmap")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = []
    for clients in (int(c) for c in args.clients.split(",")):
        row = measure(clients, args)
        rows.append(row)
        s = row["s_per_round"]
        line = (
            f"{clients:>3} clients, {row['steps']:>3} steps: sequential {s['sequential']:6.2f} s/round, "
            f"bare loop {s['loop']:6.2f}, multi-adapter {s['multi_adapter']:6.2f}"
        )
        if "vmap" in s:
            line += f", vmap {s['vmap']:6.2f}"
        print(
            f"{line}\n    sequential / multi-adapter {row['sequential_over_multi_adapter']:.2f}x, "
            f"loop / multi-adapter {row['loop_over_multi_adapter']:.2f}x, engine overhead "
            f"(sequential / loop) {row['sequential_over_loop']:.2f}x; the loop computes "
            f"{row['loop_gflops']:.1f} GFLOP/s = {row['loop_gflops'] / row['matmul_gflops']:.2f}x the dense matmul rate; "
            f"max |Δ∇| {row['max_gradient_gap']:.1e}",
            flush=True,
        )
    print(json.dumps({"benchmark": "multi_adapter", "threads": args.threads, "device": args.device, "results": rows}))


if __name__ == "__main__":
    main()
