"""What identifies a run: the settings it reads, decided from the code that reads them."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from pflbench.cli import cli
from pflbench.config.identity import partition_inert, partition_label, partition_settings, run_name
from pflbench.config.run_config import RunConfig, resolve
from pflbench.registry import ALGORITHMS

# A plugin partitioner that reads α, with a name that says nothing about Dirichlet.
BANDS = '''
import numpy as np
from pflbench import register_partitioner


@register_partitioner("label-bands")
def label_bands(labels, num_clients, rng, alpha=1.0):
    """Clients get samples sorted by label with band widths ~ Dir(alpha)."""
    order = np.argsort(labels, kind="stable")
    spare = len(labels) - 50 * num_clients  # every client gets 50 samples, the rest by Dir(alpha)
    sizes = 50 + np.floor(rng.dirichlet(np.full(num_clients, alpha)) * spare).astype(int)
    return [np.sort(part) for part in np.split(order, np.cumsum(sizes)[:-1])]
'''


@pytest.fixture(scope="module")
def plugin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("plugin") / "bands.py"  # one file: a plugin registers once
    path.write_text(BANDS)
    return path


def test_a_plugin_partitioner_that_takes_alpha_reads_it(plugin: Path) -> None:
    from pflbench.registry import load_plugin_file

    load_plugin_file(plugin)
    fedavg = ALGORITHMS.get("fedavg")
    names = []
    for alpha in (0.1, 1.0):
        config, _ = resolve(RunConfig(partition="label-bands", alpha=alpha), fedavg, fedavg.hyperparameters())
        assert partition_settings(config) == {"alpha": alpha}
        assert "alpha" not in partition_inert(config) and "min_size" in partition_inert(config)
        assert partition_label(config) == f"a{alpha:g}"
        names.append(run_name(config, fedavg, fedavg.hyperparameters()))
    assert names[0] != names[1]  # two runs, two folders


def test_a_plugin_partitioner_run_accepts_alpha_and_gives_two_folders(plugin: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    base = ["run", "--plugin", str(plugin), "--partition", "label-bands", "--dataset", "digits"]
    base += ["--model", "mlp", "--num-clients", "3", "--rounds", "1", "--quiet", "--out", str(out)]
    for alpha in ("0.1", "5"):
        result = CliRunner().invoke(cli, [*base, "--alpha", alpha])
        assert result.exit_code == 0, result.output
    assert len(list((out / "runs").iterdir())) == 2
    refused = CliRunner().invoke(cli, [*base, "--alpha", "0.1", "--min-size", "3"])
    assert refused.exit_code == 2 and "--min-size 3 would be ignored" in refused.output


def test_builtin_partitioners_read_what_their_signature_takes() -> None:
    settings = {p: set(partition_settings(RunConfig(partition=p))) for p in ("dirichlet", "dirichlet-client", "iid")}
    assert settings == {
        "dirichlet": {"alpha", "min_size", "dirichlet_cut"},
        "dirichlet-client": {"alpha", "min_size"},
        "iid": {"min_size"},
    }
    assert set(partition_settings(RunConfig(partition="shards"))) == {"shards_per_client", "min_size"}
    assert partition_settings(RunConfig(partition_file="x.json")) == {}


def test_leaderboards_and_sweeps_key_on_the_settings_the_partitioner_read(tmp_path: Path) -> None:
    from pflbench.report.leaderboard import pivot
    from pflbench.store.reader import load_runs

    tiny = ["--dataset", "digits", "--model", "mlp", "--num-clients", "3", "--rounds", "1", "--quiet"]
    for extra in (["--alpha", "0.1"], ["--partition", "iid"], ["--partition", "shards", "--shards-per-client", "3"]):
        result = CliRunner().invoke(cli, ["run", *tiny, *extra, "--out", str(tmp_path)])
        assert result.exit_code == 0, result.output
    frame = load_runs(tmp_path)
    assert sorted(frame["partition"].unique()) == ["iid", "shards shards=3", "α=0.1"]  # iid has no α
    assert {column[:2] for column in pivot(frame).columns} == {
        ("digits", "α=0.1"),
        ("digits", "iid"),
        ("digits", "shards shards=3"),
    }
    listed = CliRunner().invoke(cli, ["leaderboard", str(tmp_path), "--format", "md"])
    assert listed.exit_code == 0 and "digits iid" in listed.output and "α=0.5" not in listed.output
    sweep = ["sweep", "--algos", "fedavg", "--datasets", "digits", "--set", "partition=iid", "--dry-run"]
    refused = CliRunner().invoke(cli, [*sweep, "--alphas", "0.1,1", *tiny[2:-1], "--out", str(tmp_path)])
    assert refused.exit_code == 2 and "--alphas 0.1,1 would be ignored" in refused.output
    planned = CliRunner().invoke(cli, [*sweep, *tiny[2:-1], "--out", str(tmp_path)])
    assert planned.exit_code == 0 and "fedavg digits iid seed=0" in planned.output, planned.output


def test_partition_shows_only_what_the_partitioner_reads() -> None:
    for extra, shown, hidden in (
        (["--partition", "iid"], "partition=iid K=4", ("α", "alpha", "cut=")),
        (["--partition", "shards"], "partition=shards shards=2 K=4", ("α", "alpha", "cut=")),
        (["--alpha", "0.3"], "partition=dirichlet α=0.3 K=4 seed=0 cut=unbiased", ()),
    ):
        result = CliRunner().invoke(cli, ["partition", "--dataset", "digits", "--num-clients", "4", *extra])
        first = result.output.splitlines()[0]
        assert result.exit_code == 0 and shown in first and not any(h in first for h in hidden), result.output


def test_a_setting_the_identity_omits_at_its_default_is_labelled_with_it(tmp_path: Path) -> None:
    from pflbench.report.leaderboard import row_labels
    from pflbench.store.reader import load_runs

    tiny = ["--dataset", "digits", "--model", "mlp", "--num-clients", "3", "--rounds", "1", "--quiet"]
    for executor in ("sequential", "vmap"):
        result = CliRunner().invoke(cli, ["run", *tiny, "--executor", executor, "--out", str(tmp_path)])
        assert result.exit_code == 0, result.output
    labels = sorted(row_labels(load_runs(tmp_path)).values())
    assert labels == ["FedAvg (executor=sequential)", "FedAvg (executor=vmap)"]  # not "executor=none"


def test_evaluating_every_n_rounds_with_n_at_least_rounds_is_one_run() -> None:
    """--eval-every 50 and 100 on a 50-round run both evaluate only after the last round: one
    identity (they used to get two folders for the same numbers); 25 evaluates twice: another."""
    fedavg = ALGORITHMS.get("fedavg")

    def name(eval_every: int) -> str:
        config, _ = resolve(
            RunConfig(algo="fedavg", rounds=50, eval_every=eval_every), fedavg, fedavg.hyperparameters()
        )
        return run_name(config, fedavg, fedavg.hyperparameters())

    assert name(50) == name(100) == name(1000) != name(25)
