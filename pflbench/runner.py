"""Build a run from a RunConfig and execute it, as a straight pipeline of named stages:
resolve → validate → data → partition → initial weights → model → algorithm → executor; then the
federation's rounds with the result writer (and any other observers) watching."""

from __future__ import annotations

import dataclasses
import os
import platform
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from . import __version__
from .cache import warn
from .checkpoint import CHECKPOINT_FILE, CheckpointObserver, load_checkpoint, restore_checkpoint
from .config import (
    RunConfig,
    hyperparameters_from,
    identity_hash,
    resolve,
    run_identity,
    run_name,
    validate,
)
from .data import FederatedData, TensorDataset, load_dataset
from .defaults import model_family
from .engine import EXECUTORS, Algorithm, Diverged, Executor, Federation, Observer, RunObserver
from .engine.executor import make_executor
from .engine.observers import RoundCallback
from .errors import ConfigError
from .metrics import summarize
from .models import build_model
from .partition import Partition, make_partition  # noqa: F401  (re-exported: the run's partition stage)
from .partition_io import fit_num_clients
from .pretrain import initial_weights, load_initial_weights
from .registry import ALGORITHMS
from .results import RunWriter, read_rounds
from .rundir import Claim, RunPaths, fresh_work_folder, guard_run, publish, read_json, writing
from .seeding import derive_seed
from .threads import apply_threads
from .trackers import check_trackers, make_trackers


def resolve_device(name: str) -> torch.device:
    try:
        device = torch.device(name)
    except RuntimeError as error:
        raise ConfigError(f"--device {name!r} is not a torch device (cpu, cuda, cuda:1, ...)") from error
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"--device {name!r}: CUDA is not available on this machine; use --device cpu")
    if device.type not in ("cpu", "cuda", "mps"):
        raise ConfigError(f"--device {name!r} is not supported; use cpu or cuda")
    return device


def git_commit() -> str | None:
    try:
        return (
            subprocess.run(
                ["git", "rev-parse", "HEAD"],
                capture_output=True,
                text=True,
                cwd=Path(__file__).resolve().parent,
                timeout=5,
            ).stdout.strip()
            or None
        )
    except (OSError, subprocess.SubprocessError):
        return None


@dataclass
class PreparedRun:
    config: RunConfig  # resolved
    algorithm: Algorithm
    executor: Executor
    partition: Partition
    dataset: TensorDataset
    data: FederatedData
    run_dir: Path
    resolved: dict[str, Any]  # how the run was resolved (defaults filled, backbone, LoRA)

    @property
    def server(self) -> Algorithm:  # the name before the executor seam
        return self.algorithm

    @property
    def hparams(self) -> Any:  # what the trackers log as algo_hparams.*
        return self.algorithm.hparams


def check_model(config: RunConfig, algorithm_class: type[Algorithm], hparams: Any, dataset: TensorDataset) -> None:
    """Build and transform a throwaway model, so that bad model options, LoRA targets or ranks
    fail before any expensive stage (pretraining)."""
    with torch.random.fork_rng(devices=[]):
        model = build_model(config.model, dataset.input_shape, dataset.num_classes, **config.model_options())
        algorithm_class.configure_model(model, config, hparams)


