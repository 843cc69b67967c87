"""``--save-model``: a finished run's weights into ``RUN_DIR/models/`` (``saving.save_run_models``),
with everything needed to use them alone (``pflbench.load_model``, ``runs.loading``).

Written after the last round, before ``summary.json`` (a finished run folder holds its models):

- ``global.safetensors``: the final global model, ``algorithm.global_model()`` completed with
  the tensors nobody trains (a LoRA run's frozen backbone, integer buffers) so it loads into a
  fresh model with ``strict=True``, for algorithms that have one (not ``local``);
- ``shared.safetensors``: for algorithms without a global model, every tensor but the private
  ones (the final ``algorithm.global_state`` and the untrained rest), so that
  ``{**shared, **clients[k]}`` is client k's model (meta ``shared_file``; a client that never
  trained has the initial private tensors);
- ``clients/<k>.safetensors``: client k's private state as the algorithm keeps it between
  rounds (``algorithm.store``: e.g. FedPer's head, FedBN's BatchNorm layers, SCAFFOLD's control
  variates), for every client that trained and has private tensors;
- ``personal/<k>.safetensors``: the tensors of the model client k is *evaluated* with (its
  ``pers_acc`` in clients.csv; a new client's ``new_acc``: the model its adaptation made, meta
  ``new_clients``) that differ from the base model (``global`` or ``shared``), when
  they are not exactly ``clients/<k>`` already (two-model methods such as Ditto, APFL's mixture,
  the test-time adaptation of Per-FedAvg and FedBABU); meta ``personal`` names each client's file
  (``null``: the client is evaluated with the base model itself);
- ``meta.json``: what was saved, the run's identity, the input contract (``inputs``: scaling,
  mean/std as the run applied them, input shape and dtype, class names; ``preprocessing``) and
  how to rebuild the model (``build``: the resolved settings and the algorithm's hyperparameters);
- LoRA runs with a global model also get ``peft_global/`` (a peft adapter of the global model,
  ``saving.export_peft_adapter``) and ``base_model.safetensors`` (the backbone under its original
  names, which ``PeftModel.from_pretrained`` wraps: the backbone came from public pretraining,
  not from the hub).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from pflbench.engine.evaluator import PERSONALIZE_CHUNK  # clients adapted (and held) at once, as the evaluation
from pflbench.engine.executor import make_executor
from pflbench.engine.personalize import personalize
from pflbench.models.lora import lora_layers, parse_targets
from pflbench.models.preprocessing import input_transform
from pflbench.models.saving import (
    META_FILE,
    MODELS_FORMAT_VERSION,
    PERSONAL_DIR,
    base_model_state,
    export_peft_adapter,
    save_run_models,
    save_tensors,
)
from pflbench.store.layout import MODELS_DIR
from pflbench.store.writer import without_local_paths
from pflbench.util.seeding import derive_seed

SHARED_FILE = "shared.safetensors"


def models_meta(prepared: Any) -> dict[str, Any]:
    config, algorithm = prepared.config, prepared.algorithm
    build = {"config": dataclasses.asdict(config), "algo_hparams": dataclasses.asdict(algorithm.hparams)}
    return {
        "format_version": MODELS_FORMAT_VERSION,
        "run": prepared.run_dir.name,
        "algo": config.algo,
        "dataset": config.dataset,
        "model": config.model,
        "model_options": config.model_options(),
        "input_shape": list(prepared.dataset.input_shape),
        "num_classes": prepared.dataset.num_classes,
        "rounds": config.rounds,
        "identity_hash": prepared.identity.hash,
        "has_global_model": bool(algorithm.has_global_model),
        "shared": sorted(algorithm.layout.shared),
        "private": sorted(algorithm.layout.private),
        "lora": prepared.resolved.get("lora"),
        "new_clients": sorted(int(k) for k in getattr(prepared.partition, "new_clients", None) or ()),
        "inputs": input_transform(prepared.data, prepared.dataset).to_json(),
        "build": without_local_paths(build) if config.portable else build,
    }


def evaluation_models(prepared: Any) -> Iterator[tuple[int, dict[str, torch.Tensor]]]:
    """(k, the model state client k was evaluated with after the last round), for every client.

    A training client: ``algorithm.personal_model(k)`` (its ``pers_acc``), or, for an algorithm
    with a test-time adaptation (``personalization_program``), that program run from it on client
    k's train split with the seeds of the final evaluation (``engine.evaluator.Personalizer``:
    stream ``personalize``, round = the last one). A new client (``--new-clients``, held out of
    training): the model behind its ``new_acc``, ``new_client_program`` run from
    ``new_client_model(k)`` (stream ``adapt_new``), or that model as it is."""
    algorithm = prepared.algorithm
    new = set(getattr(prepared.partition, "new_clients", None) or ())
    clients = list(range(prepared.data.num_clients))
    training = [k for k in clients if k not in new]
    yield from _adapted(
        prepared, algorithm.personalization_program(), algorithm.personal_model, training, "personalize"
    )
    if new:
        program = algorithm.new_client_program()
        yield from _adapted(prepared, program, algorithm.new_client_model, sorted(new), "adapt_new")


def _adapted(
    prepared: Any, program: Any, model_of: Any, clients: list[int], stream: str
) -> Iterator[tuple[int, dict[str, torch.Tensor]]]:
    """(k, ``model_of(k)`` adapted by ``program`` on k's train split) as the engine's final
    evaluation computes it; ``program`` None: ``model_of(k)`` as it is."""
    if program is None:
        for k in clients:
            yield k, model_of(k)
        return
    config, executor = prepared.config, prepared.executor
    if config.executor == "ray":  # its actors went back to the pool when the rounds ended; Ray
        spec = dataclasses.replace(config.executor_spec, kind="sequential")  # computes what
        executor = make_executor(spec, prepared.algorithm.model, prepared.data)  # sequential does
    for start in range(0, len(clients), PERSONALIZE_CHUNK):
        chunk = clients[start : start + PERSONALIZE_CHUNK]
        seeds = [derive_seed(config.seed, stream, config.rounds, k) for k in chunk]
        states = personalize(executor, program, [model_of(k) for k in chunk], chunk, seeds, config.rounds)
        yield from zip(chunk, states)


def differing(state: Mapping[str, torch.Tensor], base: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The tensors of ``state`` that ``base`` lacks or holds with other values (bitwise)."""
    return {
        n: t for n, t in state.items() if n not in base or not torch.equal(t.detach().cpu(), base[n].detach().cpu())
    }


def same_tensors(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> bool:
    return set(a) == set(b) and all(torch.equal(a[n].detach().cpu(), b[n].detach().cpu()) for n in a)


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
    models = folder / MODELS_DIR
    (models / META_FILE).unlink(missing_ok=True)  # incomplete until meta.json is back
    shared = models / SHARED_FILE
    shared.unlink(missing_ok=True)
    base: dict[str, torch.Tensor] = {}
    if global_state is not None:
        base = global_state
        meta["personal_base"] = "global.safetensors"
    else:
        # no global model (FedPer's body has no head): every tensor but the private ones, which
        # each client adds ({**shared, **clients[k]} is client k's model)
        private = set(algorithm.layout.private)
        base = {**{n: t for n, t in fixed.items() if n not in private}, **algorithm.global_state}
        if base:
            save_tensors(shared, base)
            meta["shared_file"] = SHARED_FILE
        meta["personal_base"] = SHARED_FILE if base else None
    meta["personal"] = save_personal_models(prepared, models, base, clients)
    models = save_run_models(folder, global_state, clients, meta)
    lora = prepared.resolved.get("lora")
    if lora and global_state is not None:
        export_lora(prepared, global_state, models)
    return models


def save_personal_models(
    prepared: Any, models: Path, base: Mapping[str, torch.Tensor], clients: Mapping[int, Mapping[str, torch.Tensor]]
) -> dict[str, str | None]:
    """Each client's evaluation model as its difference from ``base``: no file when there is
    none, ``clients/<k>`` when that file holds exactly it, else ``personal/<k>.safetensors``.
    Returns client → file (relative to ``models``) or None."""
    personal_dir = models / PERSONAL_DIR
    for stale in personal_dir.glob("*") if personal_dir.is_dir() else ():
        stale.unlink()
    files: dict[str, str | None] = {}
    for k, state in evaluation_models(prepared):
        own = differing(state, base)
        if not own:
            files[str(k)] = None
        elif k in clients and same_tensors(own, clients[k]):
            files[str(k)] = f"clients/{k}.safetensors"
        else:
            save_tensors(personal_dir / f"{k}.safetensors", own)
            files[str(k)] = f"{PERSONAL_DIR}/{k}.safetensors"
    return files


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
