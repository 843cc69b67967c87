"""``pflbench reference``: regenerate the reference leaderboards (``results/reference/<scenario>/``).

For each scenario folder under ROOT (a ``scenario.toml``, ``config.reference``) and each of its
algorithms: the tuning study, then the default and tuned runs over the seeds
(``sweeps.reference``, in the work folder), then the artifacts (``report.reference``), rewritten
as algorithms finish (at most every 5 minutes, and at the end) so partial progress can be committed. Rerunning resumes; adding an
algorithm later runs only its cells.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import click

from pflbench.errors import ConfigError
from pflbench.util.progress import format_duration

DEFAULT_ROOT = "results/reference"
DEFAULT_WORK = "reference-work"
ARTIFACTS_EVERY_S = 300.0


@click.command("reference")
@click.argument("root", required=False, default=DEFAULT_ROOT, type=click.Path(file_okay=False))
@click.option(
    "--work",
    default=DEFAULT_WORK,
    show_default=True,
    type=click.Path(file_okay=False),
    help="Folder for the runs, studies and work records (WORK/<scenario>/...); keep it outside git.",
)
@click.option("--scenario", "scenarios", multiple=True, metavar="NAME", help="Only this scenario (repeatable).")
@click.option(
    "--algo",
    "algos",
    multiple=True,
    metavar="NAME",
    help="Only this algorithm (repeatable); a registered algorithm outside the scenario's list (a "
    "plugin) is run under the same protocol.",
)
@click.option(
    "--jobs",
    "-j",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Algorithms at once, each in its own process (one algorithm alone: its runs at once); "
    "a study's trials always run one after another, so the numbers are the same at any --jobs.",
)
@click.option(
    "--artifacts/--no-artifacts",
    default=True,
    show_default=True,
    help="Write the artifacts into ROOT/<scenario>/ (--no-artifacts: only run the cells, e.g. a "
    "plugin to compare with `pflbench leaderboard WORK --reference ROOT/<scenario>`).",
)
@click.option(
    "--artifacts-only",
    is_flag=True,
    help="Run nothing: rewrite the artifacts from the work folder's record and runs.",
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="List the scenarios, algorithms and budgets, and the algorithms that refuse a scenario's "
    "settings (each cell planned and built, not trained); run nothing.",
)
@click.option("--plugin", multiple=True, help="Python file that registers an algorithm (repeatable).")
def reference_command(
    root: str,
    work: str,
    scenarios: tuple[str, ...],
    algos: tuple[str, ...],
    jobs: int,
    artifacts: bool,
    artifacts_only: bool,
    dry_run: bool,
    plugin: tuple[str, ...],
) -> int:
    """Regenerate the reference leaderboards of ROOT (default results/reference): for every
    scenario and algorithm, tune (the same number of trials for every algorithm, selection on
    validation), run the default and the tuned setting over the scenario's seeds, and write the
    scenario's artifacts (leaderboard.md/.tex/.csv, summary.csv, curves, hyperparameters.json,
    manifest.json). Resumable: rerun the same command; finished runs and trials are kept.

    \b
    Example:
      pflbench reference results/reference --jobs 2
      pflbench reference --scenario fmnist-dir0.1 --algo fedavg --jobs 2
    """
    from pflbench.config.reference import read_scenario, scenario_folders

    if artifacts_only and not artifacts:
        raise ConfigError("--artifacts-only and --no-artifacts leave nothing to do; give one")
    folders = scenario_folders(root) if Path(root).is_dir() else []
    if not folders:
        raise ConfigError(f"{root} holds no scenario (a folder with scenario.toml, or folders of them)")
    chosen = {read_scenario(f).name: f for f in folders}
    for name in scenarios:
        if name not in chosen:
            raise ConfigError(f"--scenario {name!r} is not under {root}; scenarios: {', '.join(chosen)}")
    selected = [(n, f) for n, f in chosen.items() if not scenarios or n in scenarios]

    from pflbench.registry import load_plugin_file

    for path in plugin:
        load_plugin_file(path)
    failed = 0
    for _name, folder in selected:
        failed += _scenario(
            read_scenario(folder), folder, work, algos, jobs, artifacts, artifacts_only, dry_run, plugin
        )
    return 1 if failed else 0


def _scenario(
    scenario: object,
    folder: Path,
    work: str,
    algos: tuple[str, ...],
    jobs: int,
    artifacts: bool,
    artifacts_only: bool,
    dry_run: bool,
    plugin: tuple[str, ...],
) -> int:
    from pflbench.config.reference import Scenario
    from pflbench.report.reference import write_artifacts
    from pflbench.store.layout import check_writable, runs_folder
    from pflbench.store.reader import read_json
    from pflbench.sweeps.reference import (
        check_optuna,
        dataset_sha256,
        pretrain_backbones,
        refusals,
        regenerate,
        scenario_algorithms,
        scenario_base,
        shipped_algorithm,
        study_summary,
        work_record_path,
        write_work_record,
    )

    assert isinstance(scenario, Scenario)
    base = scenario_base(scenario, work)
    protocol = scenario.protocol
    runs_dir = runs_folder(base.out)
    if artifacts_only:
        path = work_record_path(base)
        if not path.is_file():
            raise ConfigError(f"{path} does not exist: nothing to write the artifacts of {scenario.name} from")
        check_writable(folder)
        write_artifacts(scenario, folder, read_json(path), runs_dir, click.echo)
        _write_literature(folder.parent)
        return 0
    names = scenario_algorithms(scenario, algos)
    tune_rounds = protocol.tune_rounds or base.rounds
    seeds = ",".join(map(str, protocol.seeds))
    click.echo(
        f"reference {scenario.name}: {len(names)} algorithms × ({protocol.trials} tuning trials of {tune_rounds} "
        f"rounds on seed {protocol.seeds[0]}, then default and tuned × seeds {seeds} of {base.rounds} rounds) "
        f"into {base.out}"
    )
    if dry_run:  # each algorithm's cell is planned and built (no training): refusals show now
        refused = refusals(scenario, base, names)
        click.echo(f"  algorithms: {', '.join(names)}")
        for algo, reason in refused.items():
            click.echo(f"  {algo} refuses the scenario: {reason}")
        return 0
    begun = time.monotonic()
    check_optuna()
    check_writable(base.out)
    if artifacts:
        check_writable(folder)
    sha256 = dataset_sha256(scenario, base)
    # plugin files register into this process only: a plugin's model or data builds here
    pretrain_backbones(scenario, base, names, click.echo, 1 if plugin else jobs)
    failed = 0
    written_at = time.monotonic()
    record = None
    todo = []
    for index, algo in enumerate(names):
        shipped = shipped_algorithm(scenario, base, algo, folder, jobs)
        if shipped is not None:  # every cell in the committed artifacts, made by today's code
            cells, study = shipped
            click.echo(f"[{scenario.name} {index + 1}/{len(names)}] {algo}: all {len(cells)} cells shipped in {folder}")
            record = write_work_record(scenario, base, cells, sha256, {algo: study}, shipped=folder)
        else:
            todo.append((index, algo))

    def announce(index: int, algo: str) -> None:
        click.echo(f"[{scenario.name} {index + 1}/{len(names)}] {algo}: tuning ({protocol.trials} trials), then runs")

    side_by_side = max(1, min(jobs, len(todo)))  # regenerate runs this many algorithms at once
    for index, algo in todo[:side_by_side]:
        announce(index, algo)
    for position, done in enumerate(regenerate(scenario, base, todo, jobs, plugin, click.echo)):
        tag = f"[{scenario.name} {done.index + 1}/{len(names)}] {done.algo}"
        if done.error is not None:
            click.echo(f"{tag}: FAILED: {done.error}", err=True)
            failed += 1
        else:
            statuses = [c.status() for c in done.cells]
            click.echo(
                f"{tag}: {statuses.count('done')} of {len(done.cells)} cells done"
                + (f"; tuned {_params(done.cells[-1].params)}" if done.cells[-1].params else "")
                + f"; {format_duration(done.seconds)}"
            )
            failed += statuses.count("done") < len(done.cells)
            study = {done.algo: study_summary(done.study)}
            record = write_work_record(scenario, base, done.cells, sha256, study, shipped=folder)
            # partial progress can be committed: the artifacts follow the cells, at least every
            # few minutes (a write reads every cell's run folder and draws the curves) and at the end
            if artifacts and time.monotonic() - written_at >= ARTIFACTS_EVERY_S:
                write_artifacts(scenario, folder, record, runs_dir, click.echo)
                written_at = time.monotonic()
        if position + side_by_side < len(todo):  # the next algorithm takes the place this one leaves
            announce(*todo[position + side_by_side])
    if artifacts and record is not None:
        write_artifacts(scenario, folder, record, runs_dir, click.echo)
        _write_literature(folder.parent)
    # the regeneration's measured time (cells read back cost ~nothing); the load average says
    # whether the machine was shared while it ran
    click.echo(
        f"reference {scenario.name}: {len(names)} algorithms in {format_duration(time.monotonic() - begun)}"
        f" (load average over the last 15 min: {_load15()})"
    )
    return failed


def _load15() -> str:
    try:
        return f"{os.getloadavg()[2]:.1f}"
    except OSError:  # pragma: no cover - a platform without load averages
        return "unknown"


def _write_literature(root: Path) -> None:
    """The papers' numbers beside the scenarios' (``LITERATURE.md``), when ROOT ships a
    ``literature.csv``: regenerated with the artifacts, so it never lags the tables."""
    from pflbench.report.literature import LITERATURE_FILE, write_literature

    if (root / LITERATURE_FILE).is_file():
        write_literature(root)


def _params(params: dict[str, object]) -> str:
    return " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items())
