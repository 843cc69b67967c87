"""The cross-device shape (issue 39), pflbench and PFLlib side by side on identical clients:

    python benchmarks/bench_cross_device.py --pfllib .pfllib/PFLlib --out /tmp/xdev

CIFAR-10-sized data split evenly over K clients (default 50,000 train and 10,000 test images over
1,000 clients: 50 + 10 each), 5% of the clients sampled per round (PFLlib's join ratio 0.05),
batch 10, one local epoch of SGD at lr 0.005, PFLlib's FedAvgCNN (``benchmarks/fedavg_cnn.py``
on pflbench's side), FedAvg and FedPer. The images are random (a fixed seed: uniform uint8
pixels, written as PFLlib's Cifar10 generator writes its images, normalised float32
(x/255 − 0.5)/0.5, with uniform labels): timings are real, accuracies are chance. Both programs
read the same PFLlib dataset folder (pflbench: ``--dataset pfllib --partition natural``).

Each (K, algorithm) runs the two programs alternately (PFLlib, pflbench, PFLlib, pflbench, ...)
as child processes with one torch thread each (``OMP_NUM_THREADS=1``). Both train R + 1
rounds; the first is dropped from the per-round figure (warm-up; PFLlib evaluates every client
before its first round). Evaluation is excluded from the per-round figure on both sides:
PFLlib's ``-eg`` is set past the last round, so only its round 0 evaluates (its cost is shown
as round 0 less the mean training round: the test accuracy and AUC plus the train loss over
every client), pflbench evaluates once after its last round (``eval_time_s``: every client's
test split). Reported per run: s per round, training samples per s, each child's peak RSS
(``os.wait4``), and on a GPU the peak GPU memory (pflbench: ``torch.cuda.max_memory_allocated``;
both: ``nvidia-smi`` memory.used, sampled) and the mean GPU utilisation while the child ran.

PFLlib is run unmodified from its work tree (``--pfllib DIR`` or ``$PFLLIB_DIR``; skipped when
neither is given) with its own ``system/main.py``, from a scratch folder whose ``../dataset``
is the generated data. Its dependencies that the interpreter lacks are taken from
``--pfllib-site`` (default ``DIR/../site``: ``pip install --no-deps --target``); if h5py or
calmsize are still missing, stand-ins are put on its path (both are used only after the timed
rounds: saving the results, the memory report), likewise cvxpy (imported by main.py, used only by
FedPAC), and the report says so.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
PLUGIN = ROOT / "benchmarks" / "fedavg_cnn.py"
DATASET = "Cifar10_random"  # "Cifar10" in the name: PFLlib's CNN gets dim=1600 (3×32×32 inputs)
PFLLIB_ALGOS = {"fedavg": "FedAvg", "fedper": "FedPer"}
ROUND_LINE = re.compile(r"-+ time cost -+ ([0-9.eE+-]+)")
_RAISE = "def __getattr__(name):\n    raise ImportError('a stand-in of bench_cross_device.py: ' + name)\n"
_AUC = """import numpy as np


def roc_auc_score(y_true, y_score, average="micro"):
    # micro average: the AUC of all (sample, class) pairs; tied scores share their mean rank
    assert average == "micro", average
    truth, score = np.asarray(y_true).ravel() > 0, np.asarray(y_score, dtype=np.float64).ravel()
    values, inverse = np.unique(score, return_inverse=True)
    counts = np.bincount(inverse)
    mean_rank = np.cumsum(counts) - (counts - 1) / 2
    positives, negatives = truth.sum(), (~truth).sum()
    return (mean_rank[inverse][truth].sum() - positives * (positives + 1) / 2) / (positives * negatives)
"""
_H5 = """import numpy as np


class File:
    # the arrays PFLlib writes after training and reads back for its summary, as an .npz
    def __init__(self, path, mode="r"):
        self.path, self.mode = path, mode
        self.arrays = {} if mode == "w" else dict(np.load(path))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.mode == "w":
            with open(self.path, "wb") as f:
                np.savez(f, **self.arrays)
        return False

    def create_dataset(self, name, data):
        self.arrays[name] = np.asarray(data)

    def get(self, name):
        return self.arrays.get(name)
"""
_BINARIZE = """import numpy as np


def label_binarize(y, classes):
    return (np.asarray(y).reshape(-1, 1) == np.asarray(classes).reshape(1, -1)).astype(int)
