"""The leaderboard counts each run once, keeps unfinished/failed/diverged runs out (or flagged),
survives malformed run folders, escapes names, and reports unwritable outputs as one error."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from pflbench.cli import cli
from pflbench.report.leaderboard import cells, pivot
from pflbench.report.render import to_html, to_markdown
from pflbench.store.reader import load_runs, recorded_identity_hash


def _sibling(name: str):
    """A module next to this file (tests run with --import-mode=importlib, so no plain import)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"_{name}", Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


write_run = _sibling("test_leaderboard").write_run


def collect(paths, **options):
    messages: list[str] = []
    return load_runs(paths, warn=messages.append, **options), messages


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.output


def test_a_copied_or_renamed_folder_is_not_a_second_seed(tmp_path: Path) -> None:
    first = write_run(tmp_path, "fedavg", 0.1, 0, 0.80, 0.7)
    write_run(tmp_path, "fedavg", 0.1, 1, 0.90, 0.7)
    shutil.copytree(first, tmp_path / "runs" / "copy of run")
    elsewhere = tmp_path / "other"
    shutil.copytree(first, elsewhere / "runs" / first.name)  # same name in another results folder
    config = json.loads((first / "config.json").read_text())
    moved = {
        **config,
        "out": "/somewhere/else",
        "command": ["pflbench", "run"],
        "git_commit": "abc",
        "versions": {"torch": "9"},
        "resolved": {"eval_every": 1},
    }
    assert recorded_identity_hash(moved) == recorded_identity_hash(config)
    (elsewhere / "runs" / first.name / "config.json").write_text(json.dumps(moved))
    frame, messages = collect([tmp_path, elsewhere])
    assert frame["run"].nunique() == 2
    assert sum("same run (settings and seed) as" in m for m in messages) == 2, messages
    table = pivot(frame)
    assert table.loc["FedAvg", ("digits", "α=0.1", "pers_acc", "n")] == 2
    assert table.loc["FedAvg", ("digits", "α=0.1", "pers_acc", "mean")] == pytest.approx(85.0)


def test_same_folder_name_with_other_settings_counts_as_another_run(tmp_path: Path) -> None:
    first = write_run(tmp_path / "a", "fedavg", 0.1, 0, 0.80, 0.7)
    second = write_run(tmp_path / "b", "fedavg", 0.1, 1, 0.60, 0.7)
    target = tmp_path / "b" / "runs" / first.name
    second.rename(target)  # a folder named like seed 0 that holds seed 1
    frame, messages = collect([tmp_path / "a", tmp_path / "b"])
    assert not messages and frame["run"].nunique() == 2
    assert sorted(frame.drop_duplicates("run")["seed"]) == [0, 1]


def _set_status(folder: Path, status: str) -> None:
    summary = json.loads((folder / "summary.json").read_text())
    (folder / "summary.json").write_text(json.dumps({**summary, "status": status}))


def test_diverged_runs_are_left_out_with_a_warning_or_shown_flagged(tmp_path: Path) -> None:
    for seed in range(3):
        write_run(tmp_path, "fedavg", 0.1, seed, 0.8, 0.7)
        write_run(tmp_path, "fedper", 0.1, seed, 0.9, None)
    diverged = write_run(tmp_path, "fedavg", 0.1, 5, 0.1, 0.1)
    _set_status(diverged, "diverged")
    _set_status(next((tmp_path / "runs").glob("fedper__*s0*")), "completed")  # normal
    frame, messages = collect(tmp_path)
    assert frame["run"].nunique() == 6
    assert len(messages) == 1 and "diverged run" in messages[0] and diverged.name in messages[0]
    frame, messages = collect(tmp_path, include_abnormal=True)
    table = pivot(frame)
    assert list(table.index) == ["FedAvg", "FedAvg [diverged]", "FedPer"]
    assert table.loc["FedAvg", ("digits", "α=0.1", "pers_acc", "mean")] == pytest.approx(80.0)
    assert table.loc["FedAvg [diverged]", ("digits", "α=0.1", "pers_acc", "mean")] == pytest.approx(10.0)
    assert "did not end normally" in to_markdown(table)
    code, output = invoke("leaderboard", str(tmp_path))
    assert code == 0 and "warning: skipped" in output and "[diverged]" not in output
    code, output = invoke("leaderboard", str(tmp_path), "--include-diverged")
    assert code == 0 and "| FedAvg [diverged] | 10.00 †n=1 |" in output


