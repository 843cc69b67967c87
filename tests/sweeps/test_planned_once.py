"""One plan from command to folder: a sweep plans each cell once (when the grid is expanded), and
its preflight and its run take that plan; the run identity is computed once per run; a cell
sent to a worker process travels without its plan, with the values the plan filled in."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from pflbench.config.run_config import RunConfig
from pflbench.runs import prepare as prepare_module
from pflbench.runs.prepared import RunIdentity
from pflbench.store.reader import read_json
from pflbench.sweeps import grid as grid_module
from pflbench.sweeps.grid import Grid, check_grid, expand_grid
from pflbench.sweeps.one import run_one


def test_a_sweep_plans_each_cell_once_and_names_it_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    planned: list[str] = []
    identities: list[str] = []
    plan_run, identity_of = prepare_module.plan_run, RunIdentity.of.__func__

    def counting_plan(config: RunConfig, *args: object, **kwargs: object) -> prepare_module.RunPlan:
        planned.append(config.algo)
        return plan_run(config, *args, **kwargs)  # type: ignore[arg-type]

    def counting_identity(cls: type[RunIdentity], config: RunConfig, *args: object) -> RunIdentity:
        identities.append(config.algo)
        return identity_of(cls, config, *args)

    monkeypatch.setattr(prepare_module, "plan_run", counting_plan)
    monkeypatch.setattr(grid_module, "plan_run", counting_plan)
    monkeypatch.setattr(RunIdentity, "of", classmethod(counting_identity))
    base = RunConfig(model="mlp", num_clients=3, rounds=1, out=str(tmp_path))
    runs = expand_grid(base, Grid(("fedavg", "fedper"), ("digits",), (0.5,), (0,)))
    check_grid(runs)
    summaries = [run_one(run, ()) for run in runs]
    assert sorted(planned) == ["fedavg", "fedper"] and sorted(identities) == ["fedavg", "fedper"]
    for run, summary in zip(runs, summaries):
        assert Path(summary["run_dir"]) == run.run_dir and run.plan is not None
        config = read_json(run.run_dir / "config.json")
        assert config["identity_hash"] == run.plan.identity.hash and run.name == run.plan.identity.name
        assert config["resolved"]["run_defaults"] == run.plan.applied  # what this cell's plan filled in


def test_a_cell_travels_to_a_worker_without_its_plan() -> None:
    base = RunConfig(num_clients=3, rounds=1, out="unused")
    (run,) = expand_grid(base, Grid(("fedavg",), ("digits",), (0.5,), (0,)))
    assert run.plan is not None and run.plan.applied  # the model, lr, ... filled in
    copy = pickle.loads(pickle.dumps(run))
    assert copy.plan is None and copy.applied == run.plan.applied
    again = copy.planned()  # the worker's one plan
    assert again.config == run.plan.config and again.applied == run.plan.applied
    assert again.identity == run.plan.identity