"""
# Stand-ins for PFLlib's imports the interpreter lacks (written only for those missing; the
# report names them): cvxpy (FedPAC only), h5py (the results file after the timed rounds: an .npz),
# calmsize (the memory report at the end), matplotlib (the DLG attack, off), torchvision (the
# ResNet/GoogleNet models, unused); sklearn's two functions that PFLlib's evaluation calls (in
# round 0, outside the per-round figure), written out: one-hot labels, micro-averaged AUC.
STANDINS = {
    "cvxpy": {"cvxpy.py": _RAISE},
    "h5py": {"h5py.py": _H5},
    "calmsize": {"calmsize.py": "def size(num_bytes):\n    return num_bytes\n"},
    "matplotlib": {"matplotlib/__init__.py": "", "matplotlib/pyplot.py": _RAISE},
    "torchvision": {"torchvision/__init__.py": _RAISE},
    "sklearn": {"sklearn/__init__.py": "", "sklearn/metrics.py": _AUC, "sklearn/preprocessing.py": _BINARIZE},
}


def client_sizes(total: int, clients: int) -> list[int]:
    """``total`` samples split as evenly as possible over ``clients`` (the first get one more)."""
    return [len(part) for part in np.array_split(np.arange(total), clients)]


def _write_client(root: Path, split: str, client: int, size: int, seed: int) -> None:
    """One client's file, from its own stream (seed, split, client): the same file whatever the
    number of writer processes."""
    rng = np.random.default_rng([seed, split == "test", client])
    pixels = rng.integers(0, 256, (size, 3, 32, 32), dtype=np.uint8)
    x = (pixels.astype(np.float32) / 255 - 0.5) / 0.5  # PFLlib's Cifar10 transform: Normalize(0.5, 0.5)
    y = rng.integers(0, 10, size, dtype=np.int64)
    with open(root / split / f"{client}.npz", "wb") as f:
        np.savez_compressed(f, data={"x": x, "y": y})  # as PFLlib's save_file


def write_folder(folder: Path, clients: int, train: int, test: int, seed: int = 0, jobs: int = 1) -> Path:
    """A PFLlib dataset folder ``folder/dataset/Cifar10_random`` (config.json, train/<i>.npz,
    test/<i>.npz as PFLlib's ``save_file`` writes them), by ``jobs`` processes; reused when its
    config matches."""
    root = folder / "dataset" / DATASET
    config = {"num_clients": clients, "num_classes": 10, "train": train, "test": test, "seed": seed, "streams": 1}
    config_file = root / "config.json"
    if config_file.is_file() and json.loads(config_file.read_text()) == config:
        return root
    tasks = []
    for split, total in (("train", train), ("test", test)):
        (root / split).mkdir(parents=True, exist_ok=True)
        tasks += [(root, split, client, size, seed) for client, size in enumerate(client_sizes(total, clients))]
    if jobs > 1:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(jobs) as pool:
            list(pool.map(_write_client, *zip(*tasks), chunksize=16))
    else:
        for task in tasks:
            _write_client(*task)
    config_file.write_text(json.dumps(config))  # last: a half-written folder is rewritten
    return root


class GpuSampler:
    """nvidia-smi's memory.used (MiB) and utilization.gpu (%) every 200 ms while a child runs."""

    def __init__(self) -> None:
        self.memory: list[float] = []
        self.utilization: list[float] = []
        query = ["nvidia-smi", "--query-gpu=utilization.gpu,memory.used", "--format=csv,noheader,nounits"]
        self.process = subprocess.Popen([*query, "-lms", "200"], stdout=subprocess.PIPE, text=True)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            try:
                utilization, memory = (float(v) for v in line.split(",")[:2])
            except ValueError:
                continue
            self.utilization.append(utilization)
            self.memory.append(memory)

    def stop(self) -> dict[str, float]:
        self.process.terminate()
        self.process.wait()
        self.thread.join(timeout=2)
        if not self.memory:
            return {}
        return {"gpu_mem_used_peak_mb": max(self.memory), "gpu_util_mean_pct": statistics.fmean(self.utilization)}


def sample_rss(pid: int, samples: list[float], every: float = 0.5) -> None:
    """VmRSS (MB) of ``pid`` every ``every`` s until it exits (Linux ``/proc``; nothing elsewhere)."""
    while True:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            return
        found = re.search(r"VmRSS:\s+(\d+) kB", status)
        if found is None:  # a zombie: exited, not yet reaped
            return
        samples.append(int(found.group(1)) / 1024)
        time.sleep(every)


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of ``pid`` so far (Linux ``/proc``), None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def watch_rounds(pid: int, marks: Callable[[], int], cpu: list[float], every: float = 0.05) -> None:
    """The child's CPU time at each round end (``marks()``: round ends so far, read from its
    output), polled every ``every`` s until it exits. With one thread per program, CPU seconds
    per round are the work, nearly independent of what else the machine runs."""
    while True:
        seen = marks()
        now = cpu_seconds(pid)
        if now is None or not Path(f"/proc/{pid}").exists():
            return
        cpu.extend([now] * (seen - len(cpu)))
        time.sleep(every)


def run_child(
    command: list[str], cwd: Path, log: Path, env: dict[str, str], gpu: bool, marks: Callable[[], int]
) -> dict:
    """Run ``command``; its wall time, peak RSS (MB, this child alone: ``os.wait4``), its RSS at
    the end (the last of samples every 0.5 s: what it holds after the rounds, the data loader's
    transient peak gone), exit code, and with ``gpu`` nvidia-smi's samples while it ran."""
    sampler = GpuSampler() if gpu else None
    started = time.perf_counter()
    rss: list[float] = []
    cpu: list[float] = []
    with open(log, "w") as out:
        process = subprocess.Popen(command, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, env=env)
        watchers = [
            threading.Thread(target=sample_rss, args=(process.pid, rss), daemon=True),
            threading.Thread(target=watch_rounds, args=(process.pid, marks, cpu), daemon=True),
        ]
        for watcher in watchers:
            watcher.start()
        _, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)
        for watcher in watchers:
            watcher.join(timeout=2)
    result = {"wall_s": time.perf_counter() - started, "rss_peak_mb": usage.ru_maxrss / 1024, "rc": process.returncode}
    if rss:
        result["rss_end_mb"] = rss[-1]
    result["cpu_at_round_end"] = cpu
    if sampler is not None:
        result.update(sampler.stop())
    return result


