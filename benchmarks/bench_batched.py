"""Batched clients on the cross-device shape (issue 39): pflbench's ``sequential`` and ``vmap``
executors against PFLlib's FedAvg, per round, on the same CIFAR-shaped clients, plus what one
local step costs eager, as a CUDA graph and vmapped, and a vmap-equals-sequential check:

    python benchmarks/bench_batched.py --device cuda --pfllib .pfllib/PFLlib --out /tmp/xdev_batched

The data and the two programs are ``bench_cross_device.py``'s (1,000 clients of 50 + 10 random
CIFAR-shaped images, 5% sampled per round, batch 10, one local epoch of SGD at lr 0.005,
PFLlib's FedAvgCNN); ``--parts`` picks, run in the order runs, check, micro (the child runs
first: this process's CUDA context would count in their nvidia-smi memory, and a CUDA graph
capture that fails can leave it unusable):

- ``runs``: PFLlib and each ``--variants`` of ``pflbench run`` alternated as child processes
  (``bench_cross_device.run_pfllib`` / ``run_pflbench``: per-round time without evaluation,
  samples/s, peak RSS, on a GPU peak GPU memory and mean utilisation);
- ``check``: one round of ``--check-clients`` clients of unequal sizes (1 to 120 samples: 1 to 12
  steps of unequal last batches, the sizes vmap groups) trained by both executors from the same
  jobs in this process: the largest difference of any uploaded number and of the losses, and
  whether they are bit-identical (the sequential executor is the reference);
- ``micro``: one round's training of the first ``sampled`` clients (50 of 1,000), in this process,
  median of ``--micro-repeats`` after a warm-up: the two executors' ``train``; the bare eager loop
  (``autograd.grad`` + an in-place SGD step per batch, the floor of one client after another
  without the engine); the same loop replaying one CUDA graph per batch shape (GPU only); one
  vmapped step over the stacked clients per step index; and that vmapped step as a CUDA graph.
  Each one's final parameters against the sequential executor's (largest difference).
  ``--micro-clients 50,200``: also 200 clients (vmap stacks at most ``MAX_CLIENTS_AT_ONCE``).

results.json and results.txt go to ``--out`` after every part (a run cut short keeps them).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch.func import functional_call, grad, vmap

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_cross_device as xdev  # noqa: E402  (a sibling script, not a package)

VARIANTS = {"sequential": ["--executor", "sequential"], "vmap": ["--executor", "vmap"]}


def write_sized_folder(folder: Path, train: list[int], test: list[int], seed: int = 0) -> Path:
    """A PFLlib folder like ``xdev.write_folder``'s with the given per-client sizes."""
    root = folder / "dataset" / xdev.DATASET
    for split, sizes in (("train", train), ("test", test)):
        (root / split).mkdir(parents=True, exist_ok=True)
        for client, size in enumerate(sizes):
            xdev._write_client(root, split, client, size, seed)
    (root / "config.json").write_text(json.dumps({"num_clients": len(train), "num_classes": 10}))
    return root


def prepared_run(args: argparse.Namespace, root: Path, clients: int, algo: str, work: Path) -> Any:
    """``prepare`` of a sequential run on ``root`` in this process (the benchmark's settings)."""
    from pflbench.config.run_config import RunConfig
    from pflbench.registry import load_plugin_file, loaded_plugin_file
    from pflbench.runs.prepare import prepare

    if loaded_plugin_file(xdev.PLUGIN) is None:
        load_plugin_file(xdev.PLUGIN)
    config = RunConfig(
        algo=algo,
        dataset="pfllib",
        data_dir=str(root),
        partition="natural",
        val_frac=0.0,
        num_clients=clients,
        frac=args.join_ratio,
        batch_size=args.batch_size,
        local_epochs=1,
        lr=args.lr,
        rounds=1,
        model="fedavg_cnn",
        device=args.device,
        seed=0,
        out=str(work),
    )
    return prepare(config)


def jobs_for(prepared: Any, clients: list[int], round_index: int = 1) -> list:
    from pflbench.engine import ClientJob
    from pflbench.util.seeding import derive_seed

    algorithm = prepared.algorithm
    return [
        ClientJob(
            k, round_index, derive_seed(0, "train", round_index, k), algorithm.broadcast(k), algorithm.store.get(k)
        )
        for k in clients
    ]


