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
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from pflbench.config.run_config import RunConfig, hyperparameters_from, recorded_fields, recorded_options
from pflbench.errors import ConfigError
from pflbench.models.preprocessing import InputTransform
from pflbench.models.saving import load_model_state, read_models_meta
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


def build_saved_model(meta: dict[str, Any]) -> nn.Module:
    """The run's model with its initial structure (weights to be loaded), from meta ``build``."""
    config = RunConfig(**recorded_fields(meta["build"]["config"]))
    if config.model is None:
        raise ConfigError("models/meta.json names no model (build.config.model is null)")
    algorithm_class = ALGORITHMS.get(config.algo)
    options = recorded_options(meta["build"].get("algo_hparams") or {})
    hparams = hyperparameters_from(algorithm_class.hyperparameters, options, config.algo)
    with torch.random.fork_rng(devices=[]):  # building draws initial weights: not the caller's stream
        model = build_model(
            config.model, tuple(meta["input_shape"]), int(meta["num_classes"]), **config.model_options()
        )
        algorithm_class.configure_model(model, config, hparams)
    return model


def load_model(
    run_dir: str | Path, client: int | None = None, device: str = "cpu", plugins: Sequence[str | Path] = ()
) -> LoadedModel:
    """Client ``client``'s model (the one its ``pers_acc`` in clients.csv measures) or, with
    ``client=None``, the global model, from ``RUN_DIR/models/``; with its input transform.

    Raises ``ConfigError`` (one line) when the folder holds no saved models, was saved by an
    older pflbench, has no such client, or the algorithm has no global model."""
    try:
        record = read_models_meta(run_dir)
    except (FileNotFoundError, ValueError) as error:
        raise ConfigError(str(error)) from None
    meta = record.get("meta", {})
    if "build" not in meta or "inputs" not in meta:
        raise ConfigError(
            f"{run_dir}: models saved by an older pflbench (no input transform or build record); "
            "run again with --save-model (pflbench rerun RUN_DIR --save-model)"
        )
    for path in plugins:
        load_plugin_file(path)
    try:
        state = load_model_state(run_dir, client)
    except ValueError as error:
        raise ConfigError(str(error)) from None
    model = build_saved_model(meta)
    model.load_state_dict(state, strict=True)
    model.to(torch.device(device)).eval()
    return LoadedModel(model, InputTransform.from_json(meta["inputs"]), client, meta)
