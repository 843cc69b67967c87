"""Issue 34: a received folder contacts no host it names, faults and bad input are one line.

* ``rerun`` of a folder recording ``"executor": "ray", "ray_address": HOST:PORT`` never joins that
  cluster (a Ray head serves the driver pickles); ``--ray-address`` names one explicitly.
* A full disk (ENOSPC) while writing a checkpoint is one ``Error:`` line naming the file and the
  cause (torch's writer says only ``unexpected pos``), while writing a cache entry a warning; no
  half-written file is left or published, an earlier checkpoint stays whole.
* An image that claims 100000×100000 pixels or is cut short, a config file that is not UTF-8, an
  empty ``--metric``, a config.json with ``"alpha": "abc"`` and ``sweep --cpus-per-run`` without
  Ray: one ``Error:`` line each, exit code 2.
"""

from __future__ import annotations

import errno
import io
import json
import os
import shutil
import struct
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from pflbench.cli import cli
from pflbench.errors import ConfigError

RUN = ["run", "--dataset", "digits", "--model", "mlp", "--num-clients", "3", "--rounds", "1", "--quiet"]


def invoke(*args: str) -> Any:
    return CliRunner().invoke(cli, list(args))


def one_error_line(result: Any, notes: str | None = None) -> str:
    """The single ``Error:`` line of a refused command (exit code 2, nothing else on stderr but
    progress notes starting with ``notes``)."""
    lines = [line for line in result.stderr.splitlines() if line.strip() and not (notes and line.startswith(notes))]
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    return lines[0]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("finished")
    result = invoke(*RUN, "--out", str(out))
    assert result.exit_code == 0, result.output
    (run_dir,) = (out / "runs").iterdir()
    return run_dir


# ---------------------------------------------------------------------------- rerun and Ray


def _received_ray_run(finished_run: Path, tmp_path: Path) -> Path:
    folder = tmp_path / "received" / "runs" / finished_run.name
    shutil.copytree(finished_run, folder)
    record = json.loads((folder / "config.json").read_text())
    record.update(executor="ray", ray_address="192.0.2.1:6379")  # TEST-NET-1: a host of the sender's choosing
    (folder / "config.json").write_text(json.dumps(record))
    return folder


