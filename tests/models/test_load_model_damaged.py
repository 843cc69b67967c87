"""``pflbench.load_model`` on a damaged or hostile ``models/`` folder (issue 34): every case is one
``ConfigError`` line naming the file, never a raw exception; a weights path that leaves the
models folder is refused before anything there is read, and a pickle is never run.

One FedPer run is saved once (its client 0 loads ``shared.safetensors`` + ``clients/0.safetensors``);
each case damages a copy of its ``models/`` folder.
"""

from __future__ import annotations

import json
import pickle
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

import pflbench
from pflbench.config.run_config import RunConfig
from pflbench.errors import ConfigError
from pflbench.runs.api import run_experiment


@pytest.fixture(scope="module")
def saved_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("saved")
    config = RunConfig(
        algo="fedper", dataset="digits", model="mlp", num_clients=3, rounds=1, out=str(out), save_model=True
    )
    run_experiment(config)
    (run_dir,) = (out / "runs").iterdir()
    return run_dir / "models"


def _edit_meta(change: Callable[[dict[str, Any]], None]) -> Callable[[Path], None]:
    def apply(models: Path) -> None:
        record = json.loads((models / "meta.json").read_text())
        change(record)
        (models / "meta.json").write_text(json.dumps(record))  # NaN written as NaN, as Python's json reads it

    return apply


