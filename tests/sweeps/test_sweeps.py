"""Sweeps: grid expansion (pure), and a real tiny sweep that records failures, shares partitions
and client sequences across algorithms, skips finished runs on rerun and resumes after Ctrl-C."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from pflbench.cli import cli
from pflbench.config.run_config import RunConfig
from pflbench.errors import ConfigError
from pflbench.store.reader import RunFolderWarning, load_runs
from pflbench.sweeps import local as sweep
from pflbench.sweeps import one as sweep_one
from pflbench.sweeps.grid import Grid, expand_grid, parse_sets, parse_value
from pflbench.sweeps.local import run_sweep
from pflbench.sweeps.record import sweep_record_path

BASE = RunConfig(model="mlp", num_clients=4, rounds=2, out="unused")
TINY = ["--model", "mlp", "--num-clients", "4", "--rounds", "2", "--quiet"]


def grid(**axes: tuple[str, ...]) -> Grid:
    return Grid(("fedavg", "fedprox"), ("digits",), (0.1, 1.0), (0, 1), dict(axes))


def test_hyperparameter_axis_multiplies_only_its_algorithms() -> None:
    runs = expand_grid(BASE, grid(mu=("0.01", "0.1"), lr=("0.01", "0.05")))
    fedavg = [r for r in runs if r.config.algo == "fedavg"]
    fedprox = [r for r in runs if r.config.algo == "fedprox"]
    assert len(fedavg) == 2 * 2 * 2 and len(fedprox) == 2 * 2 * 2 * 2
    assert all(r.algo_options == {} for r in fedavg)
    assert {r.algo_options["mu"] for r in fedprox} == {0.01, 0.1}
    assert {r.config.lr for r in runs} == {0.01, 0.05} and all(isinstance(r.config.lr, float) for r in runs)
    assert len({r.name for r in runs}) == len(runs)
    assert fedprox[0].overrides == {"lr": 0.01, "mu": 0.01}


def test_grid_keeps_shared_options_and_runs_all_algorithms_per_seed() -> None:
    runs = expand_grid(BASE, Grid(("fedavg", "fedper"), ("digits",), (0.5,), (3, 4), {"local_epochs": ("1", "5")}))
    assert [(r.config.seed, r.config.local_epochs, r.config.algo) for r in runs[:4]] == [
        (3, 1, "fedavg"),
        (3, 1, "fedper"),
        (3, 5, "fedavg"),
        (3, 5, "fedper"),
    ]
    assert all(r.config.model == "mlp" and r.config.rounds == 2 for r in runs)


@pytest.mark.parametrize(
    "axes, message",
    [
        ({"nope": ("1",)}, "'nope' is neither a run option nor a hyperparameter of fedavg, fedprox"),
        ({"head_epochs": ("2",)}, "hyperparameter of fedavg, fedprox; hyperparameters: mu (fedprox)"),
        ({"local_epochs": ("1.5",)}, "--set local_epochs: '1.5' is not a valid int"),
        ({"optimizer": ("rmsprop",)}, "--set optimizer: 'rmsprop' is not one of: sgd, adam"),
        ({"lr": ("-1",)}, "--lr must be a finite number > 0"),
        ({"mu": ("-1",)}, "--mu must be ≥ 0"),
    ],
)
def test_bad_axes_are_config_errors(axes: dict[str, tuple[str, ...]], message: str) -> None:
    with pytest.raises(ConfigError) as error:
        expand_grid(BASE, grid(**axes))
    assert message in str(error.value)


def test_parse_sets_and_values() -> None:
    assert parse_sets(["mu=0.01, 0.1,0.01", "--local-epochs=1"]) == {"mu": ("0.01", "0.1"), "local_epochs": ("1",)}
    for bad, message in (["mu"], "is not NAME=VALUE"), (["alpha=0.1"], "use --alphas"), (["out=x"], "shared"):
        with pytest.raises(ConfigError, match=message):
            parse_sets(bad)
    assert parse_value("none", float | None, "max_grad_norm") is None
    assert parse_value("2.5", float | None, "max_grad_norm") == 2.5
    assert parse_value("shape=1x8x8", tuple[str, ...], "dataset_option") == ("shape=1x8x8",)


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.output


def test_sweep_records_failures_shares_partitions_and_skips_on_rerun(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    args = [
        "sweep",
        "--algos",
        "fedavg,fedprox",
        "--seeds",
        "0,1",
        "--alphas",
        "0.3",
        "--frac",
        "0.5",
        "--set",
        "num_clients=4,400",
        "--set",
        "mu=0.1",
        "--model",
        "mlp",
        "--rounds",
        "2",
        "--quiet",
        "--out",
        str(tmp_path),
    ]
    # an impossible partition in one cell refuses the whole grid up front, before any folder
    code, output = invoke(*args)
    assert code == 2 and "400 clients" in output and output.count("\n") == 1, output
    assert not any(tmp_path.iterdir())
    args[args.index("num_clients=4,400")] = "num_clients=4,5"
    real_run_one = sweep.run_one

    def fail_with_5_clients(run, plugins):
        if run.config.num_clients == 5:
            raise RuntimeError("5 clients broke it")
        return real_run_one(run, plugins)

    monkeypatch.setattr(sweep, "run_one", fail_with_5_clients)
    code, output = invoke(*args)
    assert code == 1, output
    assert "4 done, 0 skipped (already finished), 0 skipped (running elsewhere), 0 diverged, 4 failed" in output
    runs = tmp_path / "runs"
    failed = sorted(p for p in runs.iterdir() if (p / "error.json").is_file())
    assert len(failed) == 4 and not any((p / "summary.json").exists() for p in failed)
    error = json.loads((failed[0] / "error.json").read_text())
    assert error["error_type"] == "RuntimeError" and "5 clients" in error["message"]
    assert "Traceback" in error["traceback"] and error["config"]["num_clients"] == 5
    (record,) = (tmp_path / "sweeps").iterdir()
    statuses = [r["status"] for r in json.loads(record.read_text())["runs"]]
    assert sorted(statuses) == ["done"] * 4 + ["failed"] * 4

    def files(algo: str, seed: int) -> tuple[str, list[list[int]]]:
        (folder,) = [p for p in runs.glob(f"{algo}__digits__a0.3__s{seed}__*") if (p / "summary.json").exists()]
        clients = [json.loads(line)["clients"] for line in (folder / "rounds.jsonl").read_text().splitlines()]
        return (folder / "partition.json").read_text(), clients

    assert files("fedavg", 0) == files("fedprox", 0) and files("fedavg", 1) == files("fedprox", 1)
    assert files("fedavg", 0) != files("fedavg", 1)
    mtimes = {p: (p / "summary.json").stat().st_mtime_ns for p in runs.iterdir() if (p / "summary.json").exists()}

    code, output = invoke(*args)
    assert (
        code == 1
        and "0 done, 4 skipped (already finished), 0 skipped (running elsewhere), 0 diverged, 4 failed" in output
    ), output
    assert {p: (p / "summary.json").stat().st_mtime_ns for p in mtimes} == mtimes
    assert len(list((tmp_path / "sweeps").iterdir())) == 2


@pytest.mark.parametrize(
    "args, message",
    [
        (["--set", "nope=1"], "'nope' is neither a run option"),
        (["--mu", "0.1", "--set", "mu=0.2", "--algos", "fedprox"], "--mu and --set mu are both given"),
        (["--lr", "0.1", "--set", "lr=0.2"], "--lr and --set lr are both given"),
        (["--seeds", "0,x"], "--seeds: 'x' is not a valid int"),
        (["--algos", "fedavgg"], "unknown algorithm 'fedavgg'"),
    ],
)
def test_sweep_bad_input_is_one_error_line(tmp_path: Path, args: list[str], message: str) -> None:
    code, output = invoke("sweep", *args, *TINY, "--out", str(tmp_path))
    assert code == 2 and message in output and output.count("\n") == 1, output
    assert not (tmp_path / "runs").exists()


def test_interrupted_sweep_resumes_with_only_the_missing_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    base = RunConfig(model="mlp", num_clients=3, rounds=2, out=str(tmp_path))
    the_grid = Grid(("fedavg",), ("digits",), (0.5,), (0, 1))
    real_execute = sweep_one.execute

    def ctrl_c_in_seed_1(prepared, on_round=None, plugins=(), **flags):
        def stop(record: dict) -> None:
            raise KeyboardInterrupt

        return real_execute(prepared, stop if prepared.config.seed == 1 else on_round, plugins, **flags)

    monkeypatch.setattr(sweep_one, "execute", ctrl_c_in_seed_1)
    runs = expand_grid(base, the_grid)
    record = sweep_record_path(base.out, the_grid, base)
    with pytest.raises(KeyboardInterrupt):
        run_sweep(runs, record, the_grid, base)
    assert [r.status for r in runs] == ["done", "interrupted"]
    assert [r["status"] for r in json.loads(record.read_text())["runs"]] == ["done", "interrupted"]
    partial = runs[1].run_dir.with_name(".tmp-" + runs[1].name)  # unfinished: only the work folder
    assert (partial / "rounds.jsonl").read_text().count("\n") == 1 and not runs[1].run_dir.exists()
    with pytest.warns(RunFolderWarning, match="unfinished run"):
        assert load_runs(tmp_path)["run"].nunique() == 1

    monkeypatch.setattr(sweep_one, "execute", real_execute)
    runs = expand_grid(base, the_grid)
    run_sweep(runs, record, the_grid, base)
    assert [r.status for r in runs] == ["skipped", "done"]
    assert (runs[1].run_dir / "summary.json").is_file() and not partial.exists()


def test_lora_grid_gives_every_run_the_lora_defaults_unless_set() -> None:
    from pflbench.config.lora import RUN_DEFAULTS as LORA_RUN_DEFAULTS

    grid = Grid(["fedavg", "fedsdg"], ["digits"], [0.5], [0], {})
    runs = expand_grid(RunConfig(lr=0.05), grid)
    assert {r.config.algo for r in runs} == {"fedavg", "fedsdg"}
    for run in runs:  # same model and same public hold-out (client data) for both algorithms
        assert run.config.model == LORA_RUN_DEFAULTS["model"]
        assert run.config.public_frac == LORA_RUN_DEFAULTS["public_frac"]
        assert run.config.lr == 0.05  # explicit options are kept
    plain = expand_grid(RunConfig(), Grid(["fedavg", "fedprox"], ["digits"], [0.5], [0], {}))
    assert all(r.config.model == "cnn" and r.config.public_frac == 0.0 for r in plain)


def test_flexlora_grid_with_a_lora_rank_resolves_like_the_run(tmp_path) -> None:
    """Defect: the grid used the default hyperparameters to decide the rank (--rank-dist homo)."""
    from pflbench.runs.prepare import prepare

    base = RunConfig(lora_rank=8, rounds=2, out=str(tmp_path))
    (run,) = expand_grid(base, Grid(["flexlora"], ["digits"], [0.5], [0], {"rank_dist": ("homo",)}))
    single = prepare(RunConfig(algo="flexlora", lora_rank=8, rounds=2, out=str(tmp_path)), {"rank_dist": "homo"})
    assert run.config == single.config and run.run_dir == single.run_dir
    with pytest.raises(ConfigError, match="--lora-rank is the rank of --rank-dist homo"):
        expand_grid(base, Grid(["flexlora"], ["digits"], [0.5], [0], {}))


def test_the_sweep_record_is_rewritten_at_a_bounded_rate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Resuming a finished 300-run sweep (every run skipped in well under a second) rewrites the
    record twice (start and end), not 301 times: the bytes written stay proportional."""
    from pflbench.sweeps import record as record_module

    base = RunConfig(model="mlp", num_clients=3, rounds=1, out=str(tmp_path))
    the_grid = Grid(("fedavg",), ("digits",), (0.5,), tuple(range(300)))
    runs = expand_grid(base, the_grid)
    for run in runs:  # finished runs: the sweep skips them
        run.run_dir.mkdir(parents=True)
        (run.run_dir / "summary.json").write_text("{}")
    writes = []
    real = record_module.write_json
    monkeypatch.setattr(record_module, "write_json", lambda path, data: (writes.append(path), real(path, data)))
    path = sweep_record_path(base.out, the_grid, base)
    run_sweep(runs, path, the_grid, base)
    assert {r.status for r in runs} == {"skipped"} and len(writes) == 2
    assert json.loads(path.read_text())["counts"]["skipped"] == 300


def test_a_portable_sweep_record_names_no_local_path(tmp_path: Path) -> None:
    code, output = invoke("sweep", *TINY, "--rounds", "1", "--portable", "--out", str(tmp_path))
    assert code == 0, output
    (record,) = (tmp_path / "sweeps").iterdir()
    text = record.read_text()
    assert str(tmp_path) not in text and f"<local>/{tmp_path.name}" in text
