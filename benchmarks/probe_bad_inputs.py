"""Feed malformed files to the commands that read them and count the unclean answers (issue 27).

Clean = exit code 2, exactly one ``Error:`` line on stderr, no traceback, nothing written or
changed in the working folder. Files probed: ``--partition-file`` (``run`` and ``partition``),
a run folder's ``config.json`` (``rerun``), ``summary.json`` (``gates``) and ``--config``
files (``run``; wrong types and options the run would ignore).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/probe_bad_inputs.py [--verbose]

Prints one line per unclean case and a final JSON line ``{"cases": N, "unclean": M, ...}``.
Not a timed benchmark; the cases themselves are the tests' (tests/cli/test_bad_file_inputs.py)
plus the larger space below.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from pflbench.cli import cli

DEEP = "[" * 10000 + "]" * 10000
DATASET_SIZE = 1797  # digits


def _valid_partition() -> dict[str, Any]:
    clients = [
        {"train": list(range(k * 500, k * 500 + 400)), "test": list(range(k * 500 + 400, k * 500 + 500))}
        for k in range(3)
    ]
    return {
        "format": "pflbench-partition",
        "version": 1,
        "dataset": {"name": "digits", "size": DATASET_SIZE, "num_classes": 10},
        "num_clients": 3,
        "clients": clients,
        "public": [],
    }


def _with(document: dict[str, Any], path: tuple[Any, ...], value: Any) -> str:
    """``document`` as JSON text with the value at ``path`` replaced (``DELETE``: removed)."""
    document = json.loads(json.dumps(document))
    target = document
    for key in path[:-1]:
        target = target[key]
    if value is DELETE:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return json.dumps(document)


DELETE = object()
RAW = object()  # marks a value spliced in as raw JSON text


def partition_cases() -> dict[str, str]:
    """name → file text."""
    valid = _valid_partition()
    cases: dict[str, str] = {
        "empty file": "",
        "not JSON": "{not json",
        "null": "null",
        "a list": "[1, 2, 3]",
        "a string": '"clients"',
        "deep nesting": DEEP,
        "deep nesting in train": _with(valid, ("clients", 0, "train"), "@DEEP@").replace('"@DEEP@"', DEEP),
        "NaN index": _with(valid, ("clients", 0, "train"), "@NAN@").replace('"@NAN@"', "[NaN]"),
    }
    per_value: dict[str, Any] = {
        "ragged train": [[1, 2], [3]],
        "nested train": [[1, 2], [3, 4]],
        "string indices": ["1", "2"],
        "float indices": [1.5, 2.5],
        "integral floats": [1.0, 2.0],
        "bool indices": [True, False],
        "negative index": [-1, 2],
        "out of range index": [10**6],
        "huge index": [10**30],
        "index 2**63": [2**63],
        "index 2**64 mixed": [1, 2**64],
        "null train": None,
        "train a dict": {"a": 1},
        "train a number": 5,
        "empty train": [],
        "duplicate index": [3, 3, 4],
    }
    for name, value in per_value.items():
        cases[name] = _with(valid, ("clients", 0, "train"), value)
    cases.update(
        {
            "index in two clients": _with(valid, ("clients", 1, "train"), [0, *range(501, 900)]),
            "missing train": _with(valid, ("clients", 0, "train"), DELETE),
            "missing test": _with(valid, ("clients", 0, "test"), DELETE),
            "missing clients": _with(valid, ("clients",), DELETE),
            "clients null": _with(valid, ("clients",), None),
            "clients a dict": _with(valid, ("clients",), {"0": {}}),
            "clients of numbers": _with(valid, ("clients",), [1, 2, 3]),
            "no clients": _with(_with_obj(valid, ("num_clients",), 0), ("clients",), []),
            "num_clients mismatch": _with(valid, ("num_clients",), 7),
            "num_clients a string": _with(valid, ("num_clients",), "3"),
            "num_clients a float": _with(valid, ("num_clients",), 3.0),
            "version a string": _with(valid, ("version",), "1"),
            "version missing": _with(valid, ("version",), DELETE),
            "format wrong": _with(valid, ("format",), "something-else"),
            "dataset a string": _with(valid, ("dataset",), "digits"),
            "dataset a list": _with(valid, ("dataset",), [1]),
            "dataset size a string": _with(valid, ("dataset", "size"), "1797"),
            "dataset size negative": _with(valid, ("dataset", "size"), -5),
            "dataset size wrong": _with(valid, ("dataset", "size"), 10),
            "dataset name a number": _with(valid, ("dataset", "name"), 5),
            "dataset name wrong": _with(valid, ("dataset", "name"), "mnist"),
            "public null": _with(valid, ("public",), None),
            "public a string": _with(valid, ("public",), "all"),
            "val ragged": _with(valid, ("clients", 0, "val"), [[1], [2, 3]]),
            "val null": _with(valid, ("clients", 0, "val"), None),
            "val string": _with(valid, ("clients", 0, "val"), "x"),
            "client extra key": _with(valid, ("clients", 0, "tset"), [1]),
        }
    )
    saved = {
        "train_indices": [d["train"] for d in valid["clients"]],
        "test_indices": [d["test"] for d in valid["clients"]],
    }
    saved_variants: dict[str, Any] = {
        "saved: train_indices a number": ("train_indices", 5),
        "saved: train_indices a string": ("train_indices", "abc"),
        "saved: train_indices a dict": ("train_indices", {"0": [1]}),
        "saved: test_indices null": ("test_indices", None),
        "saved: ragged train_indices": ("train_indices", [[[1, 2], [3]], [4], [5]]),
        "saved: config a string": ("config", "digits"),
        "saved: val_indices a number": ("val_indices", 5),
        "saved: fewer test lists": ("test_indices", [[400]]),
    }
    for name, (key, value) in saved_variants.items():
        cases[name] = json.dumps({**saved, key: value})
    return cases


def _with_obj(document: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(_with(document, path, value))
    return result


def rerun_cases(config: dict[str, Any]) -> dict[str, str]:
    cases: dict[str, str] = {
        "empty file": "",
        "not JSON": "{not json",
        "null": "null",
        "a list": "[]",
        "deep nesting": DEEP,
        "deep nesting in a value": json.dumps({**config, "rounds": "@D@"}).replace('"@D@"', DEEP),
    }
    per_key: dict[str, tuple[str, Any]] = {
        "rounds a string": ("rounds", "1"),
        "rounds a float": ("rounds", 1.7),
        "rounds a bool": ("rounds", True),
        "rounds null": ("rounds", None),
        "rounds negative": ("rounds", -3),
        "lr a string": ("lr", "0.1"),
        "lr a list": ("lr", [0.1]),
        "alpha NaN": ("alpha", "@NAN@"),
        "algo a number": ("algo", 5),
        "algo unknown": ("algo", "nope"),
        "dataset null": ("dataset", None),
        "save_model a string": ("save_model", "false"),
        "log a number": ("log", 5),
        "log a string": ("log", "tensorboard"),
        "dataset_option a dict": ("dataset_option", {"a": 1}),
        "algo_hparams a list": ("algo_hparams", [1, 2]),
        "algo_hparams a string": ("algo_hparams", "x"),
        "algo_hparams unknown key": ("algo_hparams", {"nope": 1}),
        "algo_hparams wrong type": ("algo_hparams", {"lambda1": "abc"}),
        "plugins a string": ("plugins", "abc"),
        "plugins a number": ("plugins", 5),
        "code a list": ("code", [1]),
        "code.plugin_files a string": ("code", {"plugin_files": "x"}),
        "identity_hash a number": ("identity_hash", 5),
        "executor unknown": ("executor", "warp"),
        "partition unknown": ("partition", "nope"),
    }
    for name, (key, value) in per_key.items():
        text = json.dumps({**config, key: value})
        cases[name] = text.replace('"@NAN@"', "NaN")
    for key in ("rounds", "algo", "dataset"):
        cases[f"missing {key}"] = json.dumps({k: v for k, v in config.items() if k != key})
    return cases


def gates_cases(summary: dict[str, Any]) -> dict[str, str]:
    cases: dict[str, str] = {
        "no summary.json": "@MISSING@",
        "empty file": "",
        "not JSON": "{not json",
        "null": "null",
        "a list": "[]",
        "deep nesting": DEEP,
        "deep nesting in gates": json.dumps({**summary, "gates": "@D@"}).replace('"@D@"', DEEP),
    }
    per_key: dict[str, tuple[str, Any]] = {
        "gates a string": ("gates", "x"),
        "gates null": ("gates", None),
        "gates flat": ("gates", [0.1, 0.2]),
        "gates ragged": ("gates", [[0.1, 0.2], [0.3]]),
        "gates strings": ("gates", [["a", "b"]]),
        "gates empty": ("gates", []),
        "gates out of [0, 1]": ("gates", [[1.5, -2.0]]),
        "gate_frac a string": ("gate_frac_below_0.1", "x"),
        "gate_frac null": ("gate_frac_below_0.1", None),
        "gates_clients_trained a list": ("gates_clients_trained", [1]),
        "gate_blocks a number": ("gate_blocks", 5),
        "gate_blocks one per column": ("gate_blocks", ["a"] * 50),
    }
    for name, (key, value) in per_key.items():
        cases[name] = json.dumps({**summary, key: value})
    for key in ("gate_frac_below_0.1", "gate_frac_above_0.9", "gate_frac_0.4_to_0.6", "gates_clients_trained"):
        cases[f"missing {key}"] = json.dumps({k: v for k, v in summary.items() if k != key})
    return cases


# config-file cases: (suffix, text); run reads them with --rounds 1 given unless the case sets rounds
CONFIG_CASES: dict[str, tuple[str, str]] = {
    "toml rounds = 2.7": (".toml", "rounds = 2.7"),
    "toml rounds = '1'": (".toml", 'rounds = "1"'),
    "toml rounds = true": (".toml", "rounds = true"),
    "toml lr = '0.1'": (".toml", 'lr = "0.1"'),
    "toml lr = true": (".toml", "lr = true"),
    "toml seed = [1, 2]": (".toml", "seed = [1, 2]"),
    "toml save_model = 'yes'": (".toml", 'save_model = "yes"'),
    "toml save_model = 1": (".toml", "save_model = 1"),
    "toml dataset = 5": (".toml", "dataset = 5"),
    "toml num_clients = 3.0": (".toml", "num_clients = 3.0"),
    "toml mu = '0.1' (fedprox)": (".toml", 'algo = "fedprox"\nmu = "0.1"'),
    "yaml rounds: 2.7": (".yaml", "rounds: 2.7"),
    "yaml rounds: '1'": (".yaml", "rounds: '1'"),
    "yaml rounds: yes": (".yaml", "rounds: yes"),
    "yaml save_model: 'false'": (".yaml", "save_model: 'false'"),
    "yaml lr: '0.1'": (".yaml", "lr: '0.1'"),
    "yaml rounds: null": (".yaml", "rounds: null"),
    "toml momentum with adam (ignored)": (".toml", 'optimizer = "adam"\nmomentum = 0.9'),
    "toml lora_alpha without lora (ignored)": (".toml", "lora_alpha = 8.0"),
    "toml head_layers with fedavg (ignored)": (".toml", "head_layers = 2"),
    "toml alpha with iid (ignored)": (".toml", 'partition = "iid"\nalpha = 0.1'),
}
IGNORED_ON_THE_COMMAND_LINE = {
    "finetune-epochs with local (no global model)": ["--algo", "local", "--finetune-epochs", "2"],
    "ray-workers without --executor ray": ["--ray-workers", "4"],
    "ray-address without --executor ray": ["--ray-address", "auto"],
    "mlflow-uri without --log mlflow": ["--mlflow-uri", "sqlite:///x.db"],
}


def judge(result: Any, changed: bool) -> list[str]:
    """What is unclean about one answer ([] = clean)."""
    problems = []
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    if result.exit_code != 2:
        problems.append(f"exit {result.exit_code}")
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        problems.append(f"traceback {type(result.exception).__name__}: {str(result.exception)[:80]}")
    elif len(lines) != 1 or not lines[0].startswith("Error: "):
        problems.append(f"{len(lines)} stderr lines")
    if changed:
        problems.append("wrote files")
    return problems


def snapshot(root: Path) -> dict[str, float]:
    return {str(p.relative_to(root)): p.stat().st_mtime for p in root.rglob("*")}


RUN = ["run", "--dataset", "digits", "--model", "mlp", "--num-clients", "3", "--rounds", "1", "--quiet"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--verbose", action="store_true", help="Also print the clean cases' error lines.")
    args = parser.parse_args()
    runner = CliRunner()
    root = Path(tempfile.mkdtemp(prefix="pflbench-probe-"))
    # a finished FedSDG run: its config.json and summary.json are the valid files varied below
    base = root / "base"
    setup = runner.invoke(
        cli,
        [
            "run",
            "--dataset",
            "digits",
            "--model",
            "mlp",
            "--num-clients",
            "3",
            "--rounds",
            "1",
            "--algo",
            "fedsdg",
            "--lora-targets",
            "fc1",
            "--quiet",
            "--out",
            str(base),
        ],
    )
    assert setup.exit_code == 0, setup.output
    run_dir = next((base / "runs").iterdir())
    config = json.loads((run_dir / "config.json").read_text())
    summary = json.loads((run_dir / "summary.json").read_text())

    work = root / "work"
    work.mkdir()
    outcomes: list[tuple[str, str, list[str], str]] = []

    def probe(kind: str, name: str, argv: list[str]) -> None:
        before = snapshot(work)
        result = runner.invoke(cli, argv)
        problems = judge(result, snapshot(work) != before)
        first = next((line for line in result.stderr.splitlines() if line.strip()), "")
        outcomes.append((kind, name, problems, first))
        if problems or args.verbose:
            status = "; ".join(problems) if problems else "clean"
            print(f"{kind:28} {name:40} {status:40} {first[:150]}", flush=True)
        shutil.rmtree(work)
        work.mkdir()

    for name, text in partition_cases().items():
        for command in ("run", "partition"):
            path = work / "part.json"
            path.write_text(text)
            argv = [*RUN, "--out", str(work / "out")] if command == "run" else ["partition", "--dataset", "digits"]
            probe(f"partition file ({command})", name, [*argv, "--partition-file", str(path)])
    for name, text in rerun_cases(config).items():
        folder = work / "received"
        shutil.copytree(run_dir, folder)
        (folder / "config.json").write_text(text)
        probe("rerun config.json", name, ["rerun", str(folder), "--quiet", "--out", str(work / "rerun")])
    for name, text in gates_cases(summary).items():
        folder = work / "received"
        shutil.copytree(run_dir, folder)
        if text == "@MISSING@":
            (folder / "summary.json").unlink()
        else:
            (folder / "summary.json").write_text(text)
        probe("gates summary.json", name, ["gates", str(folder), "--plot", str(work / "gates.png")])
    for name, (suffix, text) in CONFIG_CASES.items():
        path = work / f"config{suffix}"
        path.write_text(text + "\n")
        argv = [*RUN, "--out", str(work / "out"), "--config", str(path)]
        if "rounds" in text:
            argv = [a for i, a in enumerate(argv) if a != "--rounds" and argv[i - 1] != "--rounds"]
        probe("config file", name, argv)
    for name, extra in IGNORED_ON_THE_COMMAND_LINE.items():
        probe("ignored option", name, [*RUN, "--out", str(work / "out"), *extra])
    rerun = ["rerun", str(run_dir), "--quiet", "--out", str(work / "rerun"), "--mlflow-uri", "sqlite:///x.db"]
    probe("ignored option", "rerun --mlflow-uri without --log mlflow", rerun)

    unclean = [o for o in outcomes if o[2]]
    shutil.rmtree(root)
    per_kind = Counter(o[0] for o in unclean)
    print(json.dumps({"cases": len(outcomes), "unclean": len(unclean), "unclean_by_kind": dict(per_kind)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