def prepare(
    config: RunConfig,
    algo_options: dict[str, Any] | None = None,
    shared_defaults: dict[str, Any] | None = None,
    guard: Callable[[Path], None] | None = None,
) -> PreparedRun:
    """Resolve, validate and build everything; nothing is written yet.

    Unset settings (``None``) take the algorithm's run defaults (``Algorithm.run_defaults``), then
    ``shared_defaults`` (a sweep's), then ``config.BASE_DEFAULTS`` — identically for the CLI,
    sweeps and library calls. ``guard(run_dir)`` is called as soon as the run's folder is known,
    before the partition and any pretraining (e.g. ``rundir.guard_run``: refuse a finished run)."""
    algorithm_class = ALGORITHMS.get(config.algo)
    hparams = hyperparameters_from(algorithm_class.hyperparameters, dict(algo_options or {}), config.algo)
    config, applied = resolve(config, algorithm_class, hparams, shared_defaults)
    validate(config)
    algorithm_class.check_config(config, hparams)
    if config.finetune_epochs and not algorithm_class.has_global_model:
        raise ConfigError(
            f"--finetune-epochs fine-tunes the global model, and --algo {config.algo} has none; leave it at 0"
        )
    if config.executor not in EXECUTORS:
        raise ConfigError(f"--executor {config.executor!r} is not one of: {', '.join(EXECUTORS)}")
    getattr(EXECUTORS[config.executor], "check", lambda: None)()  # e.g. Ray installed
    lora_rank = algorithm_class.lora_rank(config, hparams)
    resolved: dict[str, Any] = {
        "run_defaults": applied,
        "defaults_family": model_family(config.model),
        "threads": apply_threads(config.threads),
    }
    if config.log:
        check_trackers(config.log)  # an unknown tracker or a missing library fails before any work
    device = resolve_device(config.device)
    dataset = load_dataset(config.dataset, config.dataset_options())
    # a preset partition sets K; a --num-clients other than the default must agree with it
    explicit = {"num_clients"} if config.num_clients != RunConfig.num_clients else set()
    config = fit_num_clients(config, dataset, explicit)
    run_dir = Path(config.out) / "runs" / run_name(config, algorithm_class, hparams)
    if guard is not None:
        guard(run_dir)
    split = make_partition(config.partition_spec, dataset)
    if config.init_spec.pretrains(lora_rank is not None):
        check_model(config, algorithm_class, hparams, dataset)
    weights, backbone = initial_weights(config, dataset, split.public, device, lora_rank is not None)
    torch.manual_seed(derive_seed(config.seed, "init"))
    model = build_model(
        config.model, dataset.input_shape, dataset.num_classes, pretrained=config.pretrained, **config.model_options()
    )
    resolved["backbone"] = load_initial_weights(model, weights, backbone, config, split.public)
    resolved.update(algorithm_class.configure_model(model, config, hparams))
    model.to(device)
    data = FederatedData(dataset, split.train, split.test, device)
    algorithm = algorithm_class(config, hparams, model, data.num_train)
    executor = make_executor(config.executor, model, data, config)
    check = getattr(executor, "check_algorithm", None)
    if check is not None:  # an executor refuses what it cannot host now, not mid-run
        check(algorithm)
    return PreparedRun(config, algorithm, executor, split, dataset, data, run_dir, resolved)


def config_record(prepared: PreparedRun, plugins: tuple[str, ...] = ()) -> dict[str, Any]:
    """config.json: every resolved setting, the identity (the settings the run reads), how the
    run was resolved, and the environment."""
    algorithm, config = prepared.algorithm, prepared.config
    identity = run_identity(config, type(algorithm), algorithm.hparams)
    model = prepared.executor.model
    sizes = {n: t.numel() for n, t in model.named_parameters()}
    buffers = {n: t.numel() for n, t in model.named_buffers()}
    count = {**buffers, **sizes}
    return {
        **dataclasses.asdict(config),
        "algo_hparams": dataclasses.asdict(algorithm.hparams),
        "identity": identity,
        "identity_hash": identity_hash(identity),
        "plugins": list(plugins),
        "resolved": {
            "eval_every": config.resolved_eval_every,
            "clients_per_round": config.sampled_per_round,
            "dataset_source": prepared.dataset.source,
            "dataset_size": len(prepared.dataset.labels),
            "input_shape": list(prepared.dataset.input_shape),
            "num_classes": prepared.dataset.num_classes,
            "model_parameters": sum(sizes.values()),
            "shared_parameters": sum(count[n] for n in algorithm.layout.shared),
            "private_parameters": sum(count[n] for n in algorithm.layout.private),
            **prepared.resolved,
            **algorithm.run_info(),
        },
        "versions": {
            "pflbench": __version__,
            "python": platform.python_version(),
            "torch": torch.__version__,
            "numpy": np.__version__,
        },
        "git_commit": git_commit(),
        "command": sys.argv,
    }


class WriterObserver(Observer):
    """Keeps the round records and writes one rounds.jsonl line per round."""

    def __init__(self, writer: RunWriter, records: list[dict[str, Any]]) -> None:
        self.writer, self.records = writer, records

    def on_round_end(self, record: dict[str, Any]) -> None:
        self.records.append(record)
        self.writer.write_round(record)