def largest_difference(reference: list[dict], other: list[dict]) -> float:
    """The largest absolute difference of any tensor of the same name, client by client."""
    worst = 0.0
    for a, b in zip(reference, other):
        for name, tensor in a.items():
            worst = max(worst, (tensor.double() - b[name].double()).abs().max().item())
    return worst


def check(args: argparse.Namespace, work: Path) -> list[dict]:
    """vmap against sequential on clients of unequal sizes (see the module docstring)."""
    from pflbench.engine.vmap import VmapExecutor

    rng = np.random.default_rng(1)
    sizes = [1, 2, 10, 11, 12, 120, *rng.integers(1, 121, args.check_clients - 6).tolist()]
    root = write_sized_folder(work / "unequal", sizes, [4] * len(sizes))
    rows = []
    for algo in args.check_algos:
        prepared = prepared_run(args, root, len(sizes), algo, work / f"check_{algo}")
        program, executor = prepared.algorithm.program, prepared.executor
        jobs = jobs_for(prepared, list(range(len(sizes))))
        sequential = executor.train(program, jobs)
        vectorized = VmapExecutor(executor.model, prepared.data).train(program, jobs)
        steps = [len(plan) for plan in StepLoops(prepared, jobs, args.lr).plans]
        row = {
            "algo": algo,
            "clients": len(sizes),
            "steps_min_max": [min(steps), max(steps)],
            "upload_max_abs_diff": largest_difference([u.params for u in sequential], [u.params for u in vectorized]),
            "private_max_abs_diff": largest_difference(
                [u.private for u in sequential], [u.private for u in vectorized]
            ),
            "loss_max_abs_diff": max(abs(a.loss - b.loss) for a, b in zip(sequential, vectorized)),
        }
        row["bit_identical"] = (
            row["upload_max_abs_diff"] == row["private_max_abs_diff"] == row["loss_max_abs_diff"] == 0
        )
        rows.append(row)
    return rows


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(function: Callable[[], Any], device: torch.device, repeats: int) -> tuple[float, float, Any]:
    """Median seconds of ``function`` over ``repeats`` calls after one warm-up, the warm-up's
    seconds (first calls: lazy initialisation, cuDNN's choices, graph capture) and the last result."""
    synchronize(device)
    started = time.perf_counter()
    result = function()
    synchronize(device)
    first = time.perf_counter() - started
    times = []
    for _ in range(repeats):
        synchronize(device)
        started = time.perf_counter()
        result = function()
        synchronize(device)
        times.append(time.perf_counter() - started)
    return statistics.median(times), first, result


class StepLoops:
    """One round's local training of ``jobs`` written out by hand (FedAvg's plain SGD, every
    parameter trained): each client's batches are its job's (``train_batch_indices`` with the
    job's seeded generator, as both executors draw them)."""

    def __init__(self, prepared: Any, jobs: list, lr: float) -> None:
        self.model, self.data, self.lr = prepared.executor.model, prepared.data, lr
        self.device = self.data.device
        self.names = [n for n, _ in self.model.named_parameters()]
        self.params = [p for _, p in self.model.named_parameters()]
        self.jobs = jobs
        batch_size = prepared.algorithm.program.local.batch_size
        self.plans: list[list[torch.Tensor]] = []
        for job in jobs:
            generator = torch.Generator().manual_seed(job.seed)
            self.plans.append(self.data.train_batch_indices(job.client_id, batch_size, generator))
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, tuple[torch.Tensor, torch.Tensor]]] = {}

    def _step(self, inputs: torch.Tensor, targets: torch.Tensor) -> None:
        loss = F.cross_entropy(self.model(inputs), targets)
        grads = torch.autograd.grad(loss, self.params)
        with torch.no_grad():
            torch._foreach_add_(self.params, list(grads), alpha=-self.lr)

    def eager(self) -> list[dict]:
        results = []
        for job, plan in zip(self.jobs, self.plans):
            with torch.no_grad():
                torch._foreach_copy_(self.params, [job.received[n] for n in self.names])
            for batch in plan:
                self._step(*self.data.gather(batch))
            results.append({n: p.detach().clone() for n, p in zip(self.names, self.params)})
        return results

    def _graph(self, size: int) -> tuple[torch.cuda.CUDAGraph, tuple[torch.Tensor, torch.Tensor]]:
        """The step for batches of ``size`` captured once (warm-up on a side stream, the model's
        parameters restored after it, as CUDA graph capture asks)."""
        if size not in self.graphs:
            inputs, targets = self.data.gather(self.plans[0][0][:1].repeat(size))
            static = (inputs.clone(), targets.clone())
            saved = [p.detach().clone() for p in self.params]
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(3):
                    self._step(*static)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                self._step(*static)
            with torch.no_grad():
                torch._foreach_copy_(self.params, saved)
            self.graphs[size] = (graph, static)
        return self.graphs[size]

    def graphed(self) -> list[dict]:
        results = []
        for job, plan in zip(self.jobs, self.plans):
            with torch.no_grad():
                torch._foreach_copy_(self.params, [job.received[n] for n in self.names])
            for batch in plan:
                graph, (inputs, targets) = self._graph(len(batch))
                x, y = self.data.gather(batch)
                inputs.copy_(x)
                targets.copy_(y)
                graph.replay()
            results.append({n: p.detach().clone() for n, p in zip(self.names, self.params)})
        return results


