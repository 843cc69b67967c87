"""``sweep --ray-address`` on a Ray cluster of two nodes: the runs spread over
both nodes, the driver's ``--out`` gets what a local sweep writes, the record names each run's node.

Two raylets on this one machine (``ray.cluster_utils.Cluster``, 1 CPU each) stand in for the
docs' two-machine launch (docs/guides/ray.md) (``ray start --head`` + ``ray start --address=...``): the driver
joins by address exactly as it would join a real cluster. Its own module: the other Ray tests
share one plain local instance.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from pflbench.cli import cli

ray = pytest.importorskip("ray")

SWEEP = [
    "sweep",
    "--algos",
    "fedavg,fedprox",
    "--seeds",
    "0",
    "--alphas",
    "0.5",
    "--model",
    "mlp",
    "--num-clients",
    "4",
    "--rounds",
    "2",
    "--quiet",
]
TIMES = {"round_time_s", "eval_time_s", "peak_mem_mb", "wall_time_s", "round_time_s_mean"}


def rounds(run_dir: Path) -> list[dict]:
    lines = (run_dir / "rounds.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k not in TIMES} for line in lines]


@pytest.fixture
def two_node_cluster():
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    yield cluster
    ray.shutdown()
    cluster.shutdown()


def test_sweep_spreads_over_two_nodes_and_matches_a_local_sweep(two_node_cluster, tmp_path: Path) -> None:
    runner = CliRunner()
    local = runner.invoke(cli, [*SWEEP, "--out", str(tmp_path / "local")])
    assert local.exit_code == 0 and "2 done" in local.output, local.output
    args = [*SWEEP, "--ray", "--ray-address", two_node_cluster.address, "--cpus-per-run", "1"]
    result = runner.invoke(cli, [*args, "--out", str(tmp_path / "cluster")])
    assert result.exit_code == 0 and "2 done, 0 skipped" in result.output, result.output
    assert len(two_node_cluster.list_all_nodes()) == 2
    (record_path,) = (tmp_path / "cluster" / "sweeps").iterdir()
    record = json.loads(record_path.read_text())
    workers = {run["worker"] for run in record["runs"]}
    assert len(workers) == 2, f"both runs ran on one node: {workers}"  # 1 CPU per node, 1 per run
    for local_dir in sorted((tmp_path / "local" / "runs").iterdir()):
        cluster_dir = tmp_path / "cluster" / "runs" / local_dir.name
        assert rounds(cluster_dir) == rounds(local_dir)
        assert (cluster_dir / "summary.json").is_file() and (cluster_dir / "config.json").is_file()
