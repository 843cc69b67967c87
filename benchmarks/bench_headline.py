"""Throughput of the headline model (issue 25, item 2): pflbench's three stages against plain
PyTorch loops over the same model, data and batch size, and the FLOP rate they reach against
this machine's dense matmul rate.

    python benchmarks/bench_headline.py [--device cpu|cuda] [--threads 1,2] [--samples 3000]
                                        [--precision fp32,bf16]

On a GPU, the one command (README "Speed"):

    python benchmarks/bench_headline.py --device cuda --threads 1 --samples 20000 --precision fp32,bf16

The model is the headline job's (``config.lora.RUN_DEFAULTS``: a 6-block ViT, embed 64, on
3×32×32 inputs, 100 classes); the data are random CIFAR-shaped images (throughput does not depend
on pixel values), the dataset ``cifar100_shaped`` of ``cifar_shaped.py``. Stages, each timed as the best of
``--repeats`` after one warm-up, the engine and the plain loop timed alternately:

(a) pretraining: ``models.pretrain.train_centrally`` (one epoch of AdamW) vs a plain AdamW loop;
(b) one client's local training (``--local-epochs`` over its train split): the engine's client job
    (``Harness.train_client``) for a LoRA FedAvg run (``--lora-rank 8``: the loss is plain
    cross-entropy, the same work as the plain loop) and for FedSDG (its gates and penalties cost
    extra; shown, not compared), vs a plain Adam loop over the LoRA model's trainable tensors;
(c) evaluation: ``Federation.evaluate`` of the LoRA FedAvg run (one pass over every test sample)
    vs a plain ``no_grad`` loop over the same samples in the engine's evaluation batch (1,024 on
    the CPU, ``util.precision.ACCELERATOR_EVAL_BATCH`` on a GPU).

``--precision bf16`` runs both sides of every stage under the same bf16 autocast (the engine through
``RunConfig.precision``, the plain loops in ``util.precision.autocast``) and measures the matmul
rate under it too (the device's bf16 rate).

FLOPs per sample come from ``torch.utils.flop_counter.FlopCounterMode`` (a training step: forward +
backward; evaluation: forward); the matmul rate is the best of a few dense products (``matmul_rate``).
Prints one line per stage and a final JSON line.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from cifar_shaped import cifar100_shaped  # benchmarks/ is on sys.path when run as a script
from torch.utils.flop_counter import FlopCounterMode

from pflbench.config.lora import RUN_DEFAULTS
from pflbench.config.run_config import RunConfig
from pflbench.data.dataset import FederatedData
from pflbench.models.pretrain import PRETRAIN_BATCH_SIZE, PRETRAIN_WEIGHT_DECAY, train_centrally
from pflbench.models.zoo import build_model
from pflbench.runs.prepare import prepare
from pflbench.testing import Harness
from pflbench.util.precision import autocast, check_precision, eval_batch

NUM_CLASSES = 100
MODEL = RUN_DEFAULTS["model"]
MODEL_OPTIONS = {key: int(value) for key, value in (option.split("=") for option in RUN_DEFAULTS["model_option"])}


def best_pair(
    engine: Callable[[], Any], plain: Callable[[], Any], repeats: int, device: torch.device
) -> tuple[float, float]:
    """Best wall times of ``engine`` and ``plain``, timed alternately (one warm-up each, then
    ``repeats`` rounds of engine, plain): a change of the machine's load hits both sides alike,
    so their ratio is steadier than that of two separate series."""
    engine(), plain()
    engine_times, plain_times = [], []
    for _ in range(repeats):
        engine_times.append(best_time(engine, 1, device, warm_up=False))
        plain_times.append(best_time(plain, 1, device, warm_up=False))
    return min(engine_times), min(plain_times)


def best_time(work: Callable[[], Any], repeats: int, device: torch.device, warm_up: bool = True) -> float:
    """Best wall time of ``repeats`` calls after one warm-up (synchronised on CUDA)."""
    if warm_up:
        work()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        work()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return min(times)


def matmul_rate(device: torch.device, precision: str = "fp32") -> float:
    """FLOP/s of a dense n×n product in ``precision``'s dtype (the operands already in it: the
    device's rate, no casts; best of 5). n = 2048 on a CPU; on a GPU n = 8192 and 10 products per
    timing, so that launch and sync overheads do not hide the rate."""
    n, products = (8192, 10) if device.type == "cuda" else (2048, 1)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)

    def work() -> None:
        for _ in range(products):
            torch.mm(a, b)

    seconds = best_time(work, 5, device)
    return 2 * n**3 * products / seconds


def flops_per_sample(model: torch.nn.Module, inputs: torch.Tensor, targets: torch.Tensor, train: bool) -> float:
    counter = FlopCounterMode(display=False)
    with counter:
        if train:
            F.cross_entropy(model(inputs), targets).backward()
        else:
            with torch.no_grad():
                model(inputs)
    model.zero_grad(set_to_none=True)
    return counter.get_total_flops() / len(targets)


def plain_epoch(
    model: torch.nn.Module,
    data: FederatedData,
    indices: torch.Tensor,
    batch_size: int,
    optimizer,
    generator,
    precision: str = "fp32",
) -> None:
    """The loop a researcher would write: shuffle, gather, forward, cross-entropy, step (the
    forward and the loss under ``precision``'s autocast, as torch's AMP recipe)."""
    model.train()
    order = indices[torch.randperm(len(indices), generator=generator).to(indices.device)]
    for start in range(0, len(order), batch_size):
        inputs, targets = data.gather(order[start : start + batch_size])
        with autocast(data.device, precision):
            loss = F.cross_entropy(model(inputs), targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()


@torch.no_grad()
def plain_evaluation(
    model: torch.nn.Module, data: FederatedData, indices: torch.Tensor, precision: str = "fp32"
) -> int:
    model.eval()
    batch = eval_batch(data.device, 1024)  # the engine's evaluation batch on this device
    correct = torch.zeros((), dtype=torch.int64, device=data.device)
    for start in range(0, len(indices), batch):
        inputs, targets = data.gather(indices[start : start + batch])
        with autocast(data.device, precision):
            correct += (model(inputs).argmax(dim=1) == targets).sum()
    return int(correct)


def run_config(algo: str, args: argparse.Namespace, **extra: Any) -> RunConfig:
    return RunConfig(
        algo=algo,
        dataset="cifar100_shaped",  # benchmarks/cifar_shaped.py
        dataset_option=(f"samples={args.samples}",),
        num_clients=args.clients,
        rounds=1,
        alpha=0.1,
        val_frac=0.0,
        local_epochs=args.local_epochs,
        backbone="random",
        device=args.device,
        threads=args.threads_now,
        precision=args.precision_now,
        out="unused",
        **extra,
    )


def measure(args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    batch = 32  # RunConfig's --batch-size default, used by every stage here
    dataset = cifar100_shaped(args.samples)
    precision = args.precision_now
    result: dict[str, Any] = {"threads": args.threads_now, "device": str(device), "precision": precision}
    rate = matmul_rate(device, precision)
    result["matmul_gflops"] = rate / 1e9

    # (a) pretraining: one epoch over the public part
    public = np.arange(min(len(dataset.labels), args.samples // 2))
    data = FederatedData(dataset, [public], [public[:256]], device)

    def fresh_model() -> torch.nn.Module:
        torch.manual_seed(0)
        return build_model(MODEL, dataset.input_shape, NUM_CLASSES, **MODEL_OPTIONS).to(device)

    engine_model, model = fresh_model(), fresh_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=PRETRAIN_WEIGHT_DECAY)
    indices = torch.as_tensor(public, device=device)
    generator = torch.Generator().manual_seed(0)
    engine, plain = best_pair(
        lambda: train_centrally(engine_model, data, 1, 1e-3, torch.Generator().manual_seed(0), precision),
        # pretraining's own batch size (PRETRAIN_BATCH_SIZE), as train_centrally
        lambda: plain_epoch(model, data, indices, PRETRAIN_BATCH_SIZE, optimizer, generator, precision),
        args.repeats,
        device,
    )
    inputs, targets = data.gather(indices[:PRETRAIN_BATCH_SIZE])
    train_flops = flops_per_sample(model, inputs, targets, train=True)
    result["pretraining"] = stage_line("(a) pretraining", len(public), engine, plain, train_flops, rate)

    # (b) one client's local training
    harness = Harness(prepare(run_config("fedavg", args, lora_rank=8, lr=1e-3, optimizer="adam")))
    client = int(np.argmax(harness.data.num_train))
    samples = harness.data.num_train[client] * args.local_epochs
    sdg = Harness(prepare(run_config("fedsdg", args)))
    fedsdg = best_time(lambda: sdg.train_client(client, sdg.broadcast(client)), args.repeats, device)
    model = harness.model
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(trainable, lr=1e-3)
    own = harness.data.train_indices[client]

    def plain_client() -> None:
        for _ in range(args.local_epochs):
            plain_epoch(model, harness.data, own, batch, optimizer, generator, precision)

    engine, plain = best_pair(
        lambda: harness.train_client(client, harness.broadcast(client)), plain_client, args.repeats, device
    )
    inputs, targets = harness.data.gather(own[:batch])
    lora_flops = flops_per_sample(model, inputs, targets, train=True)
    result["local_training"] = stage_line("(b) one client, LoRA FedAvg", samples, engine, plain, lora_flops, rate)
    result["local_training"]["fedsdg_samples_per_s"] = samples / fedsdg
    print(f"    FedSDG's client job: {samples / fedsdg:,.0f} samples/s ({fedsdg / engine:.2f}× LoRA FedAvg's time)")

    # (c) evaluation of every client's test split
    everyone = torch.cat(harness.data.test_indices)
    engine, plain = best_pair(
        lambda: harness.evaluate(),
        lambda: plain_evaluation(harness.model, harness.data, everyone, precision),
        args.repeats,
        device,
    )
    eval_flops = flops_per_sample(harness.model, *harness.data.gather(everyone[:256]), train=False)
    result["evaluation"] = stage_line("(c) evaluation", len(everyone), engine, plain, eval_flops, rate)
    return result


def stage_line(name: str, samples: int, engine: float, plain: float, flops: float, rate: float) -> dict[str, float]:
    row = {
        "samples_per_s": samples / engine,
        "plain_samples_per_s": samples / plain,
        "ratio_to_plain": plain / engine,
        "gflops_per_s": flops * samples / engine / 1e9,
        "flop_rate_ratio": flops * samples / engine / rate,
    }
    print(
        f"{name:<30} {row['samples_per_s']:>9,.0f} samples/s  plain loop {row['plain_samples_per_s']:>9,.0f}  "
        f"ratio {row['ratio_to_plain']:.3f}  {row['gflops_per_s']:.1f} GFLOP/s = "
        f"{row['flop_rate_ratio']:.2f}× the matmul rate"
    )
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", default="1,2", help="comma-separated torch thread counts to measure")
    parser.add_argument("--samples", type=int, default=3000, help="dataset size (half of it is the pretraining set)")
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--local-epochs", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--precision", default="fp32", help="comma-separated --precision values to measure (fp32, bf16)"
    )
    args = parser.parse_args()
    device = torch.device(args.device)
    precisions = [p.strip() for p in args.precision.split(",")]
    for precision in precisions:
        check_precision(precision, device)  # bf16 on a device without it: refused before any work
    results = []
    for precision in precisions:
        for threads in (int(t) for t in args.threads.split(",")):
            torch.set_num_threads(threads)
            args.threads_now, args.precision_now = threads, precision
            print(f"--- {threads} thread(s), {device}, {precision}: matmul rate measured first")
            results.append(measure(args, device))
            print(f"    dense matmul ({precision}): {results[-1]['matmul_gflops']:.1f} GFLOP/s")
    print(json.dumps({"benchmark": "headline", "model": MODEL, "results": results}))


if __name__ == "__main__":
    main()