def _set(path: str, value: Any) -> Callable[[Path], None]:
    """meta.json with the value at ``path`` (dotted keys) replaced; ``...``: removed."""

    def change(record: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        target = record
        for key in parents:
            target = target[key]
        if value is ...:
            del target[last]
        else:
            target[last] = value

    return _edit_meta(change)


def _write(name: str, content: bytes) -> Callable[[Path], None]:
    def apply(models: Path) -> None:
        (models / name).write_bytes(content)

    return apply


def _truncate(name: str) -> Callable[[Path], None]:
    def apply(models: Path) -> None:
        data = (models / name).read_bytes()
        (models / name).write_bytes(data[: len(data) // 2])

    return apply


def _directory(name: str) -> Callable[[Path], None]:
    def apply(models: Path) -> None:
        (models / name).unlink()
        (models / name).mkdir()
        (models / name / "x").write_text("x")

    return apply


class _Touch:
    """A pickle that, if unpickled by a plain ``pickle.load``, would create ``marker``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (self.marker,))


def _pickle_personal(models: Path) -> None:
    marker = models.parent / "pickle-ran"
    (models / "clients" / "0.pt").write_bytes(pickle.dumps({"fc": _Touch(marker)}))
    _set("meta.personal.0", "clients/0.pt")(models)


def _torch_pickle_personal(models: Path) -> None:
    marker = models.parent / "pickle-ran"
    torch.save({"fc": _Touch(marker)}, models / "clients" / "0.pt")
    _set("meta.personal.0", "clients/0.pt")(models)


def _valid_file_outside(models: Path) -> None:
    """A perfectly loadable weights file outside the models folder, named by a ``..`` path: refused
    for where it is, not for what it holds."""
    outside = models.parent.parent / "outside.safetensors"
    shutil.copy(models / "clients" / "0.safetensors", outside)
    _set("meta.personal.0", "../../outside.safetensors")(models)


def _link_outside(models: Path) -> None:
    outside = models.parent.parent / "linked.safetensors"
    shutil.copy(models / "clients" / "0.safetensors", outside)
    (models / "clients" / "0.safetensors").unlink()
    (models / "clients" / "0.safetensors").symlink_to(outside)


def _wrong_tensors(models: Path) -> None:
    save_file({"nonsense": torch.zeros(2)}, str(models / "clients" / "0.safetensors"))


def _wrong_shapes(models: Path) -> None:
    from safetensors.torch import load_file

    state = load_file(str(models / "clients" / "0.safetensors"))
    save_file(
        {name: torch.zeros(*[n + 1 for n in t.shape]) for name, t in state.items()},
        str(models / "clients" / "0.safetensors"),
    )


CASES: dict[str, Callable[[Path], None]] = {
    "meta.json not JSON": _write("meta.json", b"{not json"),
    "meta.json empty": _write("meta.json", b""),
    "meta.json a list": _write("meta.json", b"[1, 2]"),
    "meta.json null": _write("meta.json", b"null"),
    "meta.json not UTF-8": _write("meta.json", b'{"meta": "\xff\xfe"}'),
    "meta.json nested deeply": _write("meta.json", b"[" * 100_000 + b"]" * 100_000),
    "meta a list": _set("meta", [1]),
    "files missing": _set("files", ...),
    "build without config": _set("meta.build.config", ...),
    "build.config a list": _set("meta.build.config", [1]),
    "build.config.model a number": _set("meta.build.config.model", 5),
    "build.config.algo unknown": _set("meta.build.config.algo", "nope"),
    "algo_hparams a list": _set("meta.build.algo_hparams", [1]),
    "input_shape strings": _set("meta.input_shape", ["a"]),
    "num_classes 0": _set("meta.num_classes", 0),
    "inputs a string": _set("meta.inputs", "x"),
    "inputs.mean wrong length": _set("meta.inputs.mean", [0.1, 0.2, 0.3]),
    "inputs.mean strings": _set("meta.inputs.mean", ["a"]),
    "inputs.std [0]": _set("meta.inputs.std", [0]),
    "inputs.std negative": _set("meta.inputs.std", [-0.5]),
    "inputs.std NaN": _set("meta.inputs.std", [float("nan")]),
    "inputs.std inf": _set("meta.inputs.std", [float("inf")]),
    "inputs.kind unknown": _set("meta.inputs.kind", "audio"),
    "inputs.stats_shape not broadcasting": _set("meta.inputs.stats_shape", [1, 1, 3, 1]),
    "inputs.input_dtype a torch function": _set("meta.inputs.input_dtype", "save"),
    "inputs.classes an object": _set("meta.inputs.classes", {"a": 1}),
    "personal a list": _set("meta.personal", ["clients/0.safetensors"]),
    "personal a number": _set("meta.personal.0", 5),
    "personal ../../../../etc/passwd": _set("meta.personal.0", "../../../../etc/passwd"),
    "personal absolute /etc/passwd": _set("meta.personal.0", "/etc/passwd"),
    "personal a valid file outside": _valid_file_outside,
    "personal a link outside": _link_outside,
    "personal .npy": _set("meta.personal.0", "clients/0.npy"),
    "personal_base escaping": _set("meta.personal_base", "../shared.safetensors"),
    "personal file missing": _set("meta.personal.0", "clients/9.safetensors"),
    "truncated safetensors": _truncate("clients/0.safetensors"),
    "truncated base": _truncate("shared.safetensors"),
    "garbage safetensors": _write("clients/0.safetensors", b"\x00" * 64),
    "huge safetensors header": _write("clients/0.safetensors", (2**62).to_bytes(8, "little") + b"{}"),
    "a folder named 0.safetensors": _directory("clients/0.safetensors"),
    "a plain pickle": _pickle_personal,
    "a torch pickle of code": _torch_pickle_personal,
    "tensors of other names": _wrong_tensors,
    "tensors of other shapes": _wrong_shapes,
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_damaged_models_folder_is_one_config_error_naming_the_file(
    case: str, saved_models: Path, tmp_path: Path
) -> None:
    models = tmp_path / "run" / "models"
    shutil.copytree(saved_models, models, symlinks=True)
    CASES[case](models)
    with pytest.raises(ConfigError) as raised:
        pflbench.load_model(models.parent, client=0)
    message = str(raised.value)
    assert "\n" not in message and str(models) in message, message
    assert not (models.parent / "pickle-ran").exists()


def test_escaping_paths_are_refused_before_reading(saved_models: Path, tmp_path: Path, monkeypatch) -> None:
    """Nothing is read at a path outside the models folder: the reader is never called with one."""
    from pflbench.models import saving

    read: list[Path] = []
    real = saving.load_tensors
    monkeypatch.setattr(saving, "load_tensors", lambda path: read.append(Path(path)) or real(path))
    models = tmp_path / "run" / "models"
    shutil.copytree(saved_models, models)
    _valid_file_outside(models)
    with pytest.raises(ConfigError, match=r"is not a \.safetensors or \.pt file inside the models folder"):
        pflbench.load_model(models.parent, client=0)
    assert read == []  # not even the base was read: every file is checked first


def test_the_undamaged_copy_loads(saved_models: Path, tmp_path: Path) -> None:
    """The cases' baseline: the same copy, undamaged, loads (so each case fails for its damage)."""
    models = tmp_path / "run" / "models"
    shutil.copytree(saved_models, models)
    loaded = pflbench.load_model(models.parent, client=0)
    assert loaded.transform.std.gt(0).all()