MALFORMED = {
    "deep summary": ("summary.json", "[" * 100_000 + "]" * 100_000),
    "deep config": ("config.json", '{"a": ' + "[" * 100_000 + "]" * 100_000 + "}"),
    "deep rounds": ("rounds.jsonl", "[" * 50_000 + "]" * 50_000 + "\n"),
    "truncated config": ("config.json", '{"algo": "fedavg", "dataset": "dig'),
    "summary a list": ("summary.json", "[1, 2, 3]"),
    "binary summary": ("summary.json", b"\xff\xfe\x00garbage"),
    "seed a string": ("config.json", {"seed": "zero"}),
    "seed a float": ("config.json", {"seed": 1.5}),
    "seed a bool": ("config.json", {"seed": True}),
    "alpha a string": ("config.json", {"alpha": "much"}),
    "alpha negative": ("config.json", {"alpha": -1}),
    "alpha infinite": ("config.json", '{"algo": "fedavg", "dataset": "digits", "alpha": Infinity, "seed": 9}'),
    "algo a list": ("config.json", {"algo": ["fedavg"]}),
    "hparams a list": ("config.json", {"algo_hparams": [1]}),
    "round a string": ("rounds.jsonl", '{"round": "1", "pers_acc": 0.5}\n'),
    "config a number": ("config.json", "42"),
    "seed huge": ("config.json", {"seed": 10**30}),
    "seed negative": ("config.json", {"seed": -1}),
    "round huge": ("rounds.jsonl", '{"round": 1000000000000000000000000000000, "pers_acc": 0.5}\n'),
}


def _corrupt(folder: Path, file: str, content) -> None:
    path = folder / file
    if isinstance(content, dict):
        path.write_text(json.dumps({**json.loads(path.read_text()), **content}))
    elif isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)


def test_malformed_run_folders_are_skipped_with_a_warning_naming_them(tmp_path: Path) -> None:
    write_run(tmp_path, "fedavg", 0.1, 0, 0.8, 0.7)
    broken = {}
    for index, (name, (file, content)) in enumerate(MALFORMED.items()):
        folder = write_run(tmp_path, "fedavg", 0.1, 100 + index, 0.1, 0.1)
        _corrupt(folder, file, content)
        broken[name] = folder
    absurd = write_run(tmp_path, "fedavg", 0.1, 99, 0.5, 0.5)  # readable, absurd values: not numbers
    summary = json.loads((absurd / "summary.json").read_text())
    (absurd / "summary.json").write_text(
        json.dumps(
            {
                **summary,
                "pers_acc_worst10": 10**500,
                "global_acc": True,
                "pers_acc_last10": [[[]]],
                "bytes_up_total": "many",
            }
        )
    )
    frame, messages = collect(tmp_path)
    assert len(messages) == len(MALFORMED), messages
    for name, folder in broken.items():
        assert any(str(folder) in m for m in messages), name
    assert frame["run"].nunique() == 2
    finals = frame[(frame["run"] == absurd.name) & frame["round"].isna()]
    assert set(finals["metric"]) >= {"pers_acc"} and "global_acc" not in set(finals["metric"])
    code, output = invoke("leaderboard", str(tmp_path))
    assert code == 0, output
    assert output.count("warning: skipped") == len(MALFORMED) and "Traceback" not in output


@pytest.mark.skipif(sys.platform == "win32" or os.geteuid() == 0, reason="root reads unreadable folders")
def test_unreadable_results_folder_is_a_warning(tmp_path: Path) -> None:
    write_run(tmp_path / "ok", "fedavg", 0.1, 0, 0.8, 0.7)
    locked = tmp_path / "locked" / "runs"
    locked.mkdir(parents=True)
    locked.chmod(0)
    try:
        frame, messages = collect([tmp_path / "ok", tmp_path / "locked"])
    finally:
        locked.chmod(0o755)
    assert frame["run"].nunique() == 1 and "cannot list" in messages[0]


def test_names_and_values_are_escaped_in_markdown_and_html(tmp_path: Path) -> None:
    evil = "<script>alert(1)</script>"
    folder = write_run(tmp_path, "fedavg", 0.1, 0, 0.8, 0.7)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "algo": evil, "dataset": "d<img src=x>|*"}))
    write_run(tmp_path, "fedper", 0.1, 0, 0.9, None, lr=0.05)
    table = pivot(load_runs(tmp_path), renames={"fedper": "<b>bold</b>"})
    for text in (to_markdown(table), to_html(table)):
        assert "<script>" not in text and "<img" not in text and "<b>bold</b>" not in text
        assert "&lt;script&gt;" in text and "&lt;img src=x&gt;" in text
    assert r"\|\*" in to_markdown(table)


