"""Caches hold no code, are verified on load, heal themselves and never go stale."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from PIL import Image

import pflbench.datasets.local_files as local_files
from pflbench.config.run_config import RunConfig
from pflbench.data.dataset import TensorDataset, cache_dir, load_dataset
from pflbench.data.partitioners import public_split
from pflbench.errors import ConfigError
from pflbench.models.pretrain import pretrain_backbone
from pflbench.models.zoo import build_model, load_weights
from pflbench.registry import DATASETS, register_dataset
from pflbench.util import cache
from pflbench.util.atomic import atomic_write

REPO = Path(__file__).resolve().parents[2]
CONVERSIONS: list[int] = []  # one entry per call of the probe loader
PROBE_INPUTS = torch.arange(7 * 5 * 4 * 4, dtype=torch.int64).remainder(251).to(torch.uint8).reshape(35, 1, 4, 4)


def cache_probe(seed: int = 0) -> TensorDataset:
    """A tiny dataset whose conversions are counted; string groups and info as real ones have."""
    CONVERSIONS.append(seed)
    return TensorDataset(
        inputs=PROBE_INPUTS.clone(),
        labels=torch.arange(35) % 5,
        num_classes=5,
        source=f"probe {seed}",
        groups=np.array([f"w{i % 3}" for i in range(35)]),
        info={"classes": list("abcde"), "seed": seed},
    )


class Poison:
    """Unpickling this would create ``marker``: what a hostile file in a shared cache does."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.fixture
