"""``pflbench run`` shows its long stages (issue 25): the pretraining announcement, per-epoch
progress with an ETA, the reuse of a cached backbone; ``--quiet`` shows none of them."""

from __future__ import annotations

import re

from click.testing import CliRunner

from pflbench.cli import cli

TINY_LORA = ["run", "--algo", "fedsdg", "--dataset", "digits", "--pretrain-epochs", "2", "--rounds", "1",
             "--num-clients", "4", "--val-frac", "0"]  # fmt: skip


def test_pretraining_is_announced_shown_per_epoch_and_its_reuse_said(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PFLBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PFLBENCH_PROGRESS_EVERY", "0")  # every update, not one per 30 s
    first = CliRunner().invoke(cli, [*TINY_LORA, "--out", str(tmp_path / "a")])
    assert first.exit_code == 0, first.output
    err = first.stderr
    assert re.search(r"pretraining the \S+ backbone .*: 2 epochs over \d+ samples \(\d+ held back\)", err), err
    assert "--weights FILE" in err and "--backbone random" in err and "--pretrain-epochs" in err
    assert "preparing dataset digits" in err
    epochs = [line for line in err.splitlines() if line.startswith("pretraining:") and " done " in line]
    assert [re.search(r"epoch (\d)/2 done", line).group(1) for line in epochs] == ["1", "2"], err
    assert all("loss" in line and "held-back acc" in line for line in epochs), err
    assert "ETA" in epochs[0] and "sample/s" in epochs[0], epochs
    assert "reusing" not in err

    second = CliRunner().invoke(cli, [*TINY_LORA, "--out", str(tmp_path / "b")])
    assert second.exit_code == 0, second.output
    assert re.search(r"reusing the pretrained \S+ backbone cached at \S+backbones\S+\.pt", second.stderr)
    assert "pretraining:" not in second.stderr and "preparing dataset" not in second.stderr

    quiet = CliRunner().invoke(cli, [*TINY_LORA, "--out", str(tmp_path / "c"), "--quiet", "--pretrain-epochs", "1"])
    assert quiet.exit_code == 0, quiet.output
    assert "pretraining" not in quiet.stderr and "reusing" not in quiet.stderr and "ETA" not in quiet.stderr


def test_quiet_pretraining_gives_the_same_backbone_as_shown_pretraining(tmp_path, monkeypatch) -> None:
    """The per-epoch held-back accuracy is computed only when shown; it must not change the weights."""
    import torch

    from pflbench.util import cache

    monkeypatch.setenv("PFLBENCH_PROGRESS_EVERY", "0")
    files = []
    for name, quiet in (("shown", []), ("quiet", ["--quiet"])):
        monkeypatch.setenv("PFLBENCH_CACHE", str(tmp_path / name))
        result = CliRunner().invoke(cli, [*TINY_LORA, "--out", str(tmp_path / f"out-{name}"), *quiet])
        assert result.exit_code == 0, result.output
        (path,) = (tmp_path / name / "backbones").glob("*.pt")
        files.append(cache.load_entry(path)[0])
    shown, quiet_state = files
    assert shown.keys() == quiet_state.keys() and len(shown) > 10
    for key in shown:
        assert torch.equal(shown[key], quiet_state[key]), key
