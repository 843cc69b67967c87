"""``pflbench reference``: a reference scenario's cells, run through the sweep and tune machinery.

For each algorithm of a scenario (``config.reference``): its ``pflbench tune`` study (the
scenario's trial budget, the algorithm's own search space, selection on validation, trials of
``tune_rounds`` rounds on the first seed; the study's journal makes it resume), then its cells —
the *default* setting (the algorithm's own defaults) and the *tuned* one (the study's best) over
the scenario's seeds — as one sweep (``sweeps.local.run_sweep``: finished runs are skipped, stale
ones re-run, unfinished ones resume, claimed ones are left to the process running them). Every run
lives in the work folder (``WORK/<scenario>/runs``), named by its settings, so adding an
algorithm later runs only that algorithm's study and cells.

``WORK/<scenario>/reference.json`` (the work record) lists every cell (algorithm, setting, seed,
run folder, tuned parameters, status), the scenario's identity and protocol and the dataset's
content hash; ``report.reference`` writes the shipped artifacts from it, and
``pflbench leaderboard --reference`` reads it to label a plugin's runs default or tuned.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import multiprocessing
import os
import signal
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from functools import partial
from pathlib import Path
from typing import Any

from pflbench.config import lora
from pflbench.config.reference import ALGOS_NON_LORA, Scenario
from pflbench.config.run_config import RunConfig, hyperparameters_from
from pflbench.data.dataset import load_dataset
from pflbench.errors import ConfigError
from pflbench.registry import ALGORITHMS
from pflbench.store.layout import SUMMARY_FILE
from pflbench.store.reader import read_json
from pflbench.store.writer import write_json
from pflbench.sweeps.grid import Grid, SweepRun, check_grid, expand_grid
from pflbench.sweeps.local import run_sweep
from pflbench.sweeps.parallel import die_with_parent, load_plugins
from pflbench.sweeps.record import sweep_record_path
from pflbench.sweeps.tune import TuneSettings, plan_studies, require_optuna, run_study
from pflbench.util.threads import threads_per_job

WORK_RECORD = "reference.json"


def scenario_base(scenario: Scenario, work: str | Path) -> RunConfig:
    """The shared RunConfig of the scenario's runs (``out``: ``WORK/<scenario>``)."""
    try:
        return RunConfig(**{**scenario.shared(), "out": str(Path(work) / scenario.name)})
    except TypeError as error:
        raise ConfigError(f"scenario {scenario.name} [run]: {error}") from None


def is_lora_only(algo: str) -> bool:
    """Whether the algorithm always trains LoRA adapters (FedSDG, FlexLoRA): it returns a rank
    even when ``--lora-rank`` is unset."""
    algorithm = ALGORITHMS.get(algo)
    hparams = hyperparameters_from(algorithm.hyperparameters, {}, algo)
    return lora.lora_rank(algorithm, RunConfig(algo=algo, lora_rank=None), hparams) is not None


def scenario_algorithms(scenario: Scenario, requested: tuple[str, ...] = ()) -> list[str]:
    """The scenario's algorithms (``non-lora``: every registered algorithm that is not LoRA-only,
    plugins included, so new algorithms join), less ``exclude``; ``requested`` (--algo) picks
    some of them, or names another registered algorithm (a plugin compared under the protocol)."""
    protocol = scenario.protocol
    if protocol.algos == ALGOS_NON_LORA:
        listed = [name for name in ALGORITHMS.names() if not is_lora_only(name)]
    else:
        for name in protocol.algos:  # an unknown name: one error naming it and the valid ones
            ALGORITHMS.get(name)
        listed = list(protocol.algos)
    listed = [name for name in listed if name not in protocol.exclude]
    if not requested:
        return listed
    for name in requested:
        ALGORITHMS.get(name)
    return list(dict.fromkeys(requested))


def refusals(scenario: Scenario, base: RunConfig, algos: list[str]) -> dict[str, str]:
    """Algorithm → why it refuses the scenario's settings (its cell planned and built once,
    without training: ``check_grid``), for the algorithms that do."""
    refused = {}
    for algo in algos:
        try:
            check_grid(expand_grid(base, _grid(scenario, algo, scenario.protocol.seeds[:1])))
        except ConfigError as error:
            refused[algo] = str(error)
    return refused


