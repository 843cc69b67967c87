"""``pflbench.load_model(RUN_DIR, client=k)``: a saved model, usable alone.

From the files ``--save-model`` wrote (``RUN_DIR/models/``, see ``runs.export``) it rebuilds the
run's model (the zoo or timm model, then the algorithm's own changes such as LoRA layers, from
``meta.json``'s ``build``), loads the weights client k was evaluated with (``client=None``: the
global model) with ``strict=True``, and returns it in eval mode with its input transform::

    model, transform = pflbench.load_model("results/runs/fedper__digits__...", client=3)
    with torch.no_grad():
        predicted = model(transform(raw_images)).argmax(1)   # raw uint8 [N, C, H, W]
    transform.classes                                        # class index → name, or None

``transform`` (``models.preprocessing.InputTransform``) maps the dataset's raw inputs (uint8
images [N, C, H, W], float features [N, D], token ids [N, L]) to the model's inputs exactly as the
run did. Nothing but the ``models`` folder is read (no data, no config.json). A plugin
algorithm's model needs its file: ``plugins=("my_algo.py",)``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from pflbench.config.run_config import RunConfig, hyperparameters_from, recorded_fields, recorded_options
from pflbench.config.value_types import json_kind
from pflbench.errors import ConfigError
from pflbench.models.preprocessing import KINDS, InputTransform
from pflbench.models.saving import META_FILE, load_model_state, models_folder, read_models_meta
from pflbench.models.zoo import build_model
from pflbench.registry import ALGORITHMS, load_plugin_file


@dataclasses.dataclass(frozen=True)
class LoadedModel:
    """A saved model and its input transform; unpacks as ``model, transform``."""

    model: nn.Module  # in eval mode, on the requested device
    transform: InputTransform
    client: int | None  # None: the global model
    meta: dict[str, Any]  # models/meta.json's ``meta`` (algorithm, run, identity hash, ...)

    def __iter__(self) -> Iterator[Any]:
        return iter((self.model, self.transform))

    @property
    def classes(self) -> tuple[str, ...] | None:
        return self.transform.classes

    @torch.no_grad()
    def predict(self, raw_inputs: Any) -> torch.Tensor:
        """Predicted class indices of raw inputs ``[N, *input_shape]``."""
        device = next(iter(self.model.state_dict().values())).device
        return self.model(self.transform(torch.as_tensor(raw_inputs).to(device))).argmax(dim=1)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _positive_ints(value: Any, key: str, where: Any) -> list[int]:
    if not isinstance(value, list) or not all(type(n) is int and n > 0 for n in value):
        raise ConfigError(f"{where}: {key} must be a list of positive integers, got {_shown(value)}")
    return value


def build_saved_model(meta: dict[str, Any], where: Any = f"models/{META_FILE}") -> nn.Module:
    """The run's model with its initial structure (weights to be loaded), from meta ``build``;
    ConfigError naming ``where`` (the meta.json) when the record cannot describe a model."""
    build = meta.get("build")
    if not isinstance(build, dict) or not isinstance(build.get("config"), dict):
        raise ConfigError(f"{where}: meta.build.config must be an object of run settings, got {_shown(build)}")
    hparams_record = build.get("algo_hparams") or {}
    if not isinstance(hparams_record, dict):
        raise ConfigError(f"{where}: meta.build.algo_hparams must be an object, not {json_kind(hparams_record)}")
    input_shape = _positive_ints(meta.get("input_shape"), "meta.input_shape", where)
    num_classes = meta.get("num_classes")
    if type(num_classes) is not int or num_classes < 1:
        raise ConfigError(f"{where}: meta.num_classes must be a positive integer, got {_shown(num_classes)}")
    try:
        config = RunConfig(**recorded_fields(build["config"]))
        if config.model is None:
            raise ConfigError("names no model (build.config.model is null)")
        algorithm_class = ALGORITHMS.get(config.algo)
        options = recorded_options(hparams_record)
        hparams = hyperparameters_from(algorithm_class.hyperparameters, options, config.algo)
        with torch.random.fork_rng(devices=[]):  # building draws initial weights: not the caller's stream
            model = build_model(config.model, tuple(input_shape), num_classes, **config.model_options())
            algorithm_class.configure_model(model, config, hparams)
    except (TypeError, ValueError, KeyError, AttributeError, RuntimeError) as error:  # ConfigError too
        reason = " ".join(str(error).split())[:300] or type(error).__name__
        raise ConfigError(f"{where}: the build record does not describe a model pflbench can build: {reason}") from None
    return model


def saved_input_transform(meta: dict[str, Any], where: Any = f"models/{META_FILE}") -> InputTransform:
    """meta ``inputs`` as the ``InputTransform`` the run applied; ConfigError naming ``where``
    unless every part is well formed: mean/std one finite number per ``stats_shape`` entry, std
    > 0 (it divides), ``stats_shape`` broadcasting over ``input_shape``, a torch dtype, a known kind."""
    inputs = meta.get("inputs")
    if not isinstance(inputs, dict):
        raise ConfigError(f"{where}: meta.inputs must be an object, not {json_kind(inputs)}")
    if inputs.get("kind") not in KINDS:
        raise ConfigError(f"{where}: inputs.kind {_shown(inputs.get('kind'))} is not one of {', '.join(KINDS)}")
    shape = _positive_ints(inputs.get("stats_shape"), "inputs.stats_shape", where)
    input_shape = _positive_ints(inputs.get("input_shape"), "inputs.input_shape", where)
    if (
        len(shape) != len(input_shape) + 1
        or shape[0] != 1
        or any(s not in (1, n) for s, n in zip(shape[1:], input_shape))
    ):
        raise ConfigError(f"{where}: inputs.stats_shape {shape} does not broadcast over inputs [N, *{input_shape}]")
    size = math.prod(shape)
    for key in ("mean", "std"):
        values = inputs.get(key)
        if not (
            isinstance(values, list)
            and len(values) == size
            and all(type(v) in (int, float) and math.isfinite(v) for v in values)
        ):
            raise ConfigError(
                f"{where}: inputs.{key} must be {size} finite numbers (stats_shape {shape}), got {_shown(values)}"
            )
    if any(v <= 0 for v in inputs["std"]):
        raise ConfigError(
            f"{where}: inputs.std must be > 0 (the inputs are divided by it), got {_shown(inputs['std'])}"
        )
    if not isinstance(getattr(torch, str(inputs.get("input_dtype")), None), torch.dtype):
        raise ConfigError(f"{where}: inputs.input_dtype {_shown(inputs.get('input_dtype'))} is not a torch dtype")
    classes = inputs.get("classes")
    if classes is not None and not (isinstance(classes, list) and all(isinstance(c, str) for c in classes)):
        raise ConfigError(f"{where}: inputs.classes must be a list of names or null, got {_shown(classes)}")
    return InputTransform.from_json(inputs)


def load_model(
    run_dir: str | Path, client: int | None = None, device: str = "cpu", plugins: Sequence[str | Path] = ()
) -> LoadedModel:
    """Client ``client``'s model (the one its ``pers_acc`` in clients.csv measures) or, with
    ``client=None``, the global model, from ``RUN_DIR/models/``; with its input transform.

    Raises ``ConfigError`` (one line naming the file) when the folder holds no saved models, was
    saved by an older pflbench, has no such client, the algorithm has no global model, or a file
    is damaged: meta.json malformed, a weights file unreadable, truncated, a pickle, a folder, or
    named outside the models folder (refused before anything there is read)."""
    try:
        record = read_models_meta(run_dir)
    except (FileNotFoundError, ValueError) as error:
        raise ConfigError(str(error)) from None
    where = models_folder(run_dir) / META_FILE
    meta = record["meta"]
    if "build" not in meta or "inputs" not in meta:
        raise ConfigError(
            f"{run_dir}: models saved by an older pflbench (no input transform or build record); "
            "run again with --save-model (pflbench rerun RUN_DIR --save-model)"
        )
    for path in plugins:
        load_plugin_file(path)
    transform = saved_input_transform(meta, where)
    try:
        state = load_model_state(run_dir, client)
    except ValueError as error:
        raise ConfigError(str(error)) from None
    model = build_saved_model(meta, where)
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as error:  # missing/unexpected names, other shapes: the files do not fit the record
        reason = " ".join(str(error).split())[:300]
        raise ConfigError(
            f"{where.parent}: the saved weights do not fit the model meta.json describes: {reason}"
        ) from None
    model.to(torch.device(device)).eval()
    return LoadedModel(model, transform, client, meta)
