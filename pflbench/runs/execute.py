"""``execute(prepared)``: the federation's rounds in a claimed work folder ``OUT/runs/.tmp-NAME``
with the result writer, checkpoints, trackers and other observers watching; then the summary,
the saved models, and the folder moved into place as ``OUT/runs/NAME`` (``rundir``)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from pflbench.engine import Diverged, Federation, Observer, RunObserver
from pflbench.engine.federation import federation_of
from pflbench.engine.metrics import summarize
from pflbench.engine.observer_hooks import installed_observers
from pflbench.engine.observers import RoundCallback
from pflbench.runs.checkpoint import CheckpointObserver
from pflbench.runs.export import save_models
from pflbench.runs.start import start_or_resume
from pflbench.runs.trackers import make_trackers
from pflbench.store.layout import (
    CHECKPOINT_FILE,
    CONFIG_FILE,
    SUMMARY_FILE,
    Claim,
    RunPaths,
    guard_run,
    publish,
    writing,
)
from pflbench.store.reader import read_json
from pflbench.store.writer import RunWriter

if TYPE_CHECKING:
    from pflbench.runs.prepared import PreparedRun


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


# clients.csv's per-client metric columns after pers_acc, in this order, where measured
CLIENT_METRIC_COLUMNS = ("val_pers_acc", "pers_acc_ft", "new_acc", "new_acc_ft")


def client_rows(
    prepared: PreparedRun,
    federation: Federation,
    client_accuracy: Any,
    algorithm_columns: dict[str, list[Any]],
) -> list[dict[str, Any]]:
    """clients.csv: per client its split sizes, classes, accuracies and the algorithm's columns.
    With a validation split ``val_samples`` and ``val_pers_acc``; with new clients a
    ``new_client`` flag (1/0) and ``new_acc`` (their metrics are empty for the other kind)."""
    stats, partition = prepared.partition.stats, prepared.partition
    new = set(partition.new_clients)
    measured = [name for name in CLIENT_METRIC_COLUMNS if name in federation.client_metrics]
    rows = []
    for k in range(prepared.config.num_clients):
        row: dict[str, Any] = {"client": k, "train_samples": stats["train_samples"][k]}
        if partition.has_val:
            row["val_samples"] = stats["val_samples"][k]
        row.update(test_samples=stats["test_samples"][k], classes=stats["classes_per_client"][k])
        if new:
            row["new_client"] = int(k in new)
        row["pers_acc"] = float(client_accuracy[k])
        row.update({name: float(federation.client_metrics[name][k]) for name in measured})
        row.update({column: values[k] for column, values in algorithm_columns.items()})
        rows.append(row)
    return rows


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
    identity = prepared.identity.hash
    done = read_json(paths.work / SUMMARY_FILE) if resume else None
    if (
        isinstance(done, dict)
        and done.get("status") == "completed"
        and (read_json(paths.work / CONFIG_FILE) or {}).get("identity_hash") == identity
    ):
        publish(paths)  # killed between writing summary.json and moving the folder into place
        return done
    federation = federation_of(prepared)
    writer, records, before = start_or_resume(prepared, federation, paths, resume, plugins)
    # trackers write into the work folder (tensorboard/), moved into place with the run
    at_work = SimpleNamespace(config=config, run_dir=paths.work, hparams=prepared.algorithm.hparams)
    trackers.extend(make_trackers(config.log, at_work, config.mlflow_uri))
    observers = [*trackers, *observers]
    checkpointer = CheckpointObserver(
        paths.work / CHECKPOINT_FILE, federation, identity, config.checkpoint_every, writer, before, claim
    )
    federation.observers = [
        WriterObserver(writer, records),
        checkpointer,
        *observers,
        *([RoundCallback(on_round)] if on_round else []),
        *installed_observers(),  # last: they see each round written and checkpointed
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
        prepared.executor.close()  # e.g. Ray actors back to the pool
    report, client_columns = prepared.algorithm.final_report()
    writer.write_clients(client_rows(prepared, federation, client_accuracy, client_columns))
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
        save_models(prepared, paths.work)
    for observer in federation.observers:  # trackers close their files while they are in the work folder
        observer.on_run_end(summary)
    writer.write_summary(summary)
    (paths.work / CHECKPOINT_FILE).unlink(missing_ok=True)
    publish(paths)
    return summary