def pretrain_backbones(
    scenario: Scenario, base: RunConfig, algos: list[str], echo: Callable[[str], None], jobs: int = 1
) -> None:
    """The pretrained backbones the scenario's runs start from (LoRA runs: one per seed), built
    before any run: runs started at once (``--jobs``) would each train the same backbone;
    afterwards every run finds it in the cache. Distinct backbones are built ``jobs`` at a time,
    each in its own process with the thread count its cache key records (the same bits as one
    after another: measured ≈ 20 min each on one core, FMNIST's ViT, so three took an hour while
    the second core sat idle)."""
    configs: dict[str, RunConfig] = {}
    for algo in algos:
        algorithm = ALGORITHMS.get(algo)
        for cell in expand_grid(base, _grid(scenario, algo, scenario.protocol.seeds)):
            config = cell.config
            hparams = hyperparameters_from(algorithm.hyperparameters, dict(cell.algo_options), algo)
            if config.init_spec.pretrains(lora.is_lora_run(algorithm, config, hparams)):
                key = repr((config.dataset, config.model, config.model_option, config.public_frac, config.seed))
                configs.setdefault(key, config)
    width = min(jobs, len(configs))
    with contextlib.ExitStack() as stack:
        mapper: Callable[..., Any] = map
        if width > 1:
            context = multiprocessing.get_context("spawn")
            pool = ProcessPoolExecutor(width, mp_context=context, initializer=die_with_parent, initargs=(os.getpid(),))
            mapper = stack.enter_context(pool).map
        for config, (state, accuracy) in zip(configs.values(), mapper(build_backbone, configs.values())):
            echo(f"backbone {config.model} seed {config.seed}: {state}, held-back accuracy {accuracy:.4f}")


def build_backbone(config: RunConfig) -> tuple[str, float]:
    """One pretrained backbone (``pretrain_backbones``' unit, in this or a worker process):
    ("cached" or "pretrained", its held-back accuracy)."""
    from pflbench.data.partitioners import public_split
    from pflbench.models.pretrain import pretrain_backbone
    from pflbench.runs.prepare import resolve_device
    from pflbench.util.threads import apply_threads

    apply_threads(config.threads)  # the count its cache key records (bits differ by threads)
    dataset = load_dataset(config.dataset, config.dataset_options())
    _, public = public_split(dataset.labels.numpy(), float(config.public_frac or 0.0), config.seed)
    backbone = pretrain_backbone(config, dataset, public, resolve_device(config.device))
    return ("cached" if backbone.from_cache else "pretrained"), backbone.val_accuracy


def dataset_sha256(scenario: Scenario, base: RunConfig) -> str:
    """The content hash of the scenario's dataset as loaded (images and labels): two machines'
    references compare only when their data are the same bytes."""
    data = load_dataset(scenario.dataset, base.dataset_options())
    digest = hashlib.sha256()
    for tensor in (data.inputs, data.labels):
        digest.update(str((tuple(tensor.shape), str(tensor.dtype))).encode())
        digest.update(tensor.contiguous().cpu().numpy().tobytes())
    return digest.hexdigest()


@dataclasses.dataclass
class Cell:
    """One (algorithm, setting, seed) of the reference and the run that fills it (None: the tuned
    setting is not known yet: its study has no completed trial)."""

    algo: str
    setting: str
    seed: int
    run: SweepRun | None
    params: dict[str, Any]
    note: str = ""
    shipped: bool = False  # done elsewhere (an earlier session, another machine): its row is in the artifacts

    def status(self) -> str:
        if self.shipped:
            return "done"
        if self.run is None:
            return "missing"
        summary = self.run.run_dir / SUMMARY_FILE
        if not summary.is_file():
            return "failed" if self.run.status == "failed" else "missing"
        record = read_json(summary)
        status = record.get("status") if isinstance(record, dict) else None
        return "done" if status in (None, "completed", "ok") else str(status)

    def to_json(self) -> dict[str, Any]:
        return {
            "algo": self.algo,
            "setting": self.setting,
            "seed": self.seed,
            "run": None if self.run is None else self.run.name,
            "params": self.params,
            "status": self.status(),
            **({"note": self.note} if self.note else {}),
        }


