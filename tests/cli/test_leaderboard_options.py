"""``pflbench leaderboard`` options for papers from the command line and a config file:
--metrics, --target, --select-by (and its refusals), --order, --precision, --caption, and
--plugin for ``leaderboard`` and ``partition`` (in a fresh interpreter: the example plugins
must not be registered already)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from pflbench.cli import cli

ROOT = Path(__file__).resolve().parents[2]


def _module(path: Path):
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


make_run = _module(ROOT / "tests" / "report" / "fake_runs.py").make_run
write_sweep = _module(ROOT / "tests" / "report" / "test_select.py").write_sweep


def invoke(*args: object) -> tuple[int, str]:
    result = CliRunner().invoke(cli, [str(a) for a in args])
    return result.exit_code, result.output


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_sweep(tmp_path_factory.mktemp("sweep"))


def test_metrics_target_order_precision_and_caption(results: Path) -> None:
    code, output = invoke(
        "leaderboard", results, "--metrics", "pers_acc,comm", "--target", "0.5", "--select-by", "val_pers_acc",
        "--order", "fedper", "--precision", "1", "--caption", "Tuned on validation",
    )  # fmt: skip
    assert code == 0, output
    lines = output.splitlines()
    assert lines[0] == "Table: Tuned on validation"
    assert lines[2].startswith(
        "| Algorithm | digits α=0.1 Personalized accuracy (%) | digits α=0.1 Communication (MB) "
        "| digits α=0.1 Rounds to target | digits α=0.1 MB to target |"
    )
    assert lines[4].startswith("| FedPer | 50.0 ± 0.0 |") and lines[5].startswith("| FedAvg | **76.0 ± 1.0** |")
    assert (
        "Selected: FedAvg digits α=0.1: lr=0.1 (on seeds 0,1,2); FedAvg digits α=1: lr=0.01 (on seeds 0,1,2)." in output
    )


def test_the_old_metric_and_extra_options_still_work(results: Path) -> None:
    code, old = invoke("leaderboard", results, "--metric", "pers_acc", "--extra", "comm", "--select-by", "val_pers_acc")
    code_new, new = invoke("leaderboard", results, "--metrics", "pers_acc,comm", "--select-by", "val_pers_acc")
    assert code == code_new == 0 and old == new


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--select-by", "pers_acc"], "--select-by pers_acc is a test metric; select on a validation metric"),
        (["--allow-test-selection"], "--allow-test-selection would be ignored"),
        (
            ["--select-by", "val_pers_acc", "--include-diverged"],
            "--include-diverged cannot be combined with --select-by",
        ),
        (["--metric", "pers_acc", "--metrics", "global_acc"], "give --metric or --metrics, not both"),
        (["--metrics", "pers_acc,speed"], "metric 'speed' is not in the runs' summary.json; available:"),
        (["--target", "80"], "accuracies are fractions (0.8 = 80%)"),
        (["--target", "loss=0.5"], "'loss' is not a per-round metric"),
        (["--order", "fedx"], "--order 'fedx' names no row"),
        (["--precision", "11"], "11"),
        (["--plugin", "nope.py"], "--plugin 'nope.py' is not a readable .py file"),
    ],
)
def test_bad_input_is_one_error_line_and_nothing_written(
    results: Path, tmp_path: Path, args: list[str], message: str
) -> None:
    target = tmp_path / "table.md"
    code, output = invoke("leaderboard", results, *args, "--output", target)
    assert code == 2 and output.startswith("Error: ") and message in output, output
    assert output.count("\n") == 1 and not target.exists()


def test_options_from_a_config_file(results: Path, tmp_path: Path) -> None:
    config = tmp_path / "table.toml"
    config.write_text(
        'metrics = ["pers_acc", "comm"]\ntarget = "90%"\nselect-by = "val_pers_acc"\nprecision = 1\n'
        'order = ["fedper", "fedavg"]\ncaption = "From a file"\n'
    )
    code, from_file = invoke("leaderboard", results, "--config", config)
    code_cli, from_cli = invoke(
        "leaderboard", results, "--metrics", "pers_acc,comm", "--target", "90%", "--select-by", "val_pers_acc",
        "--precision", "1", "--order", "fedper,fedavg", "--caption", "From a file",
    )  # fmt: skip
    assert code == code_cli == 0 and from_file == from_cli and "Table: From a file" in from_file
    code, overridden = invoke("leaderboard", results, "--config", config, "--precision", "2")
    assert code == 0 and "**76.00 ± 1.00**" in overridden
    config.write_text('metrix = ["pers_acc"]\n')
    code, output = invoke("leaderboard", results, "--config", config)
    assert code == 2 and "unknown key 'metrix'" in output and "metrics, order" in output


SCRIPT = """
import json, sys
from click.testing import CliRunner
from pflbench.cli import cli
results = [CliRunner().invoke(cli, args) for args in json.loads(sys.argv[1])]
print("@@" + json.dumps([[r.exit_code, r.output, "torch" in sys.modules] for r in results]))
"""


def fresh(*commands: list[object]) -> list[tuple[int, str, bool]]:
    """(exit code, output, torch imported by then) of each command, run in order in one fresh interpreter."""
    arguments = json.dumps([[str(a) for a in command] for command in commands])
    result = subprocess.run([sys.executable, "-c", SCRIPT, arguments], capture_output=True, text=True, timeout=300)
    assert "@@" in result.stdout, result.stderr[-3000:]
    return [tuple(item) for item in json.loads(result.stdout.rpartition("@@")[2])]


def test_the_new_options_do_not_import_torch(results: Path) -> None:
    ((code, output, torch),) = fresh(
        ["leaderboard", results, "--select-by", "val_pers_acc", "--metrics", "pers_acc,comm", "--target", "90%",
         "--order", "rank", "--format", "latex"]
    )  # fmt: skip
    assert code == 0 and r"\toprule" in output, output
    assert not torch


def test_plugin_for_leaderboard_and_partition(tmp_path: Path) -> None:
    for seed in range(2):
        make_run(tmp_path, "example_prox", seed, [0.6 + 0.1 * seed], hparams={"prox_mu": 0.01})
    prox = ROOT / "algorithms" / "example_loss_term.py"
    blobs, quantity = ROOT / "datasets" / "example_dataset.py", ROOT / "datasets" / "example_partitioner.py"
    partition = ["partition", "--dataset", "example_blobs", "--partition", "quantity-skew-example"]
    partition += ["--alpha", "1.0", "--num-clients", "4"]
    plain, named, unknown, partitioned = fresh(
        ["leaderboard", tmp_path],
        ["leaderboard", tmp_path, "--plugin", prox],
        partition,
        [*partition, "--plugin", blobs, "--plugin", quantity],
    )
    assert plain[0] == 0 and "| example_prox | 65.00 ± 7.07 |" in plain[1], plain[1]
    assert named[0] == 0 and "| ExampleProx | 65.00 ± 7.07 |" in named[1], named[1]  # the class's display_name
    assert unknown[0] == 2 and "unknown partitioner 'quantity-skew-example'" in unknown[1], unknown[1]
    assert partitioned[0] == 0, partitioned[1]
    assert "example_blobs: 1200 samples, 4 classes, partition=quantity-skew-example α=1 K=4" in partitioned[1]


def test_many_unfinished_runs_are_one_warning_line(tmp_path: Path) -> None:
    """pflbench tune leaves its pruned trials unfinished: one line counts them (names the first 3)."""
    make_run(tmp_path, "fedavg", 0, [0.5])
    for lr in (0.01, 0.02, 0.03, 0.04, 0.06):
        (make_run(tmp_path, "fedavg", 0, [0.4], lr=lr) / "summary.json").unlink()
    result = CliRunner().invoke(cli, ["leaderboard", str(tmp_path)])
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.output.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and warnings[0].startswith("warning: skipped 5 unfinished runs (no summary.json")
    assert warnings[0].endswith(", ...")