@pytest.mark.parametrize("option", ["--output", "--plots"])
def test_unwritable_output_is_one_error_line(tmp_path: Path, option: str) -> None:
    write_run(tmp_path, "fedavg", 0.1, 0, 0.8, 0.7)
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    code, output = invoke("leaderboard", str(tmp_path), option, str(blocker / "sub" / "table.md"))
    assert code == 2 and output.startswith(f"Error: cannot write {blocker / 'sub'}"), output
    assert output.count("\n") == 1 and "Traceback" not in output


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_read_only_output_folder_is_one_error_line(tmp_path: Path) -> None:
    write_run(tmp_path, "fedavg", 0.1, 0, 0.8, 0.7)
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        code, output = invoke("leaderboard", str(tmp_path), "--output", str(locked / "t.md"))
    finally:
        locked.chmod(0o755)
    assert code == 2 and output.startswith("Error: cannot write") and "Permission denied" in output


def test_cells_of_a_run_with_no_value_are_not_ranked(tmp_path: Path) -> None:
    write_run(tmp_path, "fedavg", 0.1, 0, 0.8, 0.7)
    folder = write_run(tmp_path, "fedper", 0.1, 0, 0.9, None)
    summary = json.loads((folder / "summary.json").read_text())
    (folder / "summary.json").write_text(json.dumps({**summary, "pers_acc": None}))
    marks = cells(pivot(load_runs(tmp_path)))
    assert marks["FedPer", ("digits", "α=0.1", "pers_acc")].mean is None
    assert marks["FedPer", ("digits", "α=0.1", "pers_acc")].rank is None
    assert marks["FedAvg", ("digits", "α=0.1", "pers_acc")].rank == 1


def test_of_several_copies_the_runner_named_folder_is_kept(tmp_path: Path) -> None:
    made = write_run(tmp_path, "fedavg", 0.1, 0, 0.80, 0.7)
    identity = recorded_identity_hash(json.loads((made / "config.json").read_text()))
    named = made.with_name(f"fedavg__digits__a0.1__s0__{identity[:8]}")
    made.rename(named)
    shutil.copytree(named, tmp_path / "runs" / "a copy")  # sorts first
    frame, messages = collect(tmp_path)
    assert frame["run"].unique().tolist() == [named.name]
    assert messages == [
        f"skipped {tmp_path / 'runs' / 'a copy'}: same run (settings and seed) as {named}; counted once"
    ]


def test_grouped_config_json_is_read_too(tmp_path: Path) -> None:
    """A config.json whose settings sit in groups (``{"data": {...}, "train": {...}}``)."""
    for seed, (final, lr) in enumerate([(0.8, 0.01), (0.6, 0.05)]):
        folder = write_run(tmp_path, "fedavg", 0.1, seed, final, 0.7)
        flat = json.loads((folder / "config.json").read_text())
        grouped = {
            "algo": flat.pop("algo"),
            "seed": flat.pop("seed"),
            "algo_hparams": flat.pop("algo_hparams"),
            "data": {k: flat.pop(k) for k in ("dataset", "alpha", "num_clients", "partition", "frac")},
            "train": {**{k: flat.pop(k) for k in ("rounds", "local_epochs")}, "lr": lr},
            "model": {"name": flat.pop("model")},
            "out": flat.pop("out"),
        }
        (folder / "config.json").write_text(json.dumps(grouped))
    frame, messages = collect(tmp_path)
    assert not messages and frame["run"].nunique() == 2
    table = pivot(frame)
    assert list(table.index) == ["FedAvg (lr=0.01)", "FedAvg (lr=0.05)"]
    assert "20 clients, 20 sampled per round, 2 rounds, 1 local epoch" in to_markdown(table)


def test_the_setup_line_names_the_model_options() -> None:
    """A model's width is part of the setup: ``mlp (hidden=100)``, not just ``mlp``."""
    import pandas as pd

    from pflbench.report.names import setup_text

    def key(options: list[str] | None) -> str:
        run = {"num_clients": 20, "frac": 1.0, "rounds": 25, "local_epochs": 1, "model": "mlp"}
        return json.dumps({"run": run | ({"model_option": options} if options else {})})

    def frame(options: list[str] | None) -> pd.DataFrame:
        return pd.DataFrame(
            {"run": ["r"], "config_key": [key(options)], "dataset": ["fashion_mnist"], "partition": ["α=0.1"]}
        )

    assert setup_text(frame(["hidden=100"])).endswith("25 rounds, 1 local epoch, model mlp (hidden=100)")
    assert setup_text(frame(None)).endswith("25 rounds, 1 local epoch, model mlp")
    recorded = json.dumps({"run": json.loads(key(None))["run"] | {"model_options": {"hidden": 100}}})  # identity's form
    assert setup_text(frame(None).assign(config_key=[recorded])).endswith("model mlp (hidden=100)")