def _grid(scenario: Scenario, algo: str, seeds: tuple[int, ...], params: dict[str, Any] | None = None) -> Grid:
    options = {**scenario.algo_options.get(algo, {}), **(params or {})}  # its variant, then tuned values
    axes = {name: (value,) for name, value in options.items()}
    return Grid((algo,), (scenario.dataset,), (scenario.alpha,), seeds, axes)


def tune_settings(scenario: Scenario) -> TuneSettings:
    p = scenario.protocol
    return TuneSettings(p.objective, p.trials, p.sampler, p.pruner, p.sampler_seed, default_trial=p.default_trial)


def algorithm_cells(
    scenario: Scenario,
    base: RunConfig,
    algo: str,
    jobs: int,
    plugins: tuple[str, ...],
    echo: Callable[[str], None],
    run: bool = True,
    at_once: int | None = None,
) -> tuple[list[Cell], dict[str, Any] | None]:
    """The algorithm's study (run to its budget when ``run``), then its default and tuned cells
    over the seeds, run as one sweep when ``run``. Returns the cells and the study record.

    ``jobs`` (``--jobs``) shares the threads out: each run and trial gets ``threads // jobs``, part
    of its identity; ``at_once`` final runs run at once (default ``jobs``; ``regenerate`` gives 1
    when it runs ``jobs`` algorithms at once). The study's trials run one after another at any
    ``jobs``: TPE proposes each trial having seen every earlier one, so the study, and with it the
    tuned row, is the same however many jobs regenerate it (trials run at once would make TPE
    propose with the "constant liar", and the study would depend on their completion order)."""
    seeds = scenario.protocol.seeds
    tune_base = dataclasses.replace(base, rounds=scenario.protocol.tune_rounds or base.rounds)
    (plan,) = plan_studies(tune_base, _grid(scenario, algo, seeds[:1]), {}, tune_settings(scenario))
    study: dict[str, Any] | None
    if run:
        check_grid([plan.cell])  # bad settings refuse before the first trial
        plan.base = dataclasses.replace(plan.base, threads=threads_per_job(plan.base.threads, jobs))
        study = run_study(plan, plugins, 1, echo)
    else:
        study = read_json(plan.path(".json")) if plan.path(".json").is_file() else None
    defaults = [
        Cell(algo, "default", r.config.seed, r, {}) for r in expand_grid(base, _grid(scenario, algo, seeds), jobs)
    ]
    grid = _grid(scenario, algo, seeds)

    def tuned_runs(params: dict[str, Any]) -> list[SweepRun]:
        return expand_grid(base, _grid(scenario, algo, seeds, params), jobs)

    params, rejected = choose_tuned(study, tuned_runs)
    if run:
        done: set[str] = set()
        while True:  # the defaults, the choice's runs; a choice that diverges gives way to the next
            runs = [c.run for c in defaults if c.run is not None] + (tuned_runs(params) if params is not None else [])
            todo = list({r.name: r for r in runs if r.name not in done}.values())  # tuned = default: once
            if todo:
                record = sweep_record_path(base.out, grid, base)
                run_sweep(todo, record, grid, base, plugins, _reporter(echo, todo), jobs=at_once or jobs)
                done.update(r.name for r in todo)
            following, rejected = choose_tuned(study, tuned_runs)
            if following == params:
                break
            echo(
                f"  {algo}: the tuned setting {params} diverged over the full schedule on seed {seeds[0]}; next: {following}"
            )
            params = following
    if study is not None and rejected:
        study = {**study, "rejected": rejected}
    if params is None:
        note = "its tuning study has no completed trial" if study else "not tuned yet"
        if study and rejected:
            note = "every completed trial's setting diverged over the full schedule"
        return defaults + [Cell(algo, "tuned", seed, None, {}, note) for seed in seeds], study
    return defaults + [Cell(algo, "tuned", r.config.seed, r, dict(params)) for r in tuned_runs(params)], study


@dataclasses.dataclass
class Regenerated:
    """One algorithm's part of a regeneration: its cells and study, or the error of an algorithm
    that refuses the scenario's settings (``ConfigError``), and the wall time it took."""

    index: int
    algo: str
    cells: list[Cell]
    study: dict[str, Any] | None
    error: str | None
    seconds: float


