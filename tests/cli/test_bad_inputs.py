"""Every bad input is one clear error before any expensive work: exit code 2,
exactly one ``Error:`` line on stderr naming the bad value, no traceback, nothing written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from pflbench.cli import cli

RUN = ["run", "--dataset", "digits", "--model", "mlp", "--num-clients", "3", "--rounds", "1", "--quiet"]
SWEEP = ["sweep", "--datasets", "digits", "--model", "mlp", "--num-clients", "3", "--rounds", "1", "--quiet"]
PARTITION = ["partition", "--dataset", "digits", "--num-clients", "3"]
VIT = ["--model", "vit_tiny_patch16_224", "--backbone", "random"]

# (arguments, a piece of the expected message). OUT = a fresh folder, FILE = an existing file,
# RESULTS = a folder holding one finished run.
CASES = [
    # run: values
    (RUN + ["--seed", "-1"], "--seed must be ≥ 0"),
    (RUN + ["--lr", "nan"], "--lr must be a finite number"),
    (RUN + ["--lr", "-1"], "--lr must be a finite number > 0"),
    (RUN + ["--rounds", "0"], "--rounds must be ≥ 1"),
    (RUN + ["--frac", "1.5"], "--frac must be in (0, 1]"),
    (RUN + ["--batch-size", "0"], "--batch-size must be ≥ 1"),
    (RUN + ["--test-frac", "1"], "--test-frac must be in (0, 1)"),
    (RUN + ["--val-frac", "0.8"], "--val-frac 0.8 + --test-frac 0.25 = 1.05 leaves no training samples"),
    (RUN + ["--val-frac", "-0.1"], "--val-frac must be in [0, 1)"),
    (RUN + ["--new-clients", "1"], "--new-clients must be a fraction in [0, 1)"),
    (RUN + ["--new-clients", "0.9"], "--new-clients 0.9 holds out 3 of 3 clients, leaving none to train"),
    (SWEEP + ["--algos", "fedavg", "--set", "new_clients=0.2,0.9"], "holds out 3 of 3 clients"),
    (PARTITION + ["--val-frac", "0.75"], "--val-frac 0.75 + --test-frac 0.25 = 1 leaves no training samples"),
    (RUN + ["--lora-rank", "0"], "--lora-rank must be ≥ 1"),
    (RUN + ["--checkpoint-every", "-1"], "--checkpoint-every must be ≥ 0"),
    (RUN + ["--algo", "nope"], "nope"),
    (RUN + ["--dataset", "nope"], "nope"),
    (RUN[:5] + ["--model", "nope"], "unknown model 'nope'"),
    (RUN + ["--device", "cuda:7"], "--device"),
    (RUN + ["--weights", "/nonexistent/w.pt"], "--weights"),
    (RUN + ["--plugin", "/nonexistent/p.py"], "--plugin"),
    (RUN + ["--algo", "flexlora", "--rank-dist", "1,2,3,4"], "--rank-dist lists 4 ranks for 3 clients"),
    (RUN + ["--algo", "fedsdg", "--momentum", "0.9"], "--momentum"),
    (RUN + ["--algo", "fedavg", "--head-epochs", "2"], "--head-epochs"),
    # run: the session's new options (benchmarks/probe_bad_inputs.py NEW_OPTION_CASES)
    (RUN + ["--feature-shift", ",,"], "--feature-shift ',,' names no transform"),
    (RUN + ["--straggler-model", "lognormal", "--straggler-sigma", "1e308"], "--straggler-sigma must be in [0, 20]"),
    (RUN + ["--over-select", "1e308"], "--over-select must be ≥ 0 (0 = off) and ≤ 100, got 1e+308"),
    (RUN + ["--algo", "apfl", "--no-adaptive-alpha", "--alpha-lr", "0.1"], "--alpha-lr 0.1 would be ignored"),
    (RUN + ["--algo", "fedavgm", "--server-lr", "inf"], "--server-lr must be a finite number > 0, got inf"),
    (RUN + ["--algo", "fedprox", "--mu", "inf"], "--mu must be ≥ 0 (a finite number), got inf"),
    (RUN + ["--algo", "ifca", "--clusters", str(10**20)], "is more than the 3 clients"),
    (RUN + ["--algo", "lgfedavg", "--warmup-rounds", "5"], "--warmup-rounds 5 leaves no LG-FedAvg round"),
    (RUN + ["--algo", "perfedavg", "--variant", "fo", "--hvp", "finite-difference"], "--hvp finite-difference would"),
    (RUN + ["--algo", "perfedavg", "--hvp-delta", "0.01"], "--hvp-delta 0.01 would be ignored: --hvp exact"),
    (RUN + ["--algo", "fedkd", "--compression", "none", "--energy-end", "0.9"], "--energy-end 0.9 would be ignored"),
    # run: dataset and model options
    (RUN + ["--dataset-option", "noequals"], "--dataset-option 'noequals' is not KEY=VALUE"),
    (RUN + ["--dataset-option", "bogus=1"], "has no option 'bogus'"),
    (RUN + ["--dataset", "synthetic", "--dataset-option", "num_samples=abc"], "--dataset-option"),
    (RUN + ["--dataset", "synthetic", "--dataset-option", "shape=3xfoo"], "--dataset-option"),
    (RUN + ["--dataset", "synthetic", "--dataset-option", "num_classes=-2"], "--dataset-option"),
    (RUN[:5] + ["--model", "mlp", "--model-option", "hidden=-5"], "--model-option"),
    (RUN[:5] + ["--model", "mlp", "--model-option", "hidden=abc"], "--model-option"),
    (RUN[:5] + ["--model", "mlp", "--model-option", "width=3"], "--model-option"),
    (RUN[:5] + VIT + ["--model-option", "embed_dim=65", "--model-option", "num_heads=4"], "--model-option"),
    (RUN[:5] + VIT + ["--model-option", "depth=abc"], "--model-option"),
    # run: options the run would ignore
    (RUN + ["--optimizer", "adam", "--momentum", "0.9"], "--momentum 0.9 would be ignored"),
    (RUN + ["--lora-alpha", "8"], "--lora-alpha 8.0 would be ignored"),
    (RUN + ["--lora-targets", "fc1"], "--lora-targets fc1 would be ignored"),
    (RUN + ["--shards-per-client", "3"], "--shards-per-client 3 would be ignored"),
    (RUN + ["--partition", "iid", "--alpha", "0.1"], "--alpha 0.1 would be ignored"),
    (RUN + ["--head-layers", "2"], "--head-layers 2 would be ignored"),
    (RUN + ["--threads", "100000"], "--threads must be in [0, 1024]"),
    (RUN + ["--device", "mps"], "MPS (Apple GPU) is not available on this machine"),
    (RUN + ["--pretrain-epochs", "5"], "--pretrain-epochs 5 would be ignored"),
    (RUN + ["--ray-workers", "4"], "--ray-workers 4 would be ignored: --executor sequential starts no Ray actors"),
    (RUN + ["--ray-address", "auto"], "--ray-address auto would be ignored: --executor sequential joins no Ray"),
    (RUN + ["--mlflow-uri", "sqlite:///x.db"], "--mlflow-uri sqlite:///x.db would be ignored"),
    (RUN + ["--log", "tensorboard", "--mlflow-uri", "sqlite:///x.db"], "without --log mlflow"),
    (SWEEP + ["--algos", "fedavg", "--ray-workers", "2"], "--ray-workers 2 would be ignored"),
    (SWEEP + ["--algos", "fedavg", "--set", "optimizer=adam", "--set", "momentum=0.9"], "leave it out of --set"),
    (SWEEP + ["--algos", "perfedavg", "--set", "variant=fo", "--set", "hvp=finite-difference"], "--hvp finite-differ"),
    # run: outputs
    (RUN + ["--out", "FILE"], "cannot write FILE: it is a file"),
    (RUN + ["--out", "FILE/below"], "cannot write FILE/below"),
    (RUN + ["--out", "/proc/pflbench-out"], "cannot write /proc/pflbench-out"),
    (RUN + ["--out", "RESULTS"], "cannot write RESULTS/runs: it is a file"),
    # sweep
    (SWEEP + ["--seeds", "-1"], "--seed must be ≥ 0"),
    (SWEEP + ["--alphas", "0"], "--alpha must be a finite number > 0"),
    (SWEEP + ["--set", "lr=abc"], "--set lr: 'abc' is not a valid float"),
    (SWEEP + ["--out", "FILE"], "cannot write FILE"),
    (SWEEP + ["--dataset-option", "bogus=1"], "has no option 'bogus'"),
    (SWEEP + ["--model-option", "hidden=-5"], "--model-option"),
    (SWEEP + ["--algos", "fedavg,fedper", "--lora-alpha", "8"], "--lora-alpha 8.0 would be ignored"),
    (SWEEP + ["--algos", "fedavg", "--num-clients", "900"], "clients"),
    # partition
    (PARTITION + ["--seed", "-1"], "--seed must be ≥ 0"),
    (PARTITION + ["--num-clients", "0"], "--num-clients must be ≥ 1"),
    (PARTITION + ["--shards-per-client", "3"], "--shards-per-client 3 would be ignored"),
    (PARTITION + ["--save", "FILE/below.json"], "cannot write FILE/below.json"),
    (PARTITION + ["--export", "/proc/pflbench.json"], "cannot write /proc/pflbench.json"),
    (PARTITION + ["--plot", "RESULTS"], "RESULTS"),
    (PARTITION + ["--dataset-option", "bogus=1"], "has no option 'bogus'"),
    # leaderboard
    (["leaderboard", "/nonexistent/results"], "/nonexistent/results"),
    (["leaderboard", "RESULTS", "--output", "/dev/full"], "cannot write /dev/full"),
    (["leaderboard", "RESULTS", "--output", "FILE/below.md"], "cannot write FILE/below.md"),
    (["leaderboard", "RESULTS", "--plots", "FILE"], "FILE"),
    (["leaderboard", "RESULTS", "--format", "nope"], "nope"),
    (["leaderboard", "RESULTS", "--format", "all"], "--output"),
    # pretrain
    (["pretrain", "--dataset", "digits", "--seed", "-1"], "--seed must be ≥ 0"),
    (["pretrain", "--dataset", "digits", "--public-frac", "0"], "--public-frac must be > 0"),
    (["pretrain", "--dataset", "nope"], "nope"),
    (["pretrain", "--dataset", "digits", "--model-option", "depth=abc"], "--model-option"),
    (["pretrain", "--dataset", "digits", "--pretrain-epochs", "0"], "--pretrain-epochs must be ≥ 1"),
    # list
    (["list", "nope"], "nope"),
    (["list", "--plugin", "/nonexistent/p.py"], "--plugin"),
    (["list", "--plugin", "RAISES"], "failed to import: RuntimeError: boom"),
    (RUN + ["--plugin", "EXITS"], "called sys.exit(3)"),
    (SWEEP + ["--plugin", "RAISES"], "failed to import"),
]


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A results folder (the leaderboard refuses bad outputs before reading any run)."""
    folder = tmp_path_factory.mktemp("results")
    (folder / "runs").write_text("a file where the runs folder should be")
    return folder