def child_env(threads: int, pythonpath: list[Path]) -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    env["PYTHONPATH"] = os.pathsep.join([*map(str, pythonpath), *filter(None, [os.environ.get("PYTHONPATH")])])
    env["PYTHONUNBUFFERED"] = "1"
    return env


def pfllib_path(pfllib: Path, site: Path | None, scratch: Path) -> tuple[list[Path], list[str]]:
    """PFLlib's extra import path (its dependencies folder, stand-ins) and the stand-ins used."""
    path = [site] if site is not None and site.is_dir() else []
    probe = child_env(1, path)
    used = []
    probe_code = (  # imported, not just found: a folder built for another Python version fails here
        f"import importlib\nfor m in {list(STANDINS)!r}:\n    try:\n        importlib.import_module(m)\n"
        "    except Exception:\n        print(m)"
    )
    missing = subprocess.run([sys.executable, "-c", probe_code], env=probe, capture_output=True, text=True).stdout
    for module in missing.split():
        for name, source in STANDINS[module].items():
            (scratch / "standins" / name).parent.mkdir(parents=True, exist_ok=True)
            (scratch / "standins" / name).write_text(source)
        used.append(module)
    # stand-ins first: a module of the site folder that fails to import (built for another Python,
    # as on a lent GPU machine) must not shadow its stand-in
    return ([scratch / "standins"] if used else []) + path, used


