"""The command line as a user meets it: runs, listings, partitions, plugins and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from pflbench.cli import cli

TINY = ["--dataset", "digits", "--model", "mlp", "--num-clients", "4", "--rounds", "2", "--quiet"]
TIMING = {"round_time_s", "eval_time_s", "peak_mem_mb"}


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.output


def run_folder(out: Path) -> Path:
    (folder,) = list((out / "runs").iterdir())
    return folder


def test_run_writes_results_and_exits_zero(tmp_path: Path) -> None:
    code, output = invoke("run", "--algo", "fedavg", *TINY, "--out", str(tmp_path))
    assert code == 0, output
    assert "pers_acc" in output
    summary = json.loads((run_folder(tmp_path) / "summary.json").read_text())
    for key in (
        "algo",
        "dataset",
        "alpha",
        "seed",
        "rounds",
        "pers_acc",
        "pers_acc_weighted",
        "pers_acc_std",
        "pers_acc_worst10",
        "global_acc",
        "bytes_up_total",
        "bytes_down_total",
        "wall_time_s",
    ):
        assert key in summary, key
    assert summary["algo"] == "fedavg" and summary["rounds"] == 2
    config = json.loads((run_folder(tmp_path) / "config.json").read_text())
    assert config["num_clients"] == 4 and config["versions"]["torch"]


def test_same_seed_same_numbers(tmp_path: Path) -> None:
    outputs = []
    for name in ("a", "b"):
        code, output = invoke(
            "run", "--algo", "fedprox", "--mu", "0.1", *TINY, "--alpha", "0.1", "--out", str(tmp_path / name)
        )
        assert code == 0, output
        folder = run_folder(tmp_path / name)
        records = [
            {k: v for k, v in json.loads(line).items() if k not in TIMING}
            for line in (folder / "rounds.jsonl").read_text().splitlines()
        ]
        summary = json.loads((folder / "summary.json").read_text())
        summary = {
            k: v for k, v in summary.items() if k not in {"wall_time_s", "round_time_s_mean", "peak_mem_mb", "run_dir"}
        }
        outputs.append((records, summary, folder.name))
    assert outputs[0] == outputs[1]


def test_different_seed_different_numbers(tmp_path: Path) -> None:
    losses = []
    for seed in ("1", "2"):
        invoke("run", *TINY, "--seed", seed, "--out", str(tmp_path / seed))
        losses.append(json.loads((run_folder(tmp_path / seed) / "summary.json").read_text())["final_train_loss"])
    assert losses[0] != losses[1]


def test_list_shows_every_kind() -> None:
    code, output = invoke("list")
    assert code == 0
    for name in (
        "fedavg",
        "fedprox",
        "local",
        "digits",
        "synthetic",
        "cifar100",
        "mlp",
        "cnn",
        "dirichlet",
        "dirichlet-client",
        "iid",
        "shards",
    ):
        assert name in output, name
    code, output = invoke("list", "partitioners")
    assert code == 0 and "fedavg" not in output and "dirichlet" in output


def test_help_shows_defaults_and_algorithm_options() -> None:
    code, output = invoke("run", "--algo", "fedprox", "--help")
    assert code == 0
    assert "[default: 0.5]" in output and "  --mu " in output and "[default: 0.01]" in output


def test_partition_prints_statistics_and_plots(tmp_path: Path) -> None:
    plot, saved = tmp_path / "labels.png", tmp_path / "partition.json"
    code, output = invoke(
        "partition",
        "--dataset",
        "digits",
        "--alpha",
        "0.1",
        "--num-clients",
        "5",
        "--plot",
        str(plot),
        "--save",
        str(saved),
    )
    assert code == 0, output
    assert "classes/client" in output and plot.stat().st_size > 1000
    data = json.loads(saved.read_text())
    assert len(data["train_indices"]) == 5 and sum(data["stats"]["samples_per_client"]) <= 1797


PLUGIN = '''
from dataclasses import dataclass
from pflbench import option, register_algorithm
from pflbench.algorithms.fedavg import FedAvg


@dataclass(frozen=True)
class Hyper:
    shrink: float = option(0.5, "Factor applied to the averaged model.")


@register_algorithm("shrinkavg")
class ShrinkAvg(FedAvg):
    """FedAvg whose aggregate is scaled by --shrink (a test plugin)."""
    hyperparameters = Hyper

    def aggregate(self, updates):
        super().aggregate(updates)
        for tensor in self.global_state.values():
            tensor.mul_(self.hparams.shrink)
'''


def test_outside_plugin_file_runs_with_its_own_option(tmp_path: Path) -> None:
    plugin = tmp_path / "shrink_plugin.py"
    plugin.write_text(PLUGIN)
    code, output = invoke(
        "run", "--plugin", str(plugin), "--algo", "shrinkavg", "--shrink", "0.9", *TINY, "--out", str(tmp_path / "out")
    )
    assert code == 0, output
    config = json.loads((run_folder(tmp_path / "out") / "config.json").read_text())
    assert config["algo_hparams"] == {"shrink": 0.9} and config["plugins"] == [str(plugin)]
    code, output = invoke("list", "algorithms", "--plugin", str(plugin))
    assert "shrinkavg" in output


@pytest.mark.parametrize(
    "args, message",
    [
        (["--algo", "fedavgg"], "unknown algorithm 'fedavgg' (did you mean 'fedavg'?)"),
        (["--dataset", "nope"], "unknown dataset 'nope'"),
        (["--model", "nope"], "unknown model 'nope'"),
        (["--partition", "nope"], "unknown partitioner 'nope'"),
        (["--alpha", "0"], "--alpha must be a finite number > 0"),
        (["--alpha", "-1"], "--alpha must be a finite number > 0"),
        (["--alpha", "abc"], "'abc' is not a valid float"),
        (["--alpha", "nan"], "--alpha must be a finite number > 0"),
        (["--num-clients", "0"], "--num-clients must be ≥ 1"),
        (["--num-clients", "1000"], "1000 clients × min_size=10 needs 10000 samples"),
        (["--frac", "0"], "--frac must be in (0, 1]"),
        (["--frac", "1.5"], "--frac must be in (0, 1]"),
        (["--rounds", "0"], "--rounds must be ≥ 1"),
        (["--mu", "0.1"], "--mu is not an option of --algo fedavg"),
        (["--plugin", "/no/such/file.py"], "is not a readable .py file"),
        (["--device", "cuda:7"], "--device"),
        (["--dataset", "cifar10"], "uoft-cs/cifar10"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(args: list[str], message: str, tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["run", *TINY, *args, "--out", str(tmp_path)])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip() and not line.startswith("warning:")]
    assert len(lines) == 1 and lines[0].startswith("Error: ") and message in lines[0], result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "runs").exists()


def test_broken_plugin_files_are_clear_errors(tmp_path: Path) -> None:
    syntax = tmp_path / "broken.py"
    syntax.write_text("def oops(:\n")
    empty = tmp_path / "empty.py"
    empty.write_text("X = 1\n")
    code, output = invoke("run", "--plugin", str(syntax), *TINY, "--out", str(tmp_path))
    assert code == 2 and "failed to import" in output
    code, output = invoke("run", "--plugin", str(empty), *TINY, "--out", str(tmp_path))
    assert code == 2 and "registers nothing" in output


def test_contributing_example_plugin_runs(tmp_path: Path) -> None:
    """The complete plugin shown in CONTRIBUTING.md works as documented."""
    text = (Path(__file__).resolve().parents[2] / "CONTRIBUTING.md").read_text()
    code = text.split('```python\n"""FedAnchor')[1].split("```")[0]
    plugin = tmp_path / "fedanchor.py"
    plugin.write_text('"""FedAnchor' + code)
    code, output = invoke(
        "run",
        "--plugin",
        str(plugin),
        "--algo",
        "fedanchor",
        "--strength",
        "0.05",
        *TINY,
        "--out",
        str(tmp_path / "out"),
    )
    assert code == 0, output
    records = (run_folder(tmp_path / "out") / "rounds.jsonl").read_text().splitlines()
    assert "loss_anchor" in json.loads(records[-1])