class RunDiverged(RuntimeError):
    """The run stopped on a non-finite loss or parameter; its partial results were kept."""

    def __init__(self, summary: dict[str, Any]) -> None:
        self.summary = summary
        d = summary["diverged"]
        where = f"client {d['client']}, " if d["client"] is not None else ""
        super().__init__(
            f"run diverged at round {d['round']} ({where}{d['term']} is not finite); "
            f"partial results with status 'diverged' in {summary['run_dir']}"
        )


class _KillAfterRound(Observer):
    """Test hook (``PFLBENCH_TEST_KILL_AFTER_ROUND=r``): SIGKILL this process after round r."""

    def __init__(self, round_index: int) -> None:
        self.round = round_index

    def on_round_end(self, record: dict[str, Any]) -> None:
        if record["round"] == self.round:
            os.kill(os.getpid(), signal.SIGKILL)


def _start(
    prepared: PreparedRun,
    federation: Federation,
    paths: RunPaths,
    identity: str,
    resume: bool,
    plugins: tuple[str, ...],
) -> tuple[RunWriter, list[dict[str, Any]], dict[str, Any]]:
    """Resume from the work folder's checkpoint (``resume``), else start an empty work folder."""
    checkpoint = paths.work / CHECKPOINT_FILE
    if not resume and checkpoint.is_file():
        warn(f"{paths.work} holds an unfinished run with a checkpoint; starting it over (--resume continues it)")
    entry = load_checkpoint(checkpoint, identity) if resume and paths.work.is_dir() else None
    if entry is not None:
        tensors, meta = entry
        try:
            records = read_rounds(paths.work / "rounds.jsonl", meta["records"])
        except (OSError, ValueError) as problem:
            warn(f"cannot resume {paths.work}: {problem}; starting the run again")
        else:
            restore_checkpoint(federation, tensors, meta)
            portable = prepared.config.portable
            return RunWriter(paths.work, keep_rounds=meta["records"], portable=portable), records, meta["before"]
    writer = RunWriter(fresh_work_folder(paths), portable=prepared.config.portable)
    writer.write_config(config_record(prepared, plugins))
    writer.write_partition(prepared.partition.to_json())
    before: dict[str, Any] = {}
    if prepared.resolved["backbone"]["source"] != "random init":  # what fine-tuning starts from
        metrics, _ = federation.evaluate()
        before = {"backbone_pers_acc": metrics["pers_acc"], "backbone_global_acc": metrics["global_acc"]}
    return writer, [], before


def execute(
    prepared: PreparedRun,
    on_round: Callable[[dict[str, Any]], None] | None = None,
    plugins: tuple[str, ...] = (),
    observers: Sequence[RunObserver] = (),
    *,
    force: bool = False,
    resume: bool = False,
) -> dict[str, Any]:
    """Run the rounds into ``OUT/runs/.tmp-NAME`` and move the folder to ``OUT/runs/NAME`` when
    complete (``rundir``); returns the summary.

    Refuses (ConfigError) a run that is finished (unless ``force``) or claimed by another live
    process. ``resume``: continue from the work folder's checkpoint when there is one.
    Raises ``RunDiverged`` (partial results kept, status ``diverged``) on a non-finite loss or
    parameter."""
    paths = RunPaths(prepared.run_dir)
    guard_run(paths, force)
    with Claim(paths) as claim, writing(paths.work):  # a full disk: "cannot write FILE: reason"
        guard_run(paths, force, check_claim=False)  # finished by another process meanwhile?
        trackers: list[Any] = []  # made once the work folder exists (_execute_claimed)
        try:
            return _execute_claimed(prepared, paths, claim, on_round, plugins, observers, resume, trackers)
        except BaseException:
            for tracker in trackers:  # an MLflow run that stopped early is marked FAILED
                tracker.close(failed=True)
            raise