def regenerate(
    scenario: Scenario,
    base: RunConfig,
    todo: list[tuple[int, str]],
    jobs: int,
    plugins: tuple[str, ...],
    echo: Callable[[str], None],
) -> Iterator[Regenerated]:
    """Each (index, algorithm) of ``todo``: its study and cells (``algorithm_cells``), in the order
    they finish. ``jobs`` > 1 runs that many algorithms at once, each in its own spawned process
    running its trials and runs one after another; their lines come through this process's
    ``echo``. Measured on ``fmnist-dir0.1`` with one algorithm at a time and its trials and runs
    ``jobs`` at a time, the command took 0.65 of its runs' summed wall time on 2 jobs (0.5 is
    the floor): a study's last trial and an odd number of final runs leave a worker idle, for
    every algorithm; algorithms side by side leave one idle only at the end. One algorithm alone
    runs its final runs ``jobs`` at a time."""
    width = min(jobs, len(todo))
    if width <= 1:
        for index, algo in todo:
            yield _regenerate_one(scenario, base, index, algo, jobs, jobs, plugins, echo)
        return
    context = multiprocessing.get_context("spawn")
    lines = context.SimpleQueue()  # no feeder thread: a line is in the pipe before put() returns
    pool = ProcessPoolExecutor(
        width, mp_context=context, initializer=_algorithm_worker, initargs=(os.getpid(), lines, plugins)
    )
    submitted = {}
    for index, algo in todo:  # each worker's lines named by its algorithm
        future = pool.submit(
            _regenerate_one, scenario, base, index, algo, jobs, 1, plugins, partial(_echo_to_driver, algo)
        )
        submitted[future] = (index, algo)
    pending = set(submitted)
    try:
        while pending:
            finished, pending = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
            _drain(lines, echo)
            for future in finished:
                try:
                    yield future.result()
                except BrokenProcessPool:  # a worker killed (the OOM killer): the pool goes down with it
                    yield Regenerated(*submitted[future], [], None, WORKER_DIED, 0.0)
    except BaseException:
        # KeyboardInterrupt (Ctrl-C reaches the workers too; `kill -INT` only this process): the
        # workers' runs record themselves interrupted and resume next time
        pool.shutdown(wait=False, cancel_futures=True)
        for worker in multiprocessing.active_children():
            with contextlib.suppress(OSError):
                os.kill(worker.pid or 0, signal.SIGINT)
        raise
    finally:
        pool.shutdown(wait=True)
        _drain(lines, echo)
        lines.close()


def _regenerate_one(
    scenario: Scenario,
    base: RunConfig,
    index: int,
    algo: str,
    jobs: int,
    at_once: int,
    plugins: tuple[str, ...],
    echo: Callable[[str], None],
) -> Regenerated:
    started = time.monotonic()
    try:
        cells, study = algorithm_cells(scenario, base, algo, jobs, plugins, echo, at_once=at_once)
    except ConfigError as error:  # an algorithm that refuses the scenario's settings: the others go on
        return Regenerated(index, algo, [], None, str(error), time.monotonic() - started)
    return Regenerated(index, algo, cells, study, None, time.monotonic() - started)


WORKER_DIED = (
    "a worker process died (killed: out of memory?), taking the algorithms in flight with it; "
    "run the command again to resume them"
)
_LINES: Any = None  # an algorithm worker's queue of output lines to the driver


def _algorithm_worker(parent: int, lines: Any, plugins: tuple[str, ...]) -> None:
    global _LINES
    die_with_parent(parent)
    _LINES = lines
    load_plugins(plugins)


def _echo_to_driver(algo: str, line: str) -> None:
    """A worker's line, named by its algorithm (two algorithms' trials interleave)."""
    text = line.lstrip()
    _LINES.put(f"{line[: len(line) - len(text)]}{algo} | {text}")


def _drain(lines: Any, echo: Callable[[str], None]) -> None:
    while not lines.empty():
        echo(lines.get())


