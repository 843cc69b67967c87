"""``pflbench run``: one run, with a progress bar, into ``OUT/runs/NAME``.

Options are generated from the config dataclasses, so defaults and help live in one place.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import click

from pflbench.cli.config_file import config_option
from pflbench.cli.controls import controls
from pflbench.cli.options import RunCommand, dataclass_options
from pflbench.config.run_config import RunConfig


def _run_callback(quiet: bool, plugin: tuple[str, ...], force: bool, resume: bool, **values: Any) -> int:

    from pflbench.store.layout import RunPaths, check_writable, guard_run, runs_folder

    run_fields = {f.name for f in dataclasses.fields(RunConfig)}
    config = RunConfig(**{k: v for k, v in values.items() if k in run_fields})
    algo_options = {k: v for k, v in values.items() if k not in run_fields and v is not None}
    check_before_torch(config)
    check_writable(config.out)
    check_writable(runs_folder(config.out))
    from pflbench.cli.options import refuse_inert_options
    from pflbench.runs.execute import RunDiverged, execute  # torch from here on
    from pflbench.runs.prepare import plan_run, prepare

    plan = plan_run(config, algo_options)  # unset settings take the algorithm's run defaults
    refuse_inert_options([(plan.config, plan.hparams)])
    from pflbench.util.progress import SILENT, LineReporter, reporting

    try:
        # long stages before the rounds (decoding, pretraining) report to stderr unless --quiet
        with reporting(SILENT if quiet else LineReporter()):
            # a finished or claimed run is refused before the partition and any pretraining
            prepared = prepare(plan, guard=lambda run_dir: guard_run(RunPaths(run_dir), force))
            if quiet:
                summary = execute(prepared, plugins=plugin, force=force, resume=resume)
            else:
                summary = _execute_with_progress(prepared, plugin, execute, force=force, resume=resume)
    except RunDiverged as diverged:
        click.echo(f"Error: {diverged}", err=True)
        return 1
    if "backbone_pers_acc" in summary:
        backbone = prepared.resolved["backbone"]
        click.echo(
            f"before fine-tuning: pers_acc {summary['backbone_pers_acc']:.4f}; backbone "
            f"{backbone['source']}; head {backbone['head']}"
        )
    click.echo(_summary_line(summary))
    if prepared.config.save_model:
        click.echo(f"models: {prepared.run_dir / 'models'}")
    return 0


def check_before_torch(config: RunConfig) -> None:
    """What a bad command line can be told without the algorithm's class, torch or data (not
    after the seconds of importing torch): the algorithm's name and every value given
    (``config.run_config.validate_given``). ``plan_run`` checks the rest once the algorithm is
    imported, before any data is read."""
    from pflbench.config.run_config import validate_given
    from pflbench.plugin_sources import algorithm_hyperparameters
    from pflbench.registry import ALGORITHMS, unknown_name

    known = algorithm_hyperparameters()  # every registered algorithm (read from its source, or imported)
    if config.algo not in known and config.algo not in ALGORITHMS._items:
        raise unknown_name(ALGORITHMS.kind, config.algo, known)
    validate_given(config)


class ProgressObserver:
    """The rounds' progress: round, personalized accuracy, training loss (a run observer).
    ``show(done, status)`` moves the display to ``done`` rounds (a resumed run starts past 0)."""

    def __init__(self, show: Any) -> None:
        self.show, self.accuracy = show, "-"

    def on_run_start(self, run: Any) -> None:
        pass

    def on_client_update(self, job: Any, update: Any) -> None:
        pass

    def on_round_end(self, record: dict[str, Any]) -> None:
        if record.get("pers_acc") is not None:
            self.accuracy = f"{record['pers_acc']:.4f}"
        self.show(record["round"], f"pers_acc {self.accuracy}  loss {record['train_loss']:.4f}")

    def on_run_end(self, summary: dict[str, Any]) -> None:
        pass


def _execute_with_progress(prepared: Any, plugin: tuple[str, ...], execute: Any, **flags: Any) -> dict[str, Any]:
    """``execute`` with the rounds shown on stderr: a live bar on a terminal; else (a log file)
    plain lines, at most every 30 s (``util.progress.LineReporter``; ``PFLBENCH_PROGRESS_EVERY``),
    so that a log shows where a long run is (a live bar writes nothing to a file until it ends)."""
    import sys

    from pflbench.util import progress

    config = prepared.config
    title = f"{config.algo} on {config.dataset}"
    if not sys.stderr.isatty():
        with progress.reporting(progress.LineReporter()), progress.stage(title, config.rounds, "round") as rounds:

            def show(done: int, status: str) -> None:
                rounds.advance(done - rounds.done, status)

            return execute(prepared, plugins=plugin, observers=[ProgressObserver(show)], **flags)
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[status]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    )
    with (
        Progress(*columns, console=Console(stderr=True), transient=False) as bar,
        progress.reporting(RichReporter(bar)),
    ):
        task = bar.add_task(title, total=config.rounds, status="")

        def show_bar(done: int, status: str) -> None:
            bar.update(task, completed=done, status=status)

        return execute(prepared, plugins=plugin, observers=[ProgressObserver(show_bar)], **flags)


class RichReporter:
    """Stages inside the rounds (fine-tuning, personalizing for evaluation) as rows of the
    rounds' progress display (a ``pflbench.util.progress.Reporter``): plain stderr lines
    would be torn by its live redraws."""

    def __init__(self, progress: Any) -> None:
        self.progress = progress

    def note(self, line: str) -> None:
        self.progress.console.print(line, markup=False, highlight=False)

    def start(self, name: str, total: int, unit: str) -> Any:
        return self.progress.add_task(f"  {name}", total=total, status=unit)

    def update(self, handle: Any, done: int, status: str) -> None:
        self.progress.update(handle, completed=done, **({"status": status} if status else {}))

    def finish(self, handle: Any, status: str) -> None:
        self.progress.remove_task(handle)


def _summary_line(summary: dict[str, Any]) -> str:
    def fmt(value: Any) -> str:
        return "null" if value is None else f"{value:.4f}"

    return (
        f"pers_acc {fmt(summary['pers_acc'])}  pers_acc_weighted {fmt(summary['pers_acc_weighted'])}  "
        f"worst10 {fmt(summary['pers_acc_worst10'])}  global_acc {fmt(summary['global_acc'])}  "
        + (f"pers_acc_ft {fmt(summary['pers_acc_ft'])}  " if "pers_acc_ft" in summary else "")
        + f"up {summary['bytes_up_total'] / 2**20:.2f} MB  time {summary['wall_time_s']:.1f}s\n"
        f"results: {summary['run_dir']}"
    )


run_command = RunCommand(
    "run",
    callback=_run_callback,
    help="Run one federated experiment and write its results folder OUT/runs/<name>/ (built in "
    "OUT/runs/.tmp-<name>/ and moved into place when complete).\n\nExit code 0: completed; 1: "
    "diverged (a non-finite loss or parameter; partial results kept with status diverged); "
    "2: bad input, or a finished run without --force (one Error: line, nothing written).\n\n"
    "Options can come from a TOML/YAML file (--config FILE; keys = option names); options "
    "given on the command line override the file.",
    params=[
        config_option(),
        *dataclass_options(RunConfig),
        *controls("quiet", "force", "resume", "plugin", "help_all"),
    ],
)