def test_contributing_two_model_example_runs_and_reports_the_personal_model(tmp_path: Path) -> None:
    """The second-model-per-client example in CONTRIBUTING.md: runs, v never travels, and its
    pers_acc is the personal model's (not the global one's)."""
    text = (Path(__file__).resolve().parents[2] / "CONTRIBUTING.md").read_text()
    code = text.split('```python\n"""TwinAvg')[1].split("```")[0]
    plugin = tmp_path / "twinavg.py"
    plugin.write_text('"""TwinAvg' + code)
    code, output = invoke("run", "--plugin", str(plugin), "--algo", "twinavg", *TINY, "--out", str(tmp_path / "out"))
    assert code == 0, output
    folder = run_folder(tmp_path / "out")
    summary = json.loads((folder / "summary.json").read_text())
    config = json.loads((folder / "config.json").read_text())
    rounds = [json.loads(line) for line in (folder / "rounds.jsonl").read_text().splitlines()]
    assert any(r["pers_acc"] != r["global_acc"] for r in rounds) and summary["global_acc"] is not None
    assert config["resolved"]["private_parameters"] == 0  # v is extra state, not model state
    record = json.loads((folder / "rounds.jsonl").read_text().splitlines()[-1])
    assert record["bytes_up"] == record["bytes_down"]  # only w travels


def test_an_algorithm_with_a_second_model_cannot_silently_report_the_global_one(tmp_path: Path) -> None:
    plugin = tmp_path / "forgetful.py"
    plugin.write_text('''
import torch
from pflbench import Algorithm, register_algorithm


@register_algorithm("forgetful")
class Forgetful(Algorithm):
    """Keeps a personal copy per client but never says how it is evaluated."""

    def extra_private_state(self):
        return {"personal." + n: t.clone() for n, t in self.global_state.items()}
''')
    code, output = invoke("run", "--plugin", str(plugin), "--algo", "forgetful", *TINY, "--out", str(tmp_path / "out"))
    assert code == 2 and "does not override personal_model" in output
