"""`run --config FILE` / `sweep --config FILE`: options from TOML/YAML, the command line wins."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.core import ParameterSource
from click.testing import CliRunner

from pflbench.cli import cli
from pflbench.cli.run import run_command
from pflbench.cli.sweep import sweep_command, sweep_plan
from pflbench.sweeps.grid import expand_grid

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = '''
from dataclasses import dataclass
from pflbench import option, register_algorithm
from pflbench.algorithms.fedavg import FedAvg


@dataclass(frozen=True)
class Damp:
    damp: float = option(0.5, "Factor on the averaged model.")


@register_algorithm("dampavg")
class DampAvg(FedAvg):
    """FedAvg with a damped aggregate (a test plugin named only in a config file)."""
    hyperparameters = Damp

    def aggregate(self, updates):
        super().aggregate(updates)
        for tensor in self.global_state.values():
            tensor.mul_(self.hparams.damp)
'''


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.output


def parse(command, *args: str):
    return command.make_context(command.name, list(args))


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_toml_values_become_options_and_the_command_line_overrides(tmp_path: Path) -> None:
    config = write(
        tmp_path / "run.toml",
        """
algo = "fedprox"
mu = 0.1
local-epochs = 2
lr = 0.2
num_clients = 5
dataset_option = {num_samples = 200}
pretrained = false
""",
    )
    ctx = parse(run_command, "--config", str(config), "--lr", "0.3", "--seed", "4")
    params = ctx.params
    assert params["algo"] == "fedprox" and params["mu"] == 0.1 and params["local_epochs"] == 2
    assert params["num_clients"] == 5 and params["dataset_option"] == ("num_samples=200",)
    assert params["lr"] == 0.3 and params["seed"] == 4  # the command line wins
    assert ctx.get_parameter_source("lr") is ParameterSource.COMMANDLINE
    assert ctx.get_parameter_source("mu") is ParameterSource.DEFAULT_MAP
    assert ctx.get_parameter_source("rounds") is ParameterSource.DEFAULT


def test_yaml_is_read_like_toml(tmp_path: Path) -> None:
    pytest.importorskip("yaml")
    config = write(
        tmp_path / "run.yaml",
        "algo: fedrep\nhead-epochs: 3\nmodel_option: [hidden=64]\nlog: tensorboard\nsave-model: true\n",
    )
    params = parse(run_command, "--config", str(config)).params
    assert params["algo"] == "fedrep" and params["head_epochs"] == 3
    assert params["model_option"] == ("hidden=64",) and params["log"] == ("tensorboard",)
    assert params["save_model"] is True


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("lrr = 0.1\n", "unknown key 'lrr' (did you mean 'lr'?); valid keys: "),
        ('optimizer = "rmsprop"\n', "'rmsprop' is not one of"),
        ("lr = [0.1, 0.2]\n", "'lr' takes one value"),
        ("lr = \n", "not valid TOML"),
    ],
)
def test_bad_config_files_are_one_line_errors(tmp_path: Path, text: str, message: str) -> None:
    config = write(tmp_path / "bad.toml", text)
    code, output = invoke("run", "--config", str(config), "--out", str(tmp_path / "out"))
    assert code == 2, output
    assert message in output and len(output.strip().splitlines()) == 1, output
    assert not (tmp_path / "out").exists()


def test_unknown_key_error_names_valid_keys(tmp_path: Path) -> None:
    config = write(tmp_path / "bad.toml", "epochs = 3\n")
    code, output = invoke("run", "--config", str(config))
    assert code == 2 and "unknown key 'epochs'" in output
    valid = output.split("valid keys: ", 1)[1]
    for key in ("local_epochs", "lr", "mu", "head_epochs", "seed", "save_model"):
        assert key in valid.split(", ") or key in valid, key


def test_missing_and_unknown_format(tmp_path: Path) -> None:
    code, output = invoke("run", "--config", str(tmp_path / "nope.toml"))
    assert code == 2 and "nope.toml" in output
    code, output = invoke("run", "--config", str(write(tmp_path / "c.ini", "x=1")))
    assert code == 2 and "unknown format '.ini'" in output


def test_run_from_a_config_file_equals_the_same_options(tmp_path: Path) -> None:
    config = write(
        tmp_path / "run.toml", f'model = "mlp"\nnum_clients = 4\nrounds = 2\nlr = 0.05\nout = "{tmp_path / "a"}"\n'
    )
    code, output = invoke("run", "--config", str(config), "--quiet")
    assert code == 0, output
    code, output = invoke(
        "run",
        "--model",
        "mlp",
        "--num-clients",
        "4",
        "--rounds",
        "2",
        "--lr",
        "0.05",
        "--out",
        str(tmp_path / "b"),
        "--quiet",
    )
    assert code == 0, output
    (a,), (b,) = (list((tmp_path / x / "runs").iterdir()) for x in "ab")
    assert a.name == b.name
    summary = [json.loads((d / "summary.json").read_text())["pers_acc"] for d in (a, b)]
    assert summary[0] == summary[1]


def test_paper_example_parses_into_the_expected_grid() -> None:
    path = ROOT / "examples" / "paper_digits.toml"
    ctx = parse(sweep_command, "--config", str(path))
    with ctx:
        base, grid = sweep_plan(**{k: v for k, v in ctx.params.items() if k not in ("quiet", "dry_run", "plugin")})
        runs = expand_grid(base, grid)
    assert grid.algos == ("fedavg", "fedper", "fedrep") and grid.datasets == ("digits",)
    assert grid.alphas == (0.1, 1.0) and grid.seeds == (0, 1, 2)
    assert len(runs) == 18 and len({r.name for r in runs}) == 18
    assert {(r.config.algo, r.config.alpha, r.config.seed) for r in runs} == {
        (a, alpha, s) for a in grid.algos for alpha in grid.alphas for s in grid.seeds
    }
    for run in runs:
        c = run.config
        assert (c.model, c.lr, c.rounds, c.num_clients, c.batch_size, c.out) == ("cnn", 0.1, 50, 20, 32, "paper_digits")
    assert {r.algo_options.get("head_epochs") for r in runs if r.config.algo == "fedrep"} == {2}


def test_sweep_file_with_set_table_and_command_line_override(tmp_path: Path) -> None:
    config = write(
        tmp_path / "grid.toml",
        """
