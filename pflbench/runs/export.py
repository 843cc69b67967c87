"""``--save-model``: a finished run's weights into ``RUN_DIR/models/`` (``saving.save_run_models``).

Written after the last round, before ``summary.json`` (a finished run folder holds its models):

- ``global.safetensors``: the final global model, ``algorithm.global_model()`` completed with
  the tensors nobody trains (a LoRA run's frozen backbone, integer buffers) so it loads into a
  fresh model with ``strict=True``, for algorithms that have one (not ``local``);
- ``shared.safetensors``: for algorithms without a global model that still share tensors
  (FedPer, FedBN), every tensor but the private ones (the final ``algorithm.global_state``
  and the untrained rest), so that ``{**shared, **clients[k]}`` is client k's model (meta
  ``shared_file``; a client that never trained has the initial private tensors);
- ``clients/<k>.safetensors``: client k's private state as the algorithm keeps it between
  rounds (``algorithm.store``: e.g. FedPer's head, FedBN's BatchNorm layers, SCAFFOLD's control
  variates), for every client that trained and has private tensors;
- ``meta.json``: what was saved plus the run's identity, model and layout (``meta``);
- LoRA runs with a global model also get ``peft_global/`` (a peft adapter of the global model,
  ``saving.export_peft_adapter``) and ``base_model.safetensors`` (the backbone under its original
  names, which ``PeftModel.from_pretrained`` wraps: the backbone came from public pretraining,
  not from the hub).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from pflbench.config.identity import identity_hash, run_identity
from pflbench.models.lora import lora_layers, parse_targets
from pflbench.models.saving import (
    base_model_state,
    export_peft_adapter,
    save_run_models,
    save_tensors,
)
from pflbench.store.layout import MODELS_DIR

SHARED_FILE = "shared.safetensors"


def models_meta(prepared: Any) -> dict[str, Any]:
    config, algorithm = prepared.config, prepared.algorithm
    identity = run_identity(config, type(algorithm), algorithm.hparams)
    return {
        "run": prepared.run_dir.name,
        "algo": config.algo,
        "dataset": config.dataset,
        "model": config.model,
        "model_options": config.model_options(),
        "input_shape": list(prepared.dataset.input_shape),
        "num_classes": prepared.dataset.num_classes,
        "rounds": config.rounds,
        "identity_hash": identity_hash(identity),
        "has_global_model": bool(algorithm.has_global_model),
        "shared": sorted(algorithm.layout.shared),
        "private": sorted(algorithm.layout.private),
        "lora": prepared.resolved.get("lora"),
    }


def save_models(prepared: Any, folder: Path | None = None) -> Path:
    """Write the run's final models into ``folder/models`` (default: the run folder; the runner
    passes its work folder, moved into place when the run completes); returns that folder."""
    folder = Path(folder) if folder is not None else prepared.run_dir
    algorithm = prepared.algorithm
    # complete model states: the tensors no one trains (a LoRA backbone, integer buffers) are
    # the initial ones, so that the files load into a freshly built model with strict=True
    fixed = algorithm.initial_state
    global_state = {**fixed, **algorithm.global_model()} if algorithm.has_global_model else None
    clients = {k: state for k in algorithm.store.clients() if (state := algorithm.store.get(k))}
    meta = models_meta(prepared)
    shared = folder / MODELS_DIR / SHARED_FILE
    shared.unlink(missing_ok=True)
    if global_state is None and algorithm.global_state:
        # no global model (FedPer's body has no head): every tensor but the private ones, which
        # each client adds ({**shared, **clients[k]} is client k's model)
        private = set(algorithm.layout.private)
        save_tensors(shared, {**{n: t for n, t in fixed.items() if n not in private}, **algorithm.global_state})
        meta["shared_file"] = SHARED_FILE
    models = save_run_models(folder, global_state, clients, meta)
    lora = prepared.resolved.get("lora")
    if lora and global_state is not None:
        export_lora(prepared, global_state, models)
    return models


def export_lora(prepared: Any, state: dict[str, Any], models: Path) -> Path:
    """The global model as a peft adapter (``models/peft_global``) + its base model's weights."""

    config = prepared.config
    model = copy.deepcopy(prepared.executor.model).cpu()
    model.load_state_dict({n: t.detach().cpu() for n, t in state.items()}, strict=False)
    layers = lora_layers(model)
    save_tensors(models / "base_model.safetensors", base_model_state(model, layers))
    return export_peft_adapter(
        model,
        models / "peft_global",
        layers,
        alpha=config.lora_alpha,
        target_modules=parse_targets(config.lora_targets),
        base_model_name=config.model,
    )