def run_pfllib(args: argparse.Namespace, folder: Path, clients: int, algo: str, tag: str, env: dict) -> dict:
    """PFLlib's main.py from ``folder/pfllib_<tag>`` (its ``../dataset`` is the data); its
    ``time cost`` lines: round 0 (with the evaluation of every client), then training rounds."""
    cwd = folder / f"pfllib_{tag}"
    cwd.mkdir(parents=True, exist_ok=True)
    rounds = args.rounds  # -gr R: rounds 0..R, R + 1 in all
    command = [
        sys.executable,
        str(args.pfllib / "system" / "main.py"),
        *("-data", DATASET, "-m", "CNN", "-algo", PFLLIB_ALGOS[algo], "-ncl", "10"),
        *("-gr", str(rounds), "-nc", str(clients), "-jr", str(args.join_ratio), "-lbs", str(args.batch_size)),
        *("-ls", "1", "-lr", str(args.lr), "-dev", args.device, "-eg", str(rounds + 1), "-t", "1"),
    ]
    log = folder / f"pfllib_{tag}.log"
    result = run_child(
        command, cwd, log, env, args.device.startswith("cuda"), lambda: len(ROUND_LINE.findall(log.read_text()))
    )
    times = [float(m) for m in ROUND_LINE.findall(log.read_text())]
    if result["rc"] != 0 or len(times) != rounds + 1:
        raise RuntimeError(f"PFLlib failed (rc {result['rc']}, {len(times)} rounds timed): see {log}")
    train = times[1:]
    result.update(round_s=statistics.fmean(train), rounds_s=times, eval_s=times[0] - statistics.fmean(train))
    cpu = result.pop("cpu_at_round_end")  # rounds 0..R end: CPU of rounds 1..R (no evaluation in them)
    if len(cpu) == rounds + 1:
        result["round_cpu_s"] = (cpu[-1] - cpu[0]) / rounds
    return result


def run_pflbench(args: argparse.Namespace, folder: Path, clients: int, algo: str, tag: str, env: dict) -> dict:
    """``pflbench run`` on the same folder, R + 2 rounds, evaluated once after the last (its
    ``round_time_s`` leaves evaluation out; its CPU time per round is taken over rounds 2..R+1)."""
    out = folder / f"pflbench_{tag}"
    shutil.rmtree(out, ignore_errors=True)  # a fresh run (a finished one would be skipped)
    rounds = args.rounds + 2
    command = [
        sys.executable,
        "-c",
        "import sys; from pflbench.cli import main; sys.argv[0] = 'pflbench'; main()",
        *("run", "--plugin", str(PLUGIN), "--model", "fedavg_cnn", "--algo", algo, "--dataset", "pfllib"),
        *("--data-dir", str(folder / "dataset" / DATASET), "--partition", "natural", "--num-clients", str(clients)),
        *("--val-frac", "0"),  # every train sample trains, as in PFLlib (no validation split carved out)
        *("--frac", str(args.join_ratio), "--batch-size", str(args.batch_size), "--local-epochs", "1"),
        *("--lr", str(args.lr), "--rounds", str(rounds), "--eval-every", str(rounds), "--device", args.device),
        *("--threads", str(args.threads), "--seed", "0", "--out", str(out), *args.pflbench_option),
    ]
    log = folder / f"pflbench_{tag}.log"

    def marks() -> int:
        return sum(len(run.read_text().splitlines()) for run in out.glob("runs/*/rounds.jsonl"))

    result = run_child(command, ROOT, log, env, args.device.startswith("cuda"), marks)
    records = [json.loads(line) for run in out.glob("runs/*/rounds.jsonl") for line in run.read_text().splitlines()]
    if result["rc"] != 0 or len(records) != rounds:
        raise RuntimeError(f"pflbench failed (rc {result['rc']}, {len(records)} rounds recorded): see {log}")
    times = [r["round_time_s"] for r in records]
    result.update(round_s=statistics.fmean(times[1:]), rounds_s=times, eval_s=records[-1].get("eval_time_s"))
    cpu = result.pop("cpu_at_round_end")  # rounds 1..R+2 end: CPU of rounds 2..R+1 (R+2 evaluates)
    if len(cpu) == rounds:
        result["round_cpu_s"] = (cpu[-2] - cpu[0]) / (rounds - 2)
    if args.device.startswith("cuda"):
        result["torch_max_allocated_mb"] = max(r["peak_mem_mb"] for r in records)
    return result