def fresh_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty cache folder, with the probe dataset registered for this test only."""
    monkeypatch.setenv("PFLBENCH_CACHE", str(tmp_path / "cache"))
    CONVERSIONS.clear()
    register_dataset("cache_probe")(cache_probe)
    yield tmp_path / "cache"
    DATASETS._items.pop("cache_probe", None)


def only_entry(folder: Path) -> Path:
    (path,) = [p for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")]
    return path


def warning_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.strip()]


def assert_same(a: TensorDataset, b: TensorDataset) -> None:
    assert torch.equal(a.inputs, b.inputs) and torch.equal(a.labels, b.labels)
    assert a.inputs.dtype == b.inputs.dtype and a.labels.dtype == b.labels.dtype
    assert (a.num_classes, a.source, a.info) == (b.num_classes, b.source, b.info)
    assert np.array_equal(a.groups, b.groups) and a.groups.dtype == b.groups.dtype


def test_no_unrestricted_torch_load_anywhere_in_the_repo() -> None:
    needle = "weights_only=" + "False"
    offenders = [
        str(p)
        for folder in ("pflbench", "algorithms", "datasets", "tests", "benchmarks")
        for p in (REPO / folder).rglob("*.py")
        if needle in p.read_text()
    ]
    assert offenders == []


def test_cache_round_trip_is_exact_and_skips_the_loader(fresh_cache: Path, capsys) -> None:
    first = load_dataset("cache_probe")
    second = load_dataset("cache_probe")
    assert CONVERSIONS == [0]
    assert_same(first, second)
    assert capsys.readouterr().err == ""
    tensors, meta = cache.load_entry(only_entry(fresh_cache))
    assert meta["sha256"] == cache.content_hash(tensors, meta)


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _flip_bit_in_the_images(path: Path) -> None:
    data = bytearray(path.read_bytes())
    at = bytes(data).find(PROBE_INPUTS.numpy().tobytes())
    assert at >= 0
    data[at + 100] ^= 0x04
    path.write_bytes(bytes(data))


def _garbage(path: Path) -> None:
    path.write_bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes())


def _empty(path: Path) -> None:
    path.write_bytes(b"")


def _plain_pickle_poison(path: Path) -> None:
    path.write_bytes(pickle.dumps(Poison(path.parent / "PWNED")))


def _torch_zip_poison(path: Path) -> None:
    torch.save({"state_dict": {}, "meta": Poison(path.parent / "PWNED")}, path)


def _valid_but_other_key(path: Path) -> None:
    tensors, meta = cache.load_entry(path)
    cache.save_entry(
        path, tensors, {**{k: v for k, v in meta.items() if k != "sha256"}, "key": {"name": "something else"}}
    )


def _numbers_changed_hash_kept(path: Path) -> None:
    tensors, meta = cache.load_entry(path)
    tensors["labels"] = torch.zeros_like(tensors["labels"])  # same hash, other numbers
    torch.save({"state_dict": tensors, "meta": meta}, path)


@pytest.mark.parametrize(
    "damage",
    [
        _truncate,
        _flip_bit_in_the_images,
        _garbage,
        _empty,
        _plain_pickle_poison,
        _torch_zip_poison,
        _valid_but_other_key,
        _numbers_changed_hash_kept,
    ],
)
def test_a_bad_dataset_cache_entry_is_reported_deleted_and_rebuilt(fresh_cache: Path, capsys, recwarn, damage) -> None:
    original = load_dataset("cache_probe")
    path = only_entry(fresh_cache)
    damage(path)
    capsys.readouterr()
    rebuilt = load_dataset("cache_probe")
    err = capsys.readouterr().err
    lines = warning_lines(err)
    assert len(lines) == 1 and lines[0].startswith("warning: ") and str(path) in lines[0], err
    assert "Traceback" not in err and len(recwarn) == 0  # no extra Python warnings either
    assert not (fresh_cache / "PWNED").exists()  # the poisoned pickle never ran
    assert CONVERSIONS == [0, 0]  # rebuilt from the loader, not served from the bad file
    assert_same(original, rebuilt)
    again = load_dataset("cache_probe")  # the rebuilt entry is whole and verified
    assert CONVERSIONS == [0, 0] and capsys.readouterr().err == ""
    assert_same(original, again)


def test_a_killed_writer_leaves_the_previous_entry_whole(fresh_cache: Path) -> None:
    load_dataset("cache_probe")
    path = only_entry(fresh_cache)
    before = path.read_bytes()

    def dies_half_way(file) -> None:
        file.write(before[: len(before) // 2])
        raise KeyboardInterrupt  # as a SIGINT/SIGKILL mid-write would leave it

    with pytest.raises(KeyboardInterrupt):
        atomic_write(path, dies_half_way)
    assert path.read_bytes() == before
    assert sorted(p.name for p in fresh_cache.iterdir()) == [path.name]
    # a temporary file left by a writer killed outright is never taken for the entry, and is
    # cleaned up once it is clearly abandoned (a young one may be another writer's, at work)
    old, young = fresh_cache / f".{path.name}.abc123.tmp", fresh_cache / f".{path.name}.def456.tmp"
    for temporary in (old, young):
        temporary.write_bytes(before[:100])
    os.utime(old, (old.stat().st_atime, old.stat().st_mtime - 7200))
    path.unlink()
    load_dataset("cache_probe")
    assert CONVERSIONS == [0, 0] and path.read_bytes() != b""
    assert not old.exists() and young.exists()


def test_an_unwritable_cache_costs_speed_not_the_run(
    fresh_cache: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full_disk(path, write):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(cache, "atomic_write", full_disk)
    dataset = load_dataset("cache_probe")
    assert dataset.num_classes == 5
    (line,) = warning_lines(capsys.readouterr().err)
    assert line.startswith("warning: could not write cache file") and "No space left" in line


# ----------------------------------------------------------------------------- backbones


def test_a_bad_backbone_cache_entry_is_reported_and_retrained(fresh_cache: Path, capsys) -> None:
    dataset = load_dataset("digits")
    config = RunConfig(dataset="digits", model="mlp", public_frac=0.1, pretrain_epochs=1)
    _, public = public_split(dataset.labels.numpy(), config.public_frac, config.seed)
    first = pretrain_backbone(config, dataset, public, torch.device("cpu"))
    assert not first.from_cache and first.path.parent == cache_dir() / "backbones"
    state = torch.load(first.path, weights_only=True)["state_dict"]
    assert pretrain_backbone(config, dataset, public, torch.device("cpu")).from_cache
    weight = next(t for t in state.values() if t.numel() > 100)
    data = bytearray(first.path.read_bytes())
    at = bytes(data).find(weight.numpy().tobytes())
    data[at + 7] ^= 0x10
    first.path.write_bytes(bytes(data))
    capsys.readouterr()
    second = pretrain_backbone(config, dataset, public, torch.device("cpu"))
    (line,) = warning_lines(capsys.readouterr().err)
    assert line.startswith("warning: ") and str(first.path) in line
    assert not second.from_cache and second.val_accuracy == first.val_accuracy
    rebuilt = torch.load(second.path, weights_only=True)["state_dict"]
    assert all(torch.equal(state[n], rebuilt[n]) for n in state)
    _torch_zip_poison(second.path)
    third = pretrain_backbone(config, dataset, public, torch.device("cpu"))
    assert not third.from_cache and not (second.path.parent / "PWNED").exists()
    assert str(second.path) in capsys.readouterr().err


def test_a_backbone_that_cannot_be_cached_is_used_from_memory(
    fresh_cache: Path, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pflbench.models import pretrain
    from pflbench.runs.api import run_experiment

    settings = dict(
        algo="flexlora", dataset="digits", model="mlp", num_clients=3, rounds=1, public_frac=0.1,
        pretrain_epochs=1, lora_targets="fc1,fc2", backbone="public",
    )  # fmt: skip
    cached = run_experiment(RunConfig(out=str(tmp_path / "cached"), **settings))
    for entry in (cache_dir() / "backbones").iterdir():
        entry.unlink()

    def full_disk(path, data):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pretrain, "atomic_write_bytes", full_disk)
    capsys.readouterr()
    in_memory = run_experiment(RunConfig(out=str(tmp_path / "memory"), **settings))
    (line,) = warning_lines(capsys.readouterr().err)
    assert "could not write the pretrained backbone" in line and "No space left" in line
    assert not list((cache_dir() / "backbones").iterdir())
    assert in_memory["pers_acc"] == cached["pers_acc"]  # the same weights, from memory
    (folder,) = (tmp_path / "memory" / "runs").iterdir()
    backbone = json.loads((folder / "config.json").read_text())["resolved"]["backbone"]
    (cached_folder,) = (tmp_path / "cached" / "runs").iterdir()
    cached_backbone = json.loads((cached_folder / "config.json").read_text())["resolved"]["backbone"]
    assert backbone["cache"] == "not written (kept in memory)" and backbone["sha256"] == cached_backbone["sha256"]


def test_weights_file_with_a_content_hash_is_verified(tmp_path: Path) -> None:
    model = build_model("mlp", (8,), 3)
    path = tmp_path / "weights.pt"
    cache.save_entry(path, model.state_dict(), {"note": "mine"})
    assert load_weights(build_model("mlp", (8,), 3), path)["meta"]["note"] == "mine"
    state, meta = torch.load(path, weights_only=True).values()
    first = next(iter(state))
    state[first] = state[first] + 1
    torch.save({"state_dict": state, "meta": meta}, path)
    with pytest.raises(ConfigError, match="is corrupted: its content hash does not match"):
        load_weights(build_model("mlp", (8,), 3), path)


# ----------------------------------------------------------------------------- local data


def _image_folder(root: Path, shade: int) -> Path:
    for label, name in enumerate(["cat", "dog"]):
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(2):
            pixels = np.full((4, 4, 3), shade + 10 * label + i, dtype=np.uint8)
            Image.fromarray(pixels).save(root / name / f"{i}.png")
    return root


@pytest.fixture
def count_decodes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = local_files.decode_images

    def spy(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(local_files, "decode_images", spy)
    return calls


def test_imagefolder_cache_follows_the_files(fresh_cache: Path, tmp_path: Path, count_decodes) -> None:
    root = _image_folder(tmp_path / "pets", shade=0)
    first = load_dataset("imagefolder", {"path": str(root)})
    load_dataset("imagefolder", {"path": str(root)})
    assert len(count_decodes) == 1
    image = root / "dog" / "1.png"
    stat = image.stat()
    os.utime(image, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # touched: same bytes
    load_dataset("imagefolder", {"path": str(root)})
    assert len(count_decodes) == 2
    Image.fromarray(np.full((4, 4, 3), 200, dtype=np.uint8)).save(image)  # rewritten
    changed = load_dataset("imagefolder", {"path": str(root)})
    assert len(count_decodes) == 3 and int(changed.inputs[3].max()) == 200
    assert not torch.equal(first.inputs, changed.inputs)
    (root / "dog" / "2.png").write_bytes(image.read_bytes())  # a file added
    assert len(load_dataset("imagefolder", {"path": str(root)}).labels) == 5


def test_same_relative_path_in_another_folder_is_not_served_from_the_cache(
    fresh_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, count_decodes
) -> None:
    for shade, project in ((0, "a"), (100, "b")):
        _image_folder(tmp_path / project / "data", shade)
    monkeypatch.chdir(tmp_path / "a")
    from_a = load_dataset("imagefolder", {"path": "data"})
    monkeypatch.chdir(tmp_path / "b")
    from_b = load_dataset("imagefolder", {"path": "data"})
    assert len(count_decodes) == 2
    assert int(from_a.inputs.max()) < 100 <= int(from_b.inputs.min())
    assert str(tmp_path / "b" / "data") in from_b.source


def test_parquet_cache_follows_the_files(fresh_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def write(folder: Path, offset: float) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        table = pa.table({"x": [offset + i for i in range(6)], "label": [0, 1] * 3, "writer": ["u", "v", "w"] * 2})
        pq.write_table(table, folder / "part.parquet")

    write(tmp_path / "one" / "tab", 0.0)
    write(tmp_path / "two" / "tab", 50.0)
    monkeypatch.chdir(tmp_path / "one")
    options = {"path": "tab", "feature_columns": "x", "group_column": "writer"}
    first = load_dataset("parquet", options)
    cached = load_dataset("parquet", options)
    assert torch.equal(first.inputs, cached.inputs) and list(cached.groups) == list(first.groups)
    monkeypatch.chdir(tmp_path / "two")
    assert float(load_dataset("parquet", options).inputs.min()) == 50.0
    write(tmp_path / "two" / "tab", 70.0)  # rewritten in place
    assert float(load_dataset("parquet", options).inputs.min()) == 70.0


def test_fingerprint_names_size_and_mtime_of_every_file(tmp_path: Path) -> None:
    root = _image_folder(tmp_path / "pets", shade=0)
    fingerprint = local_files.files_fingerprint(root)
    assert fingerprint["root"] == str(root)
    assert [name for name, _, _ in fingerprint["files"]] == ["cat/0.png", "cat/1.png", "dog/0.png", "dog/1.png"]
    stat = (root / "cat" / "0.png").stat()
    assert fingerprint["files"][0][1:] == [stat.st_size, stat.st_mtime_ns]


def test_written_files_follow_the_umask(tmp_path: Path) -> None:
    import os

    import torch

    from pflbench.util.atomic import atomic_write_text
    from pflbench.util.cache import save_entry

    old = os.umask(0o022)
    try:
        atomic_write_text(tmp_path / "summary.json", "{}")
        save_entry(tmp_path / "entry.pt", {"w": torch.ones(2)}, {"kind": "x"})
    finally:
        os.umask(old)
    assert (tmp_path / "summary.json").stat().st_mode & 0o777 == 0o644  # not mkstemp's 0600
    assert (tmp_path / "entry.pt").stat().st_mode & 0o777 == 0o644


def test_an_unreadable_entry_is_never_deleted(tmp_path: Path, capsys) -> None:
    import os

    import torch

    from pflbench.util.cache import load_entry, save_entry

    save_entry(tmp_path / "entry.pt", {"w": torch.ones(2)}, {"kind": "x"})
    if os.geteuid() == 0:
        pytest.skip("root reads every file: the permission case cannot be built here")
    (tmp_path / "entry.pt").chmod(0o000)
    assert load_entry(tmp_path / "entry.pt") is None
    assert (tmp_path / "entry.pt").exists() and "permission denied" in capsys.readouterr().err


def test_a_full_disk_while_saving_an_entry_is_an_os_error(tmp_path: Path, monkeypatch) -> None:
    import errno

    import torch

    from pflbench.util import cache

    def full(*args, **kwargs):
        raise RuntimeError(
            "[enforce fail at inline_container.cc:664] . unexpected pos 64 vs 0: No space left on device"
        )

    monkeypatch.setattr(cache.torch, "save", full)
    with pytest.raises(OSError) as raised:
        cache.save_entry(tmp_path / "entry.pt", {"w": torch.ones(2)}, {"kind": "x"})
    assert raised.value.errno == errno.ENOSPC and not list(tmp_path.iterdir())  # no temporary left