def choose_tuned(
    study: dict[str, Any] | None, tuned_runs: Callable[[dict[str, Any]], list[SweepRun]]
) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """The tuned setting: the study's best completed trial, unless its run over the full schedule
    on the trial seed diverged (a non-finite training loss: a training signal, no test number is
    read), then the next best, and so on. The trials run ``tune_rounds`` rounds, so a learning
    rate at the edge of stability can win them and diverge later (FedEM's first study: lr 0.383
    won and diverged on every seed). Returns (setting or None, the rejected ones with why)."""
    trials = [t for t in (study or {}).get("trials", []) if t.get("state") == "complete" and t.get("value") is not None]
    if study and study.get("best") and not trials:  # a summary without the trial list: its best only
        trials = [study["best"]]
    trials.sort(key=lambda t: (-t["value"], t["number"]))  # ties: the earlier trial, as the study's best
    rejected = []
    for trial in trials:
        params = dict(trial["params"])
        first = tuned_runs(params)[0]  # the trial seed's full-schedule run
        summary = read_json(first.run_dir / SUMMARY_FILE) if (first.run_dir / SUMMARY_FILE).is_file() else None
        if isinstance(summary, dict) and summary.get("status") == "diverged":
            rejected.append({"params": params, "value": trial["value"], "run": first.name, "why": "diverged"})
            continue
        return params, rejected
    return None, rejected


def shipped_runs(folder: str | Path) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """The shipped artifacts of a scenario folder: its manifest's finished runs by folder name, and
    ``hyperparameters.json`` (both empty when absent). The work folder is not kept between machines
    or sessions (it holds checkpoints); these files are, in git."""
    folder = Path(folder)
    manifest = read_json(folder / "manifest.json") if (folder / "manifest.json").is_file() else None
    hyper = read_json(folder / "hyperparameters.json") if (folder / "hyperparameters.json").is_file() else None
    runs = manifest.get("runs", []) if isinstance(manifest, dict) else []
    by_name = {r["run"]: r for r in runs if isinstance(r, dict) and isinstance(r.get("run"), str)}
    return by_name, hyper if isinstance(hyper, dict) else {}


def shipped_algorithm(
    scenario: Scenario, base: RunConfig, algo: str, folder: str | Path, jobs: int = 1
) -> tuple[list[Cell], dict[str, Any] | None] | None:
    """The algorithm's cells when the shipped artifacts already hold every one of them, run with
    today's code (each planned run folder — the default setting's, and the tuned setting's from the
    shipped tuned values — is in the manifest with today's code identity); else None (it runs).
    So a regeneration resumes across sessions and machines from what was committed, and an
    algorithm whose file changed runs again."""
    from pflbench.config.provenance import current_code_identity

    runs, hyper = shipped_runs(folder)
    tuned = ((hyper.get(algo) or {}).get("tuned") or {}) if isinstance(hyper.get(algo), dict) else {}
    params = tuned.get("params") if isinstance(tuned, dict) else None
    if not runs or not isinstance(params, dict) or not params and "study" not in tuned:
        return None
    seeds = scenario.protocol.seeds
    planned = [("default", r, {}) for r in expand_grid(base, _grid(scenario, algo, seeds), jobs)]
    planned += [("tuned", r, dict(params)) for r in expand_grid(base, _grid(scenario, algo, seeds, params), jobs)]
    if any((run_.run_dir / SUMMARY_FILE).is_file() for _, run_, _ in planned):
        return None  # its runs are in this work folder: the sweep reads them back (or finishes them)
    for setting, run_, _ in planned:
        entry = runs.get(run_.name)
        if entry is None or entry.get("setting") != setting and setting == "default":
            return None
        if entry.get("code") != current_code_identity(run_.config):
            return None
    cells = [Cell(algo, setting, r.config.seed, r, p, shipped=True) for setting, r, p in planned]
    return cells, tuned.get("study") if isinstance(tuned.get("study"), dict) else None