class VmapLoop:
    """The same round as one ``vmap(grad)`` step per step index over the stacked clients (every
    client the same batch sizes: the cross-device shape's equal clients), eager or as one CUDA
    graph per step shape."""

    def __init__(self, loops: StepLoops) -> None:
        self.loops = loops
        shapes = {tuple(len(b) for b in plan) for plan in loops.plans}
        if len(shapes) != 1:
            raise ValueError(f"the clients' batch sizes differ ({sorted(shapes)[:3]}...): no single stacked step")
        model = loops.model

        def loss(params: dict[str, torch.Tensor], inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
            return F.cross_entropy(functional_call(model, params, (inputs,)), targets)

        self.step_grad = vmap(grad(loss))
        self.stacked = {n: torch.stack([job.received[n] for job in loops.jobs]).detach().clone() for n in loops.names}
        self.graph: tuple[torch.cuda.CUDAGraph, list[torch.Tensor]] | None = None

    def _load(self) -> None:
        with torch.no_grad():
            for n, t in self.stacked.items():
                t.copy_(torch.stack([job.received[n] for job in self.loops.jobs]))

    def _step(self, inputs: torch.Tensor, targets: torch.Tensor) -> None:
        grads = self.step_grad(self.stacked, inputs, targets)
        with torch.no_grad():
            names = list(self.stacked)
            torch._foreach_add_([self.stacked[n] for n in names], [grads[n] for n in names], alpha=-self.loops.lr)

    def _results(self) -> list[dict]:
        return [{n: t[i].clone() for n, t in self.stacked.items()} for i in range(len(self.loops.jobs))]

    def eager(self) -> list[dict]:
        self._load()
        for t in range(len(self.loops.plans[0])):
            self._step(*self.loops.data.gather(torch.stack([plan[t] for plan in self.loops.plans])))
        return self._results()

    def graphed(self) -> list[dict]:
        if self.graph is None:
            static = [x.clone() for x in self.loops.data.gather(torch.stack([plan[0] for plan in self.loops.plans]))]
            if any(len(b) != len(self.loops.plans[0][0]) for b in self.loops.plans[0]):
                raise ValueError("unequal batch sizes within a client: one graph per shape is not written here")
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(3):
                    self._step(*static)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                self._step(*static)
            self.graph = (graph, static)
        graph, (inputs, targets) = self.graph
        self._load()
        for t in range(len(self.loops.plans[0])):
            x, y = self.loops.data.gather(torch.stack([plan[t] for plan in self.loops.plans]))
            inputs.copy_(x)
            targets.copy_(y)
            graph.replay()
        return self._results()


class Micro:
    """One round's training of ``sampled`` clients, six ways (see the module docstring): the
    eager cases first (``eager``), the CUDA graphs of every size after them (``graphs``: a
    capture that fails can leave the CUDA context unusable for what follows)."""

    def __init__(self, args: argparse.Namespace, prepared: Any, sampled: int) -> None:
        from pflbench.engine.vmap import MAX_CLIENTS_AT_ONCE

        self.prepared, self.device, self.repeats = prepared, prepared.data.device, args.micro_repeats
        self.jobs = jobs_for(prepared, list(range(sampled)))
        self.loops = StepLoops(prepared, self.jobs, args.lr)
        self.steps = sum(len(plan) for plan in self.loops.plans)
        self.stacked: VmapLoop | None = None
        self.reference: list[dict] = []
        self.row: dict = {
            "clients": sampled,
            "steps": self.steps,
            "device": str(self.device),
            "vmap_chunk": MAX_CLIENTS_AT_ONCE,
        }

    def case(self, name: str, function: Callable[[], list]) -> None:
        try:
            seconds, first, result = timed(function, self.device, self.repeats)
        except Exception as error:  # noqa: BLE001 (a case that fails is reported, the others still run)
            self.row[name] = {"error": f"{type(error).__name__}: {error}"[:300]}
            return
        params = [u.params if hasattr(u, "params") else u for u in result]
        if not self.reference:
            self.reference = params
        self.row[name] = {
            "round_s": seconds,
            "step_us": seconds / self.steps * 1e6,
            "first_call_s": first,
            "max_abs_diff_vs_sequential": largest_difference(self.reference, params),
        }
        base = self.row.get("sequential_executor", {}).get("round_s")
        if base:
            self.row[name]["speedup_vs_sequential_executor"] = base / seconds

    def eager(self) -> None:
        from pflbench.engine.vmap import VmapExecutor

        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        program, sequential = self.prepared.algorithm.program, self.prepared.executor
        vectorized = VmapExecutor(sequential.model, self.prepared.data)
        self.case("sequential_executor", lambda: sequential.train(program, self.jobs))
        self.case("vmap_executor", lambda: vectorized.train(program, self.jobs))
        self.case("eager_loop", self.loops.eager)
        try:
            self.stacked = VmapLoop(self.loops)
        except ValueError as error:
            self.row["vmap_loop"] = {"error": str(error)}
        else:
            self.case("vmap_loop", self.stacked.eager)
        if self.device.type == "cuda":
            self.row["torch_max_allocated_mb"] = torch.cuda.max_memory_allocated() / 2**20

    def graphs(self) -> None:
        if self.device.type != "cuda":
            return
        self.case("cuda_graph_loop", self.loops.graphed)
        if self.stacked is not None:
            self.case("vmap_cuda_graph", self.stacked.graphed)


def runs(args: argparse.Namespace, root_folder: Path, clients: int, algo: str, say: Callable[[str], None]) -> dict:
    """PFLlib and the pflbench variants alternated (``bench_cross_device``'s child runs)."""
    sampled = max(1, round(clients * args.join_ratio))
    samples_per_round = round(statistics.fmean(xdev.client_sizes(args.train_samples, clients)) * sampled)
    # pflbench's variants first: if the time limit cuts the runs short, PFLlib's is the one lost
    names = args.variants + (["pfllib"] if args.pfllib is not None else [])
    done: dict[str, list[dict]] = {name: [] for name in names}
    for repeat in range(args.repeats):
        for name in names:
            tag = f"{algo}_{name}_{repeat}"
            try:
                if name == "pfllib":
                    result = xdev.run_pfllib(args, root_folder, clients, algo, tag, args.pfllib_env)
                else:
                    options = argparse.Namespace(**{**vars(args), "pflbench_option": VARIANTS[name]})
                    result = xdev.run_pflbench(options, root_folder, clients, algo, tag, args.pflbench_env)
            except RuntimeError as error:
                say(f"  K={clients} {algo} #{repeat} {name}: FAILED {error}")
                continue
            done[name].append(result)
            say(
                f"  K={clients} {algo} #{repeat} {name}: {result['round_s']:.3f} s/round "
                f"(rounds {[round(t, 3) for t in result['rounds_s']]}), eval {result['eval_s'] or 0:.2f} s, "
                f"RSS peak {result['rss_peak_mb']:.0f} MB, wall {result['wall_s']:.0f} s"
                + (
                    f", GPU util {result['gpu_util_mean_pct']:.0f}%, {result['gpu_mem_used_peak_mb']:.0f} MB used"
                    if "gpu_util_mean_pct" in result
                    else ""
                )
            )
    case: dict = {"clients": clients, "algo": algo, "sampled": sampled, "samples_per_round": samples_per_round}
    case.update({name: xdev.summarise(r, samples_per_round) for name, r in done.items() if r})
    case["runs"] = done
    for name in args.variants:
        for other in ("pfllib", "sequential"):
            if name != other and name in case and other in case:
                case[f"{name}_speedup_vs_{other}"] = case[other]["round_s"] / case[name]["round_s"]
    return case


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pfllib", type=Path, default=os.environ.get("PFLLIB_DIR") or None, help="PFLlib work tree")
    parser.add_argument("--pfllib-site", type=Path, help="PFLlib's dependencies (default: PFLLIB/../site)")
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--train-samples", type=int, default=50_000)
    parser.add_argument("--test-samples", type=int, default=10_000)
    parser.add_argument("--join-ratio", type=float, default=0.05)
    parser.add_argument("--batch-size", type=int, default=10)
    parser.add_argument("--lr", type=float, default=0.005)
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds of the child runs")
    parser.add_argument("--repeats", type=int, default=1, help="alternations of the child runs")
    parser.add_argument("--algos", default="fedavg", help="of fedavg, fedper (runs)")
    parser.add_argument("--check-algos", default="fedavg,fedper", help="of fedavg, fedper (check)")
    parser.add_argument("--variants", default="sequential,vmap", help=f"pflbench runs, of {', '.join(VARIANTS)}")
    parser.add_argument("--parts", default="runs,check,micro", help="of runs, check, micro (run in that order)")
    parser.add_argument("--check-clients", type=int, default=24)
    parser.add_argument("--micro-repeats", type=int, default=5)
    parser.add_argument(
        "--micro-clients", default="", help="clients per micro round, comma-separated (default: sampled)"
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--data-jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--work", type=Path, help="data and run folders (default: a temporary folder)")
    parser.add_argument("--out", type=Path, help="write results.json and results.txt here")
    args = parser.parse_args(argv)
    args.algos, args.variants, args.parts = args.algos.split(","), args.variants.split(","), args.parts.split(",")
    args.check_algos = args.check_algos.split(",")
    for option, values, valid in (
        ("--algos", args.algos, list(xdev.PFLLIB_ALGOS)),
        ("--check-algos", args.check_algos, list(xdev.PFLLIB_ALGOS)),
        ("--variants", args.variants, list(VARIANTS)),
        ("--parts", args.parts, ["check", "micro", "runs"]),
    ):
        bad = [v for v in values if v not in valid]
        if bad:
            parser.error(f"{option}: unknown {bad[0]!r}; valid: {', '.join(valid)}")
    args.micro_clients = [int(k) for k in args.micro_clients.split(",") if k]
    if args.check_clients < 6:
        parser.error(f"--check-clients {args.check_clients}: at least 6")
    if args.pfllib is not None:
        args.pfllib = Path(args.pfllib).resolve()
        if not (args.pfllib / "system" / "main.py").is_file():
            parser.error(f"--pfllib {args.pfllib}: no system/main.py (a PFLlib work tree)")
        args.pfllib_site = (args.pfllib_site or args.pfllib.parent / "site").resolve()
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="xdev_batched_"))
    lines: list[str] = []

    def say(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    results: dict = {"settings": {k: str(v) for k, v in vars(args).items()}}
    say(f"load {os.getloadavg()[0]:.2f}; {os.cpu_count()} CPUs; device {args.device}")
    # TF32 convolutions (cuDNN's default on Ampere and later, left as both programs run them):
    # on a GPU the vmap-vs-sequential differences are TF32-sized, not float32-sized
    results["torch"] = {
        "version": torch.__version__,
        "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
    }
    folder = work / f"K{args.clients}"
    if "micro" in args.parts or "runs" in args.parts:
        started = time.perf_counter()
        root = xdev.write_folder(folder, args.clients, args.train_samples, args.test_samples, jobs=args.data_jobs)
        say(f"K={args.clients}: data folder {folder} ({time.perf_counter() - started:.0f} s)")
    if "runs" in args.parts:
        args.pflbench_env = args.pfllib_env = xdev.child_env(args.threads, [xdev.ROOT])
        if args.pfllib is not None:
            extra, standins = xdev.pfllib_path(args.pfllib, args.pfllib_site, work)
            args.pfllib_env = xdev.child_env(args.threads, extra)
            say(f"PFLlib: {args.pfllib}" + (f" (stand-ins for {', '.join(standins)})" if standins else ""))
        else:
            say("PFLlib: not given (--pfllib DIR or PFLLIB_DIR): pflbench only")
        results["cases"] = []
        for algo in args.algos:
            case = runs(args, folder, args.clients, algo, say)
            results["cases"].append(case)
            say(summary(case, args.variants))
            xdev.save(args.out, results, lines)
    if "check" in args.parts:
        started = time.perf_counter()
        results["check"] = check(args, work)
        for row in results["check"]:
            say(
                f"check {row['algo']} vmap vs sequential, {row['clients']} clients of "
                f"{row['steps_min_max'][0]}-{row['steps_min_max'][1]} steps: uploads differ by at most "
                f"{row['upload_max_abs_diff']:.3g}, private state by {row['private_max_abs_diff']:.3g}, "
                f"losses by {row['loss_max_abs_diff']:.3g}"
                f" ({'bit-identical' if row['bit_identical'] else 'not bit-identical'}; "
                f"{time.perf_counter() - started:.0f} s)"
            )
        xdev.save(args.out, results, lines)
    if "micro" in args.parts:
        started = time.perf_counter()
        prepared = prepared_run(args, root, args.clients, "fedavg", work / "micro")
        say(f"micro: {args.clients} clients prepared ({time.perf_counter() - started:.0f} s)")
        sizes = args.micro_clients or [max(1, round(args.clients * args.join_ratio))]
        micros = [Micro(args, prepared, min(sampled, args.clients)) for sampled in sizes]
        results["micro"] = [m.row for m in micros]
        for m in micros:
            m.eager()
            xdev.save(args.out, results, lines)
        for m in micros:
            m.graphs()
            say_micro(m.row, say)
            xdev.save(args.out, results, lines)
        del prepared, micros
        overhead(results, say)
        say(f"micro: {time.perf_counter() - started:.0f} s")
        xdev.save(args.out, results, lines)
    say(f"load {os.getloadavg()[0]:.2f}")
    xdev.save(args.out, results, lines)
    return results


def overhead(results: dict, say: Callable[[str], None]) -> None:
    """Each executor's round (``runs``, FedAvg) against its ``train`` of the same number of
    clients (``micro``): what the round spends outside local training (sampling, the jobs,
    aggregation, the round record)."""
    for case in (c for c in results.get("cases", []) if c["algo"] == "fedavg"):
        for row in (r for r in results.get("micro", []) if r["clients"] == case["sampled"]):
            for name in ("sequential", "vmap"):
                train = row.get(f"{name}_executor", {}).get("round_s")
                if name in case and train:
                    case[f"{name}_outside_train_s"] = case[name]["round_s"] - train
                    say(
                        f"{name}: round {case[name]['round_s'] * 1e3:.1f} ms, of which training "
                        f"{train * 1e3:.1f} ms (micro), outside it {(case[name]['round_s'] - train) * 1e3:.1f} ms"
                    )


def say_micro(row: dict, say: Callable[[str], None]) -> None:
    say(
        f"micro: one round of {row['clients']} clients, {row['steps']} local steps, on {row['device']} "
        f"(vmap stacks {row['vmap_chunk']} clients at most)"
        + (f", torch peak {row['torch_max_allocated_mb']:.0f} MB:" if "torch_max_allocated_mb" in row else ":")
    )
    for name, value in row.items():
        if isinstance(value, dict):
            say(
                f"  {name:>20}: "
                + (
                    value["error"]
                    if "error" in value
                    else f"{value['round_s'] * 1e3:8.2f} ms/round, {value['step_us']:7.1f} µs/step, "
                    f"{value.get('speedup_vs_sequential_executor', float('nan')):6.2f}× the sequential "
                    f"executor, max |Δ| vs it {value['max_abs_diff_vs_sequential']:.3g}, "
                    f"first call {value['first_call_s']:.2f} s"
                )
            )


def summary(case: dict, variants: list[str]) -> str:
    parts = [f"K={case['clients']} {case['algo']} ({case['sampled']} clients/round)"]
    for name in ["pfllib", *variants]:
        if name in case:
            s = case[name]
            gpu = f", GPU {s['gpu_util_mean_pct']:.0f}% util" if "gpu_util_mean_pct" in s else ""
            parts.append(f"{name} {s['round_s']:.3f} s/round, {s['samples_per_s']:.0f} samples/s{gpu}")
    for key, value in case.items():
        if "_speedup_vs_" in key:
            name, other = key.split("_speedup_vs_")
            parts.append(f"{name} over {other}: {value:.2f}× the speed")
    return "; ".join(parts)


if __name__ == "__main__":
    main()