def snapshot(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.mark.parametrize("args, message", CASES, ids=[" ".join(a[:1] + a[-2:]) for a, _ in CASES])
def test_bad_input_is_one_error_line(
    args: list[str], message: str, tmp_path: Path, results: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    file = tmp_path / "a-file"
    file.write_text("not a folder")
    out = tmp_path / "out"
    (tmp_path / "raises.py").write_text("raise RuntimeError('boom')\n")
    (tmp_path / "exits.py").write_text("import sys\nsys.exit(3)\n")
    names = {
        "FILE": str(file),
        "OUT": str(out),
        "RESULTS": str(results),
        "RAISES": str(tmp_path / "raises.py"),
        "EXITS": str(tmp_path / "exits.py"),
    }

    def fill(text: str) -> str:
        for key, value in names.items():
            text = text.replace(key, value)
        return text

    args = [fill(a) for a in args]
    if "--log" in args:  # a tracker's library is an extra (pip install 'pflbench[tensorboard]')
        pytest.importorskip(args[args.index("--log") + 1], reason="the tracker's extra is not installed")
    if "run" in args[:1] or "sweep" in args[:1]:
        args = args + (["--out", str(out)] if "--out" not in args else [])
    before, results_before = snapshot(tmp_path), snapshot(results)
    result = CliRunner().invoke(cli, args)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.exit_code == 2, (result.exit_code, result.output)
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    assert fill(message) in lines[0], lines[0]
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert snapshot(tmp_path) == before, "something was written"
    assert snapshot(results) == results_before
    assert not out.exists()
    assert not os.path.exists("/proc/pflbench-out")
    assert result.stdout == "", "nothing may be printed before the error"


def test_table_is_large_enough() -> None:
    commands = {args[0] for args, _ in CASES}
    assert len(CASES) >= 30 and commands == {"run", "sweep", "partition", "leaderboard", "pretrain", "list"}


def test_disk_full_during_a_run_is_one_error_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import errno

    from pflbench.store.writer import RunWriter

    def full(self, record):
        raise OSError(errno.ENOSPC, "No space left on device", str(self.run_dir / "rounds.jsonl"))

    monkeypatch.setattr(RunWriter, "write_round", full)
    result = CliRunner().invoke(cli, RUN + ["--out", str(tmp_path)])
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert lines[0].startswith("Error: cannot write ") and "rounds.jsonl: No space left on device" in lines[0]
    runs = tmp_path / "runs"
    assert not any((p / "summary.json").exists() for p in runs.iterdir() if p.is_dir())
    assert not list(runs.glob("*.claim"))


def test_an_unknown_algorithm_points_at_plugin_files() -> None:
    result = CliRunner().invoke(cli, ["run", "--algo", "fedavgx", "--dataset", "digits"])
    assert result.exit_code == 2 and "did you mean 'fedavg" in result.output and "--plugin FILE" in result.output


def test_ctrl_c_exits_130_and_says_how_to_resume(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import pflbench.cli.run as run_module

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(run_module, "_execute_with_progress", interrupted)
    result = CliRunner().invoke(
        cli, ["run", "--dataset", "digits", "--model", "mlp", "--rounds", "1", "--out", str(tmp_path)]
    )
    assert result.exit_code == 130 and "--resume" in result.output, result.output


def test_shards_per_client_zero_and_a_hyperparameter_without_help_are_one_clear_line(tmp_path: Path) -> None:
    args = ["run", "--dataset", "digits", "--partition", "shards", "--shards-per-client", "0", "--out", str(tmp_path)]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2 and "--shards-per-client must be ≥ 1, got 0" in result.output, result.output
    plugin = tmp_path / "nohelp.py"
    plugin.write_text(
        "from dataclasses import dataclass\nfrom pflbench import Algorithm, register_algorithm\n\n\n"
        "@dataclass(frozen=True)\nclass H:\n    rho: float = 0.1\n\n\n"
        '@register_algorithm("nohelp")\nclass NoHelp(Algorithm):\n    """x"""\n\n    hyperparameters = H\n'
    )
    # in a fresh interpreter: a registered algorithm without help texts breaks every later command
    code = "import sys; from pflbench.cli import main; sys.argv[0] = 'pflbench'; main()"
    args = ["run", "--plugin", str(plugin), "--algo", "nohelp", "--out", str(tmp_path)]
    result = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, check=False)
    assert result.returncode == 2 and "option --rho has no help text" in result.stderr, result.stderr
    assert result.stderr.count("\n") == 1 and not (tmp_path / "runs").exists()


def test_a_hyperparameter_is_refused_only_where_no_run_of_the_grid_reads_it(tmp_path: Path) -> None:
    """Algorithm.inert_hyperparameters: --hvp is read by the grid's hf runs, so a dry run accepts it;
    under --variant fo alone it would be ignored, so it is refused (exit 2, one line, nothing written)."""
    base = [*SWEEP, "--algos", "perfedavg", "--set", "hvp=finite-difference", "--out", str(tmp_path / "out")]
    mixed = CliRunner().invoke(cli, [*base, "--set", "variant=fo,hf", "--dry-run"])
    assert mixed.exit_code == 0, mixed.output
    only_fo = CliRunner().invoke(cli, [*base, "--set", "variant=fo"])
    lines = [line for line in only_fo.stderr.splitlines() if line.strip()]
    assert only_fo.exit_code == 2 and len(lines) == 1, only_fo.output
    assert lines[0].startswith("Error: --hvp finite-difference would be ignored") and "of --set" in lines[0]
    assert not (tmp_path / "out").exists()