algos = "fedavg,fedprox"
alphas = [0.5]
seeds = [0, 1]
model = "mlp"
[set]
mu = [0.01, 0.1]
lr = [0.05]
""",
    )
    ctx = parse(sweep_command, "--config", str(config), "--seeds", "3")
    with ctx:
        base, grid = sweep_plan(**{k: v for k, v in ctx.params.items() if k not in ("quiet", "dry_run", "plugin")})
        runs = expand_grid(base, grid)
    assert grid.seeds == (3,) and grid.axes == {"mu": ("0.01", "0.1"), "lr": ("0.05",)}
    assert len(runs) == 3  # fedavg + fedprox × two mu
    assert {r.config.lr for r in runs} == {0.05}


def test_sweep_dry_run_lists_runs(tmp_path: Path) -> None:
    config = write(tmp_path / "grid.toml", f'algos = ["fedavg", "local"]\nseeds = [0, 1]\nout = "{tmp_path / "o"}"\n')
    code, output = invoke("sweep", "--config", str(config), "--dry-run")
    assert code == 0, output
    assert "4 runs (dry run" in output and not (tmp_path / "o").exists()


def test_config_file_plugin_registers_its_algorithm_and_reruns(tmp_path: Path) -> None:
    plugin = tmp_path / "shrink_plugin.py"
    plugin.write_text(PLUGIN)
    config = write(
        tmp_path / "run.toml",
        f'plugin = ["{plugin}"]\nalgo = "dampavg"\ndamp = 0.9\n'
        f'model = "mlp"\nnum_clients = 4\nrounds = 2\n'
        f'out = "{tmp_path / "out"}"\n',
    )
    code, output = invoke("run", "--config", str(config), "--quiet")
    assert code == 0, output
    (folder,) = list((tmp_path / "out" / "runs").iterdir())
    recorded = json.loads((folder / "config.json").read_text())
    assert recorded["algo_hparams"] == {"damp": 0.9} and recorded["plugins"] == [str(plugin)]
    code, output = invoke("rerun", str(folder), "--quiet", "--check", "--plugin", str(plugin))
    assert code == 0 and "metrics identical" in output, output


def test_a_yaml_alias_bomb_is_refused_quickly(tmp_path: Path) -> None:
    pytest.importorskip("yaml")
    levels = ['a: &a ["x","x","x","x","x","x","x","x","x"]']
    for i in range(1, 9):  # 9 aliases per level, 9 levels: 9⁹ ≈ 387 million values once expanded
        levels.append(f"{chr(97 + i)}: &{chr(97 + i)} [" + ",".join([f"*{chr(96 + i)}"] * 9) + "]")
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("\n".join(levels) + "\n")
    assert len(bomb.read_bytes()) < 500
    result = CliRunner().invoke(cli, ["run", "--config", str(bomb), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and "expands to more than 100,000 values" in result.output
    assert result.output.count("\n") == 1 and not (tmp_path / "o").exists()


def test_deep_nesting_is_one_error_line(tmp_path: Path) -> None:
    deep = tmp_path / "deep.toml"
    deep.write_text("x = " + "[" * 5000 + "]" * 5000 + "\n")
    result = CliRunner().invoke(cli, ["run", "--config", str(deep)])
    assert result.exit_code == 2 and result.output.count("\n") == 1 and result.output.startswith("Error: ")


def test_a_typo_gets_did_you_mean_and_no_internal_keys(tmp_path: Path) -> None:
    typo = tmp_path / "typo.toml"
    typo.write_text("local_epoch = 3\n")
    result = CliRunner().invoke(cli, ["run", "--config", str(typo)])
    assert result.exit_code == 2 and "unknown key 'local_epoch' (did you mean 'local_epochs'?)" in result.output
    assert "_click" not in result.output and result.output.count("\n") == 1