@pytest.fixture
def joined(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The addresses the Ray executor asked to join; it stops there (no Ray starts in the test)."""
    pytest.importorskip("ray")
    from pflbench.engine import ray_executor

    addresses: list[Any] = []

    def connect(address: str | None = None, num_cpus: int | None = None) -> Any:
        addresses.append(address)
        raise ConfigError(f"test: connect({address!r}) stops here")

    monkeypatch.setattr(ray_executor, "connect", connect)
    return addresses


def test_rerun_never_joins_the_ray_cluster_a_folder_records(
    finished_run: Path, tmp_path: Path, joined: list[Any]
) -> None:
    folder = _received_ray_run(finished_run, tmp_path)
    result = invoke("rerun", str(folder), "--quiet", "--out", str(tmp_path / "again"))
    assert joined == [None], result.output  # a local Ray instance, never 192.0.2.1:6379

    result = invoke("rerun", str(folder), "--quiet", "--out", str(tmp_path / "again"), "--ray-address", "auto")
    assert joined[-1] == "auto"  # an address given on the command line is used


def test_rerun_ray_address_for_a_run_without_ray_is_refused(finished_run: Path, tmp_path: Path) -> None:
    line = one_error_line(invoke("rerun", str(finished_run), "--out", str(tmp_path / "x"), "--ray-address", "auto"))
    assert "--ray-address would be ignored" in line and "--executor sequential" in line
    assert not (tmp_path / "x").exists()


# ---------------------------------------------------------------------------- a full disk


class FullFile:
    """A file on a full disk: ``write`` fails with ENOSPC once ``room`` bytes were written."""

    def __init__(self, file: Any, room: int) -> None:
        self.file, self.room = file, room

    def write(self, data: Any) -> int:
        size = len(memoryview(data).cast("B"))
        if size > self.room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room -= size
        return self.file.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.file, name)

    def __enter__(self) -> FullFile:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.file.close()


def fill_disk(monkeypatch: pytest.MonkeyPatch, name: str, room: int, spare: int = 0) -> None:
    """Files whose temporary's name contains ``name`` are written on a full disk (``room`` bytes
    left), except the first ``spare`` of them."""
    if not Path("/proc/self/fd").is_dir():
        pytest.skip("needs /proc/self/fd to tell which file a descriptor is")
    real = os.fdopen
    opened = [0]

    def fdopen(fd: int, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        file = real(fd, mode, *args, **kwargs)
        if "w" in mode and name in os.readlink(f"/proc/self/fd/{fd}"):
            opened[0] += 1
            if opened[0] > spare:
                return FullFile(file, room)
        return file

    monkeypatch.setattr(os, "fdopen", fdopen)


def temporaries(root: Path) -> list[Path]:
    return [p for p in root.rglob("*.tmp") if p.is_file()]


@pytest.mark.parametrize("room", [0, 700], ids=["nothing written", "full halfway (torch: unexpected pos)"])
def test_a_full_disk_while_checkpointing_is_one_error_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, room: int
) -> None:
    fill_disk(monkeypatch, "checkpoint.pt", room)
    out = tmp_path / "out"
    result = invoke(*RUN[:-3], "--rounds", "3", "--checkpoint-every", "1", "--quiet", "--out", str(out))
    line = one_error_line(result)
    assert "checkpoint.pt" in line and "No space left on device" in line and "unexpected pos" not in line
    runs = out / "runs"
    assert temporaries(out) == [] and not list(runs.glob("*/checkpoint.pt"))  # nothing half written
    assert [p.name.startswith(".tmp-") for p in runs.iterdir() if p.is_dir()] == [True]  # nothing published


def test_a_full_disk_at_the_second_checkpoint_keeps_the_first_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pflbench.util.cache import load_entry

    fill_disk(monkeypatch, "checkpoint.pt", 700, spare=1)
    out = tmp_path / "out"
    result = invoke(*RUN[:-3], "--rounds", "4", "--checkpoint-every", "1", "--quiet", "--out", str(out))
    assert "No space left on device" in one_error_line(result)
    (checkpoint,) = (out / "runs").glob(".tmp-*/checkpoint.pt")
    tensors, meta = load_entry(checkpoint)  # type: ignore[misc]  # verified: the round-1 checkpoint, whole
    assert meta["next_round"] == 2 and temporaries(out) == []


def test_a_full_disk_while_caching_a_dataset_is_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from pflbench.data.dataset import load_dataset

    monkeypatch.setenv("PFLBENCH_CACHE", str(tmp_path / "cache"))
    fill_disk(monkeypatch, "digits-", 700)
    data = load_dataset("digits")
    assert len(data.labels) == 1797
    warning = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert len(warning) == 1 and "could not write cache file" in warning[0] and "No space left" in warning[0]
    assert list((tmp_path / "cache").iterdir()) == []  # no entry, no temporary


def test_a_writer_hiding_enospc_is_an_os_error_naming_the_file(tmp_path: Path, monkeypatch) -> None:
    import torch

    from pflbench.util.cache import save_entry

    fill_disk(monkeypatch, "entry.pt", 700)
    with pytest.raises(OSError) as raised:
        save_entry(tmp_path / "entry.pt", {"w": torch.ones(1000)}, {"kind": "x"})
    assert raised.value.errno == errno.ENOSPC and raised.value.filename == str(tmp_path / "entry.pt")
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------- bad files and options


def _png_claiming(width: int, height: int) -> bytes:
    """A 1×1 PNG whose header (IHDR) says ``width``×``height``: Pillow refuses it on open."""
    buffer = io.BytesIO()
    Image.new("RGB", (1, 1)).save(buffer, "PNG")
    data = bytearray(buffer.getvalue())
    ihdr = data.index(b"IHDR")
    data[ihdr + 4 : ihdr + 12] = struct.pack(">II", width, height)
    data[ihdr + 17 : ihdr + 21] = struct.pack(">I", zlib.crc32(bytes(data[ihdr : ihdr + 17])))
    return bytes(data)


def _domains(root: Path) -> None:
    for domain in ("art", "photo"):
        for label in ("cat", "dog"):
            folder = root / domain / label
            folder.mkdir(parents=True)
            for i in range(3):
                Image.fromarray(np.full((8, 8, 3), 40 * i, np.uint8)).save(folder / f"{i}.png")


def _truncated_jpeg() -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(buffer, "JPEG")
    return buffer.getvalue()[:600]


@pytest.mark.parametrize(
    "name, content",
    [("bomb.png", _png_claiming(100_000, 100_000)), ("cut.jpg", _truncated_jpeg())],
    ids=["claims 100000x100000", "truncated jpeg"],
)
def test_an_undecodable_image_names_its_file(tmp_path: Path, name: str, content: bytes) -> None:
    root = tmp_path / "images"
    _domains(root)
    (root / "photo" / "dog" / name).write_bytes(content)
    out = tmp_path / "out"
    argv = ["run", "--dataset", "imagefolder_domains", "--data-dir", str(root), "--partition", "domain"]
    result = invoke(*argv, "--model", "mlp", "--num-clients", "2", "--rounds", "1", "--out", str(out))
    line = one_error_line(result, notes="preparing dataset")  # the note is the progress display's
    assert str(root / "photo" / "dog" / name) in line, line
    assert not out.exists()


def test_a_config_file_that_is_not_utf8_is_one_error_line(tmp_path: Path) -> None:
    config = tmp_path / "latin1.toml"
    config.write_bytes("# réglages d'été\nrounds = 1\n".encode("latin-1"))
    line = one_error_line(invoke(*RUN, "--out", str(tmp_path / "out"), "--config", str(config)))
    assert str(config) in line and "not UTF-8" in line and "line 1" in line
    assert not (tmp_path / "out").exists()


def test_leaderboard_refuses_an_empty_metric(finished_run: Path) -> None:
    for option in (["--metric", ""], ["--metric", " "], ["--metrics", ""]):
        line = one_error_line(invoke("leaderboard", str(finished_run.parent), *option))
        assert "pers_acc" in line  # the valid names are given


def test_leaderboard_refuses_a_setting_of_the_wrong_type(finished_run: Path, tmp_path: Path) -> None:
    folder = tmp_path / "received" / "runs" / finished_run.name
    shutil.copytree(finished_run, folder)
    record = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**record, "alpha": "abc"}))
    line = one_error_line(invoke("leaderboard", str(tmp_path / "received")))
    assert str(folder) in line and "'alpha' must be a number" in line
    # beside a sound run: the table of the sound one, and a warning naming the damaged folder
    result = invoke("leaderboard", str(tmp_path / "received"), str(finished_run.parent))
    assert result.exit_code == 0 and f"warning: skipped {folder}: config.json: 'alpha'" in result.stderr


@pytest.mark.parametrize("option", ["--cpus-per-run", "--gpus-per-run"])
def test_sweep_resources_without_ray_are_refused(tmp_path: Path, option: str) -> None:
    argv = ["sweep", "--datasets", "digits", "--model", "mlp", "--num-clients", "3", "--rounds", "1"]
    line = one_error_line(invoke(*argv, "--algos", "fedavg", option, "2", "--out", str(tmp_path / "out")))
    assert f"{option} would be ignored" in line and "--ray" in line
    assert not (tmp_path / "out").exists()
