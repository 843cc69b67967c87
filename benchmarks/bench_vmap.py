"""Local-training steps/s of ``--executor vmap`` vs ``sequential`` (issue 11, item 3).

    python benchmarks/bench_vmap.py [--clients 20,100] [--models mlp,cnn] [--device cpu|cuda]

Every client of a round trains (``--frac 1``, FedAvg, batch 10, 1 local epoch); the time of
``executor.train`` over the round's jobs is measured per executor (median of ``--repeats``
rounds after one warm-up) and steps/s = Σ client steps / time. Target: ≥ 1.5× for the cnn at 20
clients on CPU; on a GPU ≥ 10× at 100 clients. Both executors use ``--threads`` (default 1).

``--ceiling`` adds, per model and client count, the best case for vectorizing: every client one
full batch (no unequal batch counts), ``vmap(grad)`` + an SGD step over the stacked clients vs a
loop of the same steps on one model (interleaved, median of ``--repeats``), and the FLOP rate
the sequential loop reaches against this core's 1024² matmul rate: when the loop already runs
near the matmul rate, no executor can be much faster on this device.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import time

import torch

from pflbench.config.run_config import RunConfig
from pflbench.engine import ClientJob
from pflbench.runs.prepare import prepare
from pflbench.util.seeding import derive_seed


def steps_per_second(config: RunConfig, repeats: int) -> tuple[float, int]:
    prepared = prepare(config)
    algorithm, executor, data = prepared.algorithm, prepared.executor, prepared.data
    clients = list(range(config.num_clients))
    steps = sum(config.local_epochs * max(1, math.ceil(data.num_train[k] / config.batch_size)) for k in clients)
    times = []
    for round_index in range(repeats + 1):
        jobs = [
            ClientJob(
                k,
                round_index,
                derive_seed(config.seed, "train", round_index, k),
                algorithm.broadcast(k),
                algorithm.store.get(k),
            )
            for k in clients
        ]
        if data.device.type == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        executor.train(algorithm.program, jobs)
        if data.device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
    return steps / statistics.median(times[1:]), steps


def matmul_gflops(device: torch.device) -> float:
    """This device's fp32 GEMM rate at 1024² (the practical ceiling of dense compute)."""
    a, b = torch.randn(1024, 1024, device=device), torch.randn(1024, 1024, device=device)
    times = []
    for _ in range(12):
        if device.type == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        a @ b
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
    return 2 * 1024**3 / statistics.median(times[2:]) / 1e9


def ceiling(config: RunConfig, repeats: int) -> dict:
    """Balanced best case (see the module docstring): loop vs vmap steps/s and the loop's GFLOP/s."""
    import torch.nn.functional as F
    from torch.func import functional_call, grad, vmap
    from torch.utils.flop_counter import FlopCounterMode

    prepared = prepare(config)
    model, data, clients = prepared.executor.model, prepared.data, config.num_clients
    device = data.device
    inputs, targets = data.gather(torch.stack([data.train_indices[0][:1].repeat(config.batch_size)] * clients))
    params = {n: p.detach() for n, p in model.named_parameters()}
    stacked = {n: p.unsqueeze(0).repeat(clients, *([1] * p.dim())).clone() for n, p in params.items()}

    def loss(p, x, y):
        return F.cross_entropy(functional_call(model, p, (x,)), y)

    step_all = vmap(grad(loss))

    def vectorized() -> None:
        for n, g in step_all(stacked, inputs, targets).items():
            stacked[n].add_(g, alpha=-0.01)

    def loop() -> None:
        for k in range(clients):
            model.zero_grad(set_to_none=True)
            F.cross_entropy(model(inputs[k]), targets[k]).backward()
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(p.grad, alpha=-0.01)

    with FlopCounterMode(display=False) as counter:
        model.zero_grad(set_to_none=True)
        F.cross_entropy(model(inputs[0]), targets[0]).backward()
    flops_per_step = counter.get_total_flops()

    def timed(function) -> float:
        if device.type == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        function()
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - started

    loop(), vectorized()  # warm-up
    loops, vectors = [], []
    for _ in range(max(repeats, 5)):
        loops.append(timed(loop))
        vectors.append(timed(vectorized))
    loop_steps = clients / statistics.median(loops)
    return {
        "ceiling_loop_steps_s": loop_steps,
        "ceiling_vmap_steps_s": clients / statistics.median(vectors),
        "ceiling_speedup": statistics.median(loops) / statistics.median(vectors),
        "loop_gflops": flops_per_step * loop_steps / 1e9,
        "matmul_gflops": matmul_gflops(device),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", default="20,100")
    parser.add_argument("--models", default="mlp,cnn")
    parser.add_argument("--dataset", default="digits")
    parser.add_argument("--dataset-option", action="append", default=[])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch-size", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="/tmp/pflbench_bench_vmap")
    parser.add_argument("--ceiling", action="store_true", help="add the balanced best case and FLOP rates")
    args = parser.parse_args()
    rows = []
    for model in args.models.split(","):
        for clients in (int(c) for c in args.clients.split(",")):
            base = RunConfig(
                algo="fedavg",
                dataset=args.dataset,
                dataset_option=tuple(args.dataset_option),
                model=model,
                num_clients=clients,
                alpha=0.5,
                batch_size=args.batch_size,
                lr=0.01,
                device=args.device,
                threads=args.threads,
                out=args.out,
                min_size=2,
            )
            seq, steps = steps_per_second(base, args.repeats)
            vec, _ = steps_per_second(dataclasses.replace(base, executor="vmap"), args.repeats)
            rows.append(
                {
                    "model": model,
                    "clients": clients,
                    "steps": steps,
                    "sequential_steps_s": seq,
                    "vmap_steps_s": vec,
                    "speedup": vec / seq,
                    "device": args.device,
                }
            )
            print(
                f"{model:>4} {clients:>4} clients on {args.device}: sequential {seq:8.1f} steps/s, "
                f"vmap {vec:8.1f} steps/s: {vec / seq:.2f}x",
                flush=True,
            )
            if args.ceiling:
                best = ceiling(base, args.repeats)
                rows[-1].update(best)
                print(
                    f"     best case (equal full batches): loop {best['ceiling_loop_steps_s']:8.1f} steps/s, "
                    f"vmap {best['ceiling_vmap_steps_s']:8.1f} steps/s: {best['ceiling_speedup']:.2f}x; "
                    f"the loop computes {best['loop_gflops']:.1f} GFLOP/s, "
                    f"a 1024² matmul {best['matmul_gflops']:.1f} GFLOP/s on this device",
                    flush=True,
                )
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