def count_copies(args: argparse.Namespace, folder: Path, clients: int, algo: str) -> dict:
    """Host→device copies (profiler events ``Memcpy HtoD``) during one pflbench training round
    on ``args.device``, against the round's minibatches: the clients' data stays on the device,
    so a round copies a few small tensors per client (its shuffled order), none per batch. In
    this process; on a CPU the count is 0 (no device) and the path is exercised all the same."""
    import torch

    from pflbench.config.run_config import RunConfig
    from pflbench.registry import load_plugin_file, loaded_plugin_file
    from pflbench.runs.prepare import prepare
    from pflbench.testing import Harness

    if loaded_plugin_file(PLUGIN) is None:
        load_plugin_file(PLUGIN)
    torch.set_num_threads(args.threads)
    config = RunConfig(
        algo=algo,
        dataset="pfllib",
        data_dir=str(folder / "dataset" / DATASET),
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
        out=str(folder / "copies"),
    )
    harness = Harness(prepare(config))
    federation = harness.federation
    sampled = federation.sample_clients(1)
    activities = [torch.profiler.ProfilerActivity.CPU]
    if args.device.startswith("cuda"):
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as profile:
        federation.train_round(1, sampled)
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
    copies = sum(1 for event in profile.events() if "HtoD" in event.name)
    batches = sum(-(-harness.data.num_train[k] // args.batch_size) for k in sampled)
    return {"algo": algo, "clients": len(sampled), "batches": batches, "htod_copies": copies}


def summarise(runs: list[dict], samples_per_round: int) -> dict:
    """Medians over the repeats of one program at one (K, algorithm)."""
    keys = {k for run in runs for k, v in run.items() if isinstance(v, (int, float)) and k != "rc"}
    summary = {k: statistics.median(run[k] for run in runs if run.get(k) is not None) for k in sorted(keys)}
    summary["samples_per_s"] = samples_per_round / summary["round_s"]
    summary["repeats"] = len(runs)
    return summary


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--pfllib", type=Path, default=os.environ.get("PFLLIB_DIR") or None, help="PFLlib work tree")
    parser.add_argument("--pfllib-site", type=Path, help="PFLlib's dependencies (default: PFLLIB/../site)")
    parser.add_argument("--clients", default="1000", help="K values, comma-separated (e.g. 100,300,1000)")
    parser.add_argument("--train-samples", type=int, default=50_000, help="train images over all clients")
    parser.add_argument("--test-samples", type=int, default=10_000, help="test images over all clients")
    parser.add_argument("--join-ratio", type=float, default=0.05)
    parser.add_argument("--batch-size", type=int, default=10)
    parser.add_argument("--lr", type=float, default=0.005)
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds (each program trains one more)")
    parser.add_argument("--repeats", type=int, default=2, help="alternations of the two programs")
    parser.add_argument("--algos", default="fedavg,fedper")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of both programs")
    parser.add_argument("--pflbench-option", action="append", default=[], help="extra `pflbench run` argument")
    parser.add_argument("--data-jobs", type=int, default=os.cpu_count() or 1, help="processes writing the data")
    parser.add_argument("--data-only", action="store_true", help="write the data folders, run nothing")
    parser.add_argument("--count-copies", action="store_true", help="host→device copies in one round (GPU)")
    parser.add_argument("--work", type=Path, help="data and run folders (default: a temporary folder)")
    parser.add_argument("--out", type=Path, help="write results.json and results.txt here")
    args = parser.parse_args(argv)
    args.clients = [int(k) for k in args.clients.split(",")]
    args.algos = args.algos.split(",")
    unknown = [a for a in args.algos if a not in PFLLIB_ALGOS]
    if unknown:
        parser.error(f"unknown algorithm {unknown[0]!r}; valid: {', '.join(PFLLIB_ALGOS)}")
    if args.pfllib is not None:
        args.pfllib = Path(args.pfllib).resolve()
        if not (args.pfllib / "system" / "main.py").is_file():
            parser.error(f"--pfllib {args.pfllib}: no system/main.py (a PFLlib work tree)")
        args.pfllib_site = (args.pfllib_site or args.pfllib.parent / "site").resolve()
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="xdev_"))
    lines: list[str] = []

    def say(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    say(f"load {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}; {os.cpu_count()} CPUs")
    pfllib_env = pflbench_env = child_env(args.threads, [ROOT])
    if args.pfllib is not None and not args.data_only:
        extra, standins = pfllib_path(args.pfllib, args.pfllib_site, work)
        pfllib_env = child_env(args.threads, extra)
        say(f"PFLlib: {args.pfllib}" + (f" (stand-ins for {', '.join(standins)})" if standins else ""))
    elif not args.data_only:
        say("PFLlib: not given (--pfllib DIR or PFLLIB_DIR): pflbench only")
    results: dict = {"settings": {k: str(v) for k, v in vars(args).items()}, "cases": []}
    for clients in args.clients:
        folder = work / f"K{clients}"
        started = time.perf_counter()
        write_folder(folder, clients, args.train_samples, args.test_samples, jobs=args.data_jobs)
        say(f"K={clients}: data folder {folder} ({time.perf_counter() - started:.0f} s)")
        if args.data_only:
            continue
        sampled = max(1, round(clients * args.join_ratio))
        sizes = client_sizes(args.train_samples, clients)
        samples_per_round = round(statistics.fmean(sizes) * sampled)  # equal sizes up to one sample
        for algo in args.algos:
            runs: dict[str, list[dict]] = {"pfllib": [], "pflbench": []}
            for repeat in range(args.repeats):
                tag = f"{algo}_{repeat}"
                if args.pfllib is not None:
                    runs["pfllib"].append(run_pfllib(args, folder, clients, algo, tag, pfllib_env))
                runs["pflbench"].append(run_pflbench(args, folder, clients, algo, tag, pflbench_env))
                for name, done in runs.items():
                    if done:
                        r = done[-1]
                        say(
                            f"  K={clients} {algo} #{repeat} {name}: {r['round_s']:.3f} s/round "
                            f"(CPU {r.get('round_cpu_s', float('nan')):.3f} s) "
                            f"(rounds {[round(t, 2) for t in r['rounds_s']]}), eval {r['eval_s'] or 0:.2f} s, "
                            f"RSS peak {r['rss_peak_mb']:.0f} MB, end {r.get('rss_end_mb', 0):.0f} MB, "
                            f"wall {r['wall_s']:.0f} s"
                        )
            case = {"clients": clients, "algo": algo, "sampled": sampled, "samples_per_round": samples_per_round}
            case.update({name: summarise(done, samples_per_round) for name, done in runs.items() if done})
            case["runs"] = runs
            if runs["pfllib"]:
                case["round_ratio"] = case["pflbench"]["round_s"] / case["pfllib"]["round_s"]
                # a tiny run's CPU time can read 0 at the clock's resolution: no ratio then
                if "round_cpu_s" in case["pflbench"] and case["pfllib"].get("round_cpu_s"):
                    case["round_cpu_ratio"] = case["pflbench"]["round_cpu_s"] / case["pfllib"]["round_cpu_s"]
                case["rss_ratio"] = case["pflbench"]["rss_peak_mb"] / case["pfllib"]["rss_peak_mb"]
            results["cases"].append(case)
            say(summary_line(case))
            if args.count_copies:
                copies = count_copies(args, folder, clients, algo)
                case["copies"] = copies
                say(
                    f"  K={clients} {algo} pflbench on {args.device}: {copies['htod_copies']} host→device copies "
                    f"in one round of {copies['clients']} clients, {copies['batches']} minibatches"
                )
            save(args.out, results, lines)
    results["load_after"] = os.getloadavg()
    say(f"load {results['load_after'][0]:.2f} {results['load_after'][1]:.2f} {results['load_after'][2]:.2f}")
    save(args.out, results, lines)
    print(json.dumps([{k: v for k, v in c.items() if k != "runs"} for c in results["cases"]]))
    return results


def save(out: Path | None, results: dict, lines: list[str]) -> None:
    """results.json and results.txt in ``out`` (after every case: a run cut short keeps its cases)."""
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps(results, indent=1))
        (out / "results.txt").write_text("\n".join(lines) + "\n")


def summary_line(case: dict) -> str:
    parts = [
        f"K={case['clients']} {case['algo']} ({case['sampled']} clients, {case['samples_per_round']} samples/round)"
    ]
    for name in ("pfllib", "pflbench"):
        if name in case:
            s = case[name]
            gpu = (
                f", GPU {s['gpu_mem_used_peak_mb']:.0f} MB used, {s['gpu_util_mean_pct']:.0f}% util"
                if "gpu_mem_used_peak_mb" in s
                else ""
            )
            parts.append(
                f"{name} {s['round_s']:.3f} s/round (CPU {s.get('round_cpu_s', float('nan')):.3f} s), "
                f"{s['samples_per_s']:.0f} samples/s, "
                f"RSS peak {s['rss_peak_mb']:.0f} MB, end {s.get('rss_end_mb', 0):.0f} MB{gpu}"
            )
    if "round_ratio" in case:
        cpu = f", CPU time {case['round_cpu_ratio']:.2f}×" if "round_cpu_ratio" in case else ""
        parts.append(f"pflbench/PFLlib: time {case['round_ratio']:.2f}×{cpu}, RSS {case['rss_ratio']:.2f}×")
    return "; ".join(parts)


if __name__ == "__main__":
    main()