def shipped_cells(folder: str | Path) -> list[dict[str, Any]]:
    """The work record's cells of every finished run the shipped manifest lists (a fresh work folder
    starts from them, so an invocation for some algorithms keeps the others' shipped rows)."""
    runs, hyper = shipped_runs(folder)
    cells = []
    for name, entry in runs.items():
        if not all(k in entry for k in ("algo", "setting", "seed")):
            continue
        tuned = (hyper.get(entry["algo"]) or {}).get("tuned") if isinstance(hyper.get(entry["algo"]), dict) else None
        params = (tuned or {}).get("params", {}) if entry["setting"] == "tuned" else {}
        cells.append(
            {**{k: entry[k] for k in ("algo", "setting", "seed")}, "run": name, "params": params, "status": "done"}
        )
    return cells


def _reporter(echo: Callable[[str], None], runs: list[SweepRun]) -> Callable[[int, SweepRun, Any], None]:
    def report(index: int, run: SweepRun, summary: dict[str, Any] | None) -> None:
        if summary is not None:
            detail = f"done, pers_acc {summary.get('pers_acc', float('nan')):.4f}, {summary.get('wall_time_s', 0):.1f}s"
        elif run.status == "skipped":
            detail = "already finished"
        else:
            detail = f"{run.status} {run.error or ''}".strip()
        echo(f"  [{index + 1}/{len(runs)}] {run.describe()}: {detail}")

    return report


def work_record_path(base: RunConfig) -> Path:
    return Path(base.out) / WORK_RECORD


def write_work_record(
    scenario: Scenario,
    base: RunConfig,
    cells: list[Cell],
    sha256: str | None,
    studies: dict[str, Any],
    shipped: str | Path | None = None,
) -> dict[str, Any]:
    """``WORK/<scenario>/reference.json``: this invocation's cells merged over the earlier ones
    (the algorithms it did not touch keep their cells, unless the scenario's settings or
    protocol changed since: their runs are then of another scenario). A new work folder starts
    from the artifacts shipped in ``shipped`` (their manifest's finished runs), when they are of
    this scenario."""
    path = work_record_path(base)
    previous = read_json(path) if path.is_file() else {}
    if not previous and shipped is not None:
        manifest = Path(shipped) / "manifest.json"
        record = read_json(manifest) if manifest.is_file() else None
        if isinstance(record, dict) and record.get("scenario_identity") == scenario.identity():
            hyper = (
                read_json(Path(shipped) / "hyperparameters.json")
                if (Path(shipped) / "hyperparameters.json").is_file()
                else {}
            )
            previous = {
                "scenario_identity": scenario.identity(),
                "dataset_sha256": record.get("dataset_sha256"),
                "studies": {
                    a: h["tuned"]["study"]
                    for a, h in (hyper if isinstance(hyper, dict) else {}).items()
                    if isinstance(h, dict) and isinstance(h.get("tuned"), dict) and h["tuned"].get("study")
                },
                "cells": shipped_cells(shipped),
            }
    if (previous or {}).get("scenario_identity") != scenario.identity():  # the scenario changed: start afresh
        previous = {}
    touched = {c.algo for c in cells}
    kept = [c for c in (previous or {}).get("cells", []) if c.get("algo") not in touched]
    record = {
        "scenario": scenario.name,
        "scenario_identity": scenario.identity(),
        "run": {k: list(v) if isinstance(v, tuple) else v for k, v in scenario.run.items()},
        "protocol": scenario.protocol.budget(),
        "dataset_sha256": sha256 or (previous or {}).get("dataset_sha256"),
        "studies": {**(previous or {}).get("studies", {}), **studies},
        "cells": kept + [c.to_json() for c in cells],
    }
    write_json(path, record)
    return record


def study_summary(study: dict[str, Any] | None) -> dict[str, Any] | None:
    """What the artifacts keep of a study record: the chosen setting, its validation value, the
    space and the trial states (no per-round values)."""
    if not study:
        return None
    states: dict[str, int] = {}
    for trial in study.get("trials", []):
        states[trial["state"]] = states.get(trial["state"], 0) + 1
    return {
        "study": study.get("study"),
        "space": study.get("space"),
        "objective": study.get("objective"),
        "selected_on": study.get("selected_on"),
        "trials_asked": study.get("trials_asked"),
        "trial_states": states,
        "best": study.get("best"),
        # settings that won the study but diverged over the full schedule (``choose_tuned``)
        **({"rejected": study["rejected"]} if study.get("rejected") else {}),
    }


def check_optuna() -> None:
    require_optuna()
