"""Stale runs: a finished run whose code changed since it ran (here: its plugin file was edited)
is re-run by ``sweep`` — only it — through the claim/publish protocol (the earlier result stays
until the new run completes, also when the re-run is killed); unchanged runs are skipped, runs
recorded before code records are kept, ``--force`` redoes everything; ``sweep --ray`` the same.

The plugin is the repository's example loss-term plugin, copied into ``tmp_path`` under a name of
each test's own (a name registered from two files would be refused)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from pflbench.cli import cli

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "algorithms" / "example_loss_term.py"
TINY = ["--datasets", "digits", "--model", "mlp", "--num-clients", "3", "--rounds", "1"]


def plugin_copy(folder: Path, name: str) -> Path:
    """The example plugin registering ``name`` instead of ``example_prox``."""
    source = EXAMPLE.read_text()
    assert '"example_prox"' in source
    path = folder / f"{name}.py"
    path.write_text(source.replace('"example_prox"', f'"{name}"'))
    return path


def invoke(*args: object) -> tuple[int, str]:
    result = CliRunner().invoke(cli, [str(a) for a in args])
    return result.exit_code, result.output


def run_folder(out: Path, algo: str) -> Path:
    (folder,) = (out / "runs").glob(f"{algo}__*")
    return folder


def code_of(folder: Path) -> dict:
    return json.loads((folder / "config.json").read_text())["code"]


def finished_at(folder: Path) -> int:
    return (folder / "summary.json").stat().st_mtime_ns


def test_an_edited_plugin_makes_only_its_runs_stale_and_sweep_reruns_them(tmp_path: Path) -> None:
    plugin = plugin_copy(tmp_path, "edited_prox_a")
    out = tmp_path / "out"
    args = ["sweep", "--plugin", plugin, "--algos", "edited_prox_a,fedavg", *TINY, "--out", out]
    code, output = invoke(*args)
    assert code == 0 and "2 done" in output, output
    prox, fedavg = run_folder(out, "edited_prox_a"), run_folder(out, "fedavg")
    before = {folder: (finished_at(folder), code_of(folder)["identity"]) for folder in (prox, fedavg)}

    code, output = invoke(*args)  # nothing changed: both skipped
    assert code == 0 and "0 done, 2 skipped (already finished)" in output and "are stale" not in output, output
    assert {folder: (finished_at(folder), code_of(folder)["identity"]) for folder in before} == before

    plugin.write_text(plugin.read_text() + "\n# an edit that changes no number\n")
    code, output = invoke(*args, "--dry-run")
    assert f"{prox} (finished, stale: its code changed; will be re-run)" in output, output
    assert f"{fedavg} (finished)\n" in output

    code, output = invoke(*args, "--jobs", "2")  # the stale run goes to a worker process
    assert code == 0, output
    stale_line = f"sweep: 1 finished runs are stale (code changed since they ran), re-running: {prox.name}"
    assert stale_line in output.splitlines(), output
    assert "1 done (1 of them finished before: stale or --force), 1 skipped (already finished)" in output
    assert finished_at(fedavg) == before[fedavg][0] and code_of(fedavg)["identity"] == before[fedavg][1]
    assert finished_at(prox) != before[prox][0]  # replaced in place: same folder, no second one
    assert sorted(p.name for p in (out / "runs").iterdir()) == sorted([prox.name, fedavg.name])
    recorded = code_of(prox)
    assert recorded["identity"] != before[prox][1]
    (source,) = recorded["plugins"]["algorithm"]["sources"]
    assert source["sha256"] == hashlib.sha256(plugin.read_bytes()).hexdigest()
    assert (prox / "plugins" / plugin.name).read_bytes() == plugin.read_bytes()  # the copy follows too
    record = max((out / "sweeps").iterdir(), key=lambda p: p.stat().st_mtime_ns)  # this sweep's
    statuses = {r["name"]: (r["status"], r.get("redo")) for r in json.loads(record.read_text())["runs"]}
    assert statuses == {prox.name: ("done", "stale"), fedavg.name: ("skipped", None)}

    code, output = invoke(*args)  # the re-run recorded today's code: nothing is stale any more
    assert code == 0 and "0 done, 2 skipped" in output and "are stale" not in output, output

    times = {folder: finished_at(folder) for folder in (prox, fedavg)}
    code, output = invoke(*args, "--force")
    assert code == 0 and "sweep --force: redoing 2 finished runs too" in output, output
    assert "2 done (2 of them finished before: stale or --force), 0 skipped" in output
    assert all(finished_at(folder) != times[folder] for folder in times)


def test_runs_recorded_before_code_records_are_kept_and_listed(tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = ["sweep", "--algos", "fedavg", "--seeds", "0,1", *TINY, "--out", out]
    code, output = invoke(*args)
    assert code == 0, output
    old = sorted((out / "runs").iterdir())[0]
    config = json.loads((old / "config.json").read_text())
    del config["code"]  # as pflbench wrote it before code records
    (old / "config.json").write_text(json.dumps(config))
    finished = finished_at(old)
    code, output = invoke(*args)
    assert code == 0 and "0 done, 2 skipped" in output, output
    line = (
        "sweep: 1 finished runs were recorded before pflbench recorded code; kept as finished "
        f"(--force redoes them): {old.name}"
    )
    assert line in output.splitlines() and finished_at(old) == finished
    code, output = invoke(*args, "--dry-run")
    assert f"{old} (finished, recorded before code records: kept)" in output
    forced = tmp_path / "force.toml"
    forced.write_text("force = true\n")  # --force as a sweep file's key
    code, output = invoke(*args, "--config", forced, "--seeds", "0")
    assert code == 0 and "1 done (1 of them finished before" in output, output
    assert "code" in json.loads((old / "config.json").read_text())


KILLED_SWEEP = """
import sys
from pflbench.cli import cli
from pflbench.testing import kill_after_round
kill_after_round(1)
sys.argv = ["pflbench", *sys.argv[1:]]
cli()
"""


def test_a_killed_rerun_of_a_stale_run_keeps_the_earlier_result(tmp_path: Path) -> None:
    """The re-run dies after round 1 (SIGKILL): the earlier result is intact, the new run waits in
    ``.tmp-NAME``; the next sweep resumes it only while the code is the one that started it."""
    plugin = plugin_copy(tmp_path, "edited_prox_b")
    out = tmp_path / "out"
    args = ["sweep", "--plugin", plugin, "--algos", "edited_prox_b", *TINY, "--rounds", "2", "--out", out]
    args += ["--checkpoint-every", "1", "--quiet"]
    code, output = invoke(*args)
    assert code == 0, output
    folder = run_folder(out, "edited_prox_b")
    earlier = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}

    plugin.write_text(plugin.read_text() + "\n# first edit\n")
    killed = subprocess.run([sys.executable, "-c", KILLED_SWEEP, *map(str, args)], capture_output=True)
    assert killed.returncode == -9, killed.stderr.decode()
    assert {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()} == earlier  # untouched
    work = folder.with_name(".tmp-" + folder.name)
    assert (work / "checkpoint.pt").is_file()
    assert code_of(work)["identity"] != code_of(folder)["identity"]

    plugin.write_text(plugin.read_text() + "\n# second edit: the checkpoint is of other code now\n")
    code, output = invoke(*args)
    assert code == 0, output
    assert "holds an unfinished run started by other code" in output and "starting it over" in output
    assert not work.exists() and not list(out.glob("runs/.old-*"))
    source = code_of(folder)["plugins"]["algorithm"]["sources"][0]
    assert source["sha256"] == hashlib.sha256(plugin.read_bytes()).hexdigest()
    assert len((folder / "rounds.jsonl").read_text().splitlines()) == 2


def test_sweep_on_ray_reruns_a_stale_run_and_records_the_drivers_plugin(tmp_path: Path) -> None:
    """The runs are made by a local sweep (the same folders a Ray sweep writes), then one Ray sweep."""
    pytest.importorskip("ray")
    plugin = plugin_copy(tmp_path, "edited_prox_c")
    out = tmp_path / "out"
    args = ["sweep", "--plugin", plugin, "--algos", "edited_prox_c,fedavg", *TINY, "--out", out]
    code, output = invoke(*args)
    assert code == 0 and "2 done" in output, output
    prox, fedavg = run_folder(out, "edited_prox_c"), run_folder(out, "fedavg")
    kept = finished_at(fedavg)
    plugin.write_text(plugin.read_text() + "\n# edited\n")
    code, output = invoke(*args, "--ray")
    assert code == 0 and "1 done (1 of them finished before: stale or --force), 1 skipped" in output, output
    assert f"re-running: {prox.name}" in output and finished_at(fedavg) == kept
    config = json.loads((prox / "config.json").read_text())
    assert config["plugins"] == [str(plugin)]  # the driver's path, not the worker's copy
    digest = hashlib.sha256(plugin.read_bytes()).hexdigest()
    assert config["code"]["plugin_files"] == [{"path": str(plugin), "sha256": digest, "copy": f"plugins/{plugin.name}"}]
    assert config["code"]["plugins"]["algorithm"]["sources"] == [{"plugin_file": str(plugin), "sha256": digest}]
    assert (prox / "plugins" / plugin.name).read_bytes() == plugin.read_bytes()