def _execute_claimed(
    prepared: PreparedRun,
    paths: RunPaths,
    claim: Claim,
    on_round: Callable[[dict[str, Any]], None] | None,
    plugins: tuple[str, ...],
    observers: Sequence[RunObserver],
    resume: bool,
    trackers: list[Any],
) -> dict[str, Any]:
    config = prepared.config
    identity = identity_hash(run_identity(config, type(prepared.algorithm), prepared.algorithm.hparams))
    done = read_json(paths.work / "summary.json") if resume else None
    if (
        isinstance(done, dict)
        and done.get("status") == "completed"
        and (read_json(paths.work / "config.json") or {}).get("identity_hash") == identity
    ):
        publish(paths)  # killed between writing summary.json and moving the folder into place
        return done
    federation = Federation(prepared.algorithm, prepared.executor, prepared.data.num_test)
    writer, records, before = _start(prepared, federation, paths, identity, resume, plugins)
    # trackers write into the work folder (tensorboard/), moved into place with the run
    at_work = SimpleNamespace(config=config, run_dir=paths.work, hparams=prepared.algorithm.hparams)
    trackers.extend(make_trackers(config.log, at_work, config.mlflow_uri))
    observers = [*trackers, *observers]
    checkpointer = CheckpointObserver(
        paths.work / CHECKPOINT_FILE, federation, identity, config.checkpoint_every, writer, before, claim
    )
    kill_after = os.environ.get("PFLBENCH_TEST_KILL_AFTER_ROUND")
    federation.observers = [
        WriterObserver(writer, records),
        checkpointer,
        *observers,
        *([RoundCallback(on_round)] if on_round else []),
        *([_KillAfterRound(int(kill_after))] if kill_after else []),
    ]
    for observer in federation.observers:
        observer.on_run_start(prepared)
    started = time.perf_counter()

    def base_summary() -> dict[str, Any]:
        return {
            "algo": config.algo,
            "dataset": config.dataset,
            "alpha": config.alpha,
            "partition": config.partition,
            "seed": config.seed,
            "num_clients": config.num_clients,
            "model": config.model,
        }

    try:
        client_accuracy = federation.run()
    except Diverged as diverged:
        summary = {
            "status": "diverged",
            "diverged": diverged.to_json(),
            **base_summary(),
            **summarize(records),
            **before,
            "wall_time_s": time.perf_counter() - started,
            "run_dir": str(paths.final),
        }
        writer.write_summary(summary)
        (paths.work / CHECKPOINT_FILE).unlink(missing_ok=True)
        publish(paths)
        raise RunDiverged(summary) from None
    finally:
        writer.close()
        getattr(prepared.executor, "close", lambda: None)()  # e.g. Ray actors back to the pool
    stats = prepared.partition.stats
    report, client_columns = prepared.algorithm.final_report()
    writer.write_clients(
        [
            {
                "client": k,
                "train_samples": stats["train_samples"][k],
                "test_samples": stats["test_samples"][k],
                "classes": stats["classes_per_client"][k],
                "pers_acc": float(client_accuracy[k]),
                **(
                    {"pers_acc_ft": float(federation.finetune_accuracy[k])}
                    if federation.finetune_accuracy is not None
                    else {}
                ),
                **{column: values[k] for column, values in client_columns.items()},
            }
            for k in range(config.num_clients)
        ]
    )
    summary = {
        "status": "completed",
        **base_summary(),
        **summarize(records),
        **before,
        **report,
        "wall_time_s": time.perf_counter() - started,
        **checkpointer.report(),
        "run_dir": str(paths.final),
    }
    if config.save_model:  # before summary.json: a finished run folder holds its models
        from .model_export import save_models

        save_models(prepared, paths.work)
    for observer in federation.observers:  # trackers close their files while they are in the work folder
        observer.on_run_end(summary)
    writer.write_summary(summary)
    (paths.work / CHECKPOINT_FILE).unlink(missing_ok=True)
    publish(paths)
    return summary


def run_experiment(
    config: RunConfig,
    algo_options: dict[str, Any] | None = None,
    on_round: Callable[[dict[str, Any]], None] | None = None,
    observers: Sequence[RunObserver] = (),
    *,
    force: bool = False,
    resume: bool = False,
) -> dict[str, Any]:
    """Library entry point: prepare (resolving unset settings as the CLI does) and execute."""
    return execute(prepare(config, algo_options), on_round, observers=observers, force=force, resume=resume)
