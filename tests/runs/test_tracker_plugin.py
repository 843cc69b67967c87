"""A tracker as a plugin: a ``--plugin`` file registering ``@register_tracker("jsonlines")`` is a
``--log`` choice (CLI and config file), is listed by ``pflbench list trackers``, and an unknown
tracker name is one error line naming the valid ones. Runs in a fresh interpreter (a registered
plugin must not leak into later tests)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

PLUGIN = '''
"""A tracker plugin: every round as one JSON line in RUN_DIR/tracked.jsonl."""

import json

from pflbench import Tracker, register_tracker


@register_tracker("jsonlines")
class JsonLines(Tracker):
    """Every round's train_loss as one JSON line in RUN_DIR/tracked.jsonl."""

    def start(self):
        self.handle = open(self.run.folder / "tracked.jsonl", "a")
        self.handle.write(json.dumps({"start": self.run.name, "lr": self.run.params()["lr"]}) + "\\n")

    def log_round(self, record):
        self.handle.write(json.dumps({"round": record["round"], "train_loss": record["train_loss"]}) + "\\n")

    def finish(self, summary):
        self.handle.write(json.dumps({"pers_acc": summary["pers_acc"]}) + "\\n")

    def close(self, failed=False):
        if hasattr(self, "handle") and not self.handle.closed:
            self.handle.close()
'''

SCRIPT = """
import json, sys
from click.testing import CliRunner
from pflbench.cli import cli

plugin, out, config = sys.argv[1:4]
tiny = ["--dataset", "digits", "--model", "mlp", "--num-clients", "3", "--rounds", "2", "--quiet"]
results = {}
for name, args in {
    "list": ["list", "trackers", "--plugin", plugin],
    "run": ["run", *tiny, "--plugin", plugin, "--log", "jsonlines", "--out", out + "/cli"],
    "config": ["run", "--config", config, "--plugin", plugin, "--out", out + "/config"],
    "unknown": ["run", *tiny, "--plugin", plugin, "--log", "jsonline", "--out", out + "/unknown"],
}.items():
    result = CliRunner().invoke(cli, args)
    results[name] = [result.exit_code, result.output]
print(json.dumps(results))
"""


def test_a_tracker_plugin_is_a_log_choice(tmp_path: Path) -> None:
    plugin = tmp_path / "jsonlines_tracker.py"
    plugin.write_text(textwrap.dedent(PLUGIN))
    config = tmp_path / "run.toml"
    config.write_text(
        'dataset = "digits"\nmodel = "mlp"\nnum_clients = 3\nrounds = 2\nquiet = true\nlog = "jsonlines"\n'
    )
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(plugin), str(out), str(config)],
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    results = json.loads(result.stdout.splitlines()[-1])

    code, output = results["list"]
    assert code == 0 and "jsonlines" in output and "Every round's train_loss as one JSON line" in output
    assert {"mlflow", "tensorboard", "wandb"} <= {line.split()[0] for line in output.splitlines()[1:]}

    for name in ("run", "config"):
        code, output = results[name]
        assert code == 0, output
        (folder,) = (out / name.replace("run", "cli")).joinpath("runs").iterdir()
        lines = [json.loads(line) for line in (folder / "tracked.jsonl").read_text().splitlines()]
        rounds = [json.loads(line) for line in (folder / "rounds.jsonl").read_text().splitlines()]
        summary = json.loads((folder / "summary.json").read_text())
        assert lines[0]["start"] == folder.name
        assert lines[1:3] == [{"round": r["round"], "train_loss": r["train_loss"]} for r in rounds]
        assert lines[3:] == [{"pers_acc": summary["pers_acc"]}]

    code, output = results["unknown"]
    assert code == 2 and output.count("\n") == 1 and output.startswith("Error: --log 'jsonline' is not a tracker")
    assert "choose from jsonlines, mlflow, tensorboard, wandb" in output and "Traceback" not in output
    assert not (out / "unknown").exists()
