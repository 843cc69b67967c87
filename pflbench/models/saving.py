"""Saved models: a run's final weights, and LoRA adapters in the format Hugging Face peft reads.

Run models (``save_run_models`` / ``load_run_models``)::

    RUN_DIR/models/global.safetensors       the final global model (whatever state dict is given)
    RUN_DIR/models/clients/<k>.safetensors  client k's private state (clients that have one)
    RUN_DIR/models/personal/<k>.safetensors client k's evaluation model, where it is its own
    RUN_DIR/models/meta.json                what was saved: format, tensor names, clients, meta

``load_model_state(RUN_DIR, client)`` assembles one complete model state from them: the base
(``global`` or ``shared``, meta ``personal_base``) updated with the client's own tensors (meta
``personal``, written by ``runs.export``); ``client=None`` is the global model.

Only tensors are written, never pickled objects: safetensors by default (read with
``safetensors.torch.load_file``), or ``fmt="torch"``: ``.pt`` files holding a plain
``{name: tensor}`` dict that ``torch.load(path, weights_only=True)`` reads (and ``--weights``
accepts). Every file is written to a temporary name and moved into place with ``os.replace``, and
``meta.json`` is written last: a ``models/`` folder without it is incomplete.

peft adapters (``export_peft_adapter``)::

    FOLDER/adapter_config.json        peft_type LORA, r, lora_alpha, target_modules, ...
    FOLDER/adapter_model.safetensors  base_model.model.<module>.lora_A.weight [r, in],
                                      base_model.model.<module>.lora_B.weight [out, r],
                                      base_model.model.<head>.<param> (modules_to_save)

``base_model_state(model, layers)`` gives the base model's weights (the frozen backbone under its
original names, the head as trained) to save once beside the adapters, for backbones that are
not on the hub (public pretraining). ``PeftModel.from_pretrained(base_model, FOLDER)`` computes what the pflbench model computes:
peft's LoRA output is ``base(x) + (lora_alpha / r)·x Aᵀ Bᵀ``, so each layer is written with
r = its active rank (the first ``active_rank`` components of the factors) and lora_alpha = its α,
giving the same scaling α/active_rank. Layers whose ranks or α differ from the most common ones
go into peft's ``rank_pattern`` / ``alpha_pattern``. A layer class that adds branches (FedSDG's
gated private pair) is exported through its ``delta_weight()`` (an exact SVD factorisation at
its numerical rank, computed in float64). The trained head goes in as peft ``modules_to_save``.
"""

from __future__ import annotations

import json
import pickle
import re
import warnings
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

import torch
from torch import nn

from pflbench.config.value_types import json_kind
from pflbench.models.lora import LoRALinear
from pflbench.models.zoo import head_module_names
from pflbench.store.layout import MODELS_DIR
from pflbench.util.atomic import atomic_write_bytes, atomic_write_json

Tensors = dict[str, torch.Tensor]

FORMATS = {"safetensors": ".safetensors", "torch": ".pt"}
META_FILE = "meta.json"
PERSONAL_DIR = "personal"  # models/personal/<k>: evaluation models that are not the stored state
MODELS_FORMAT_VERSION = 2  # 2: + inputs, build, personal (what load_model needs)
PEFT_PREFIX = "base_model.model."


def _plain(tensors: Mapping[str, torch.Tensor], what: str) -> Tensors:
    """Detached, contiguous CPU copies (no shared storage: safetensors refuses it)."""
    out: Tensors = {}
    for name, tensor in tensors.items():
        if not isinstance(name, str) or not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{what}: expected {{str: Tensor}}, got {name!r}: {type(tensor).__name__}")
        out[name] = tensor.detach().to("cpu", copy=True).contiguous()
    return out


def _encode(tensors: Tensors, fmt: str, metadata: dict[str, str] | None = None) -> bytes:
    if fmt == "safetensors":
        from safetensors.torch import save

        return save(tensors, metadata=metadata)
    if fmt == "torch":
        import io

        buffer = io.BytesIO()
        torch.save(tensors, buffer)
        return buffer.getvalue()
    raise ValueError(f"unknown model file format {fmt!r}; choose from {', '.join(FORMATS)}")


def save_tensors(
    path: str | Path,
    tensors: Mapping[str, torch.Tensor],
    fmt: str = "safetensors",
    metadata: dict[str, str] | None = None,
) -> None:
    """Atomically write a ``{name: tensor}`` dict as safetensors or a ``weights_only`` torch file."""
    atomic_write_bytes(Path(path), _encode(_plain(tensors, str(path)), fmt, metadata))


def load_tensors(path: str | Path) -> Tensors:
    """Read a file written by ``save_tensors`` (format from the suffix) onto the CPU.

    ValueError naming the file when it is not one: truncated or garbage bytes, a folder, a
    pickle of anything but tensors (``weights_only``: refused, nothing of it is run)."""
    path = Path(path)
    kind = "safetensors" if path.suffix == ".safetensors" else "torch weights"
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            loaded = load_file(str(path), device="cpu")
        else:
            with warnings.catch_warnings():  # torch's multi-line notes on odd pickles: said once below
                warnings.simplefilter("ignore")
                loaded = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise ValueError(f"{path} holds objects other than tensors (refused: nothing of it was run)") from None
    except Exception as error:  # SafetensorError, torch's RuntimeError on a torn zip, OSError: all unreadable
        first_line = (str(error).strip().splitlines() or [""])[0][:160]
        raise ValueError(f"{path} is not a readable {kind} file ({type(error).__name__}: {first_line})") from None
    if not isinstance(loaded, dict) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in loaded.items()
    ):
        raise ValueError(f"{path} does not hold a {{name: tensor}} dict")
    return loaded


# --------------------------------------------------------------------------- run models


def save_run_models(
    folder: str | Path,
    global_state: Mapping[str, torch.Tensor] | None,
    client_states: Mapping[int, Mapping[str, torch.Tensor]],
    meta: dict[str, Any] | None = None,
    fmt: str = "safetensors",
) -> Path:
    """Write the final global model and each client's private state under ``folder/models/``.

    ``folder``: the run folder. ``global_state``: the global model's state dict (``None``: no
    global model, e.g. local training). ``client_states``: client id → its private tensors
    (clients without private state are simply absent). ``meta``: JSON-serialisable facts to keep
    beside the weights (algorithm, model, LoRA settings, shared/private names, ...).
    Returns the ``models`` folder. Rewriting a run removes client files it no longer has.
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown model file format {fmt!r}; choose from {', '.join(FORMATS)}")
    suffix = FORMATS[fmt]
    models = Path(folder) / MODELS_DIR
    clients_dir = models / "clients"
    (models / META_FILE).unlink(missing_ok=True)  # incomplete until meta.json is back
    files: dict[str, Any] = {"global": None, "clients": {}}
    if global_state is not None:
        save_tensors(models / f"global{suffix}", global_state, fmt)
        files["global"] = f"global{suffix}"
    for stale in [*models.glob("global.*")]:
        if stale.name != files["global"]:
            stale.unlink()
    written: set[str] = set()
    for client_id in sorted(client_states):
        name = f"{int(client_id)}{suffix}"
        save_tensors(clients_dir / name, client_states[client_id], fmt)
        files["clients"][str(int(client_id))] = f"clients/{name}"
        written.add(name)
    if clients_dir.is_dir():
        for stale in clients_dir.iterdir():
            if stale.name not in written:
                stale.unlink()
    record = {
        "format": fmt,
        "files": files,
        "global_tensors": None if global_state is None else sorted(global_state),
        "client_tensors": sorted({n for state in client_states.values() for n in state}),
        "meta": meta or {},
    }
    atomic_write_json(models / META_FILE, record, default=str)
    return models


def load_run_models(folder: str | Path) -> tuple[Tensors | None, dict[int, Tensors], dict[str, Any]]:
    """Read what ``save_run_models`` wrote: ``(global_state, client_states, meta)``.

    ``folder`` may be the run folder or its ``models`` folder.
    """
    models = models_folder(folder)
    record = read_models_meta(folder)
    files = record["files"]
    global_file = files.get("global")
    global_state = None if global_file is None else load_tensors(model_file(models, global_file, "files.global"))
    clients = files.get("clients")
    if not isinstance(clients, dict) or not all(k.isdigit() for k in clients):
        raise ValueError(f"{models / META_FILE}: files.clients must map client numbers to files")
    states = {int(k): load_tensors(model_file(models, name, f"files.clients.{k}")) for k, name in clients.items()}
    return global_state, states, record["meta"]


def models_folder(folder: str | Path) -> Path:
    """The ``models`` folder of a run folder (or ``folder`` itself if it is one)."""
    folder = Path(folder)
    return folder if (folder / META_FILE).is_file() else folder / MODELS_DIR


def read_models_meta(folder: str | Path) -> dict[str, Any]:
    """``models/meta.json`` of a run folder (or of a ``models`` folder): FileNotFoundError when
    there is none, ValueError naming it when it is not a record of saved models (unreadable, not
    JSON, not an object with ``files`` and ``meta`` objects)."""
    path = models_folder(folder) / META_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"no saved models in {folder} ({MODELS_DIR}/{META_FILE} is missing; "
            "was the run made with --save-model and did it finish?)"
        )
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path} is unreadable ({type(error).__name__}: {error})") from None
    except RecursionError:
        raise ValueError(f"{path} is nested too deeply to be a record of saved models") from None
    if not isinstance(record, dict):
        raise ValueError(f"{path} holds {json_kind(record)}, not a record of saved models (an object)")
    for key in ("files", "meta"):
        if not isinstance(record.get(key), dict):
            raise ValueError(f"{path}: {key!r} must be an object, not {json_kind(record.get(key))}")
    return record


def model_file(models: Path, name: Any, key: str) -> Path:
    """The weights file that meta.json's ``key`` names (``name``, relative to ``models``); ValueError
    unless it is a ``.safetensors``/``.pt`` file inside the models folder. A path that leaves it
    (``..``, absolute, a link pointing out) is refused before anything is read there."""
    where = models / META_FILE
    if not isinstance(name, str) or not name:
        raise ValueError(f"{where}: {key} must name a weights file, not {json_kind(name)}")
    escapes = any(p.is_absolute() or ".." in p.parts for p in (PurePosixPath(name), PureWindowsPath(name)))
    if escapes or PurePosixPath(name).suffix not in FORMATS.values():
        raise ValueError(
            f"{where}: {key} {name[:200]!r} is not a .safetensors or .pt file inside the models folder "
            "(refused, nothing read)"
        )
    path = models / name
    try:
        inside = path.resolve().is_relative_to(models.resolve())
    except (OSError, RuntimeError):  # a link loop
        inside = False
    if not inside:
        raise ValueError(f"{where}: {key} {name!r} leads outside the models folder (a link?); refused, nothing read")
    if not path.is_file():
        raise ValueError(f"{path} ({key} in {where}) is {'not a file' if path.exists() else 'missing'}")
    return path


def load_model_state(folder: str | Path, client: int | None = None) -> Tensors:
    """The complete state dict of client ``client``'s evaluation model (``None``: the global
    model), as ``runs.export.save_models`` wrote it; loads with ``strict=True``.

    Raises ``ValueError`` for a client the run does not have, for ``client=None`` when the
    algorithm has no global model, and for models saved without the per-client record
    (``format_version`` < 2)."""
    models = models_folder(folder)
    record = read_models_meta(folder)
    meta = record["meta"]
    if "personal" not in meta:
        raise ValueError(
            f"{models} was saved by an older pflbench without the per-client model record; "
            "run again with --save-model (pflbench rerun RUN_DIR --save-model)"
        )
    personal = meta["personal"]
    if not isinstance(personal, dict):
        raise ValueError(f"{models / META_FILE}: meta.personal must be an object, not {json_kind(personal)}")
    if client is None:
        global_file = record["files"].get("global")
        if global_file is None:
            raise ValueError(
                f"algorithm {meta.get('algo')!r} has no global model; pass client=K "
                f"(0..{len(personal) - 1}) for a client's personal model"
            )
        return load_tensors(model_file(models, global_file, "files.global"))
    key = str(client) if isinstance(client, int) and not isinstance(client, bool) else None
    if key not in personal:
        raise ValueError(f"client={client!r} is not a client of this run; choose from 0..{len(personal) - 1}")
    # every file is checked before any is read: a hostile entry reads nothing
    base_file = meta.get("personal_base")
    base = model_file(models, base_file, "meta.personal_base") if base_file is not None else None
    own = model_file(models, personal[key], f"meta.personal.{key}") if personal[key] is not None else None
    state = load_tensors(base) if base is not None else {}
    if own is not None:
        state.update(load_tensors(own))
    return state


# --------------------------------------------------------------------------- peft adapters


def _layer_rank(layer: nn.Module, default: int | None) -> int:
    rank = getattr(layer, "active_rank", None)
    if rank is None:
        rank = getattr(layer, "max_rank", default)
    if rank is None:
        raise ValueError(f"cannot tell the rank of {type(layer).__name__}")
    return int(rank.item() if isinstance(rank, torch.Tensor) else rank)


def _has_extra_branches(layer: nn.Module) -> bool:
    """True for a LoRALinear subclass whose adapter is more than the one shared pair."""

    return isinstance(layer, LoRALinear) and type(layer).adapter is not LoRALinear.adapter


@torch.no_grad()
def _factors(layer: nn.Module, rank: int, alpha: float) -> tuple[torch.Tensor, torch.Tensor, int, float]:
    """(A [r, in], B [out, r], r, lora_alpha) with (lora_alpha / r)·B·A = the layer's ΔW."""
    if not _has_extra_branches(layer):
        return layer.lora_A[:rank], layer.lora_B[:, :rank], rank, alpha
    delta = layer.delta_weight().detach().to("cpu", torch.float64)
    u, s, vh = torch.linalg.svd(delta, full_matrices=False)
    tolerance = s.max() * max(delta.shape) * torch.finfo(torch.float32).eps if s.numel() else 0
    kept = max(1, int((s > tolerance).sum()))
    root = s[:kept].sqrt()
    a, b = root[:, None] * vh[:kept], u[:, :kept] * root[None, :]
    dtype = layer.lora_A.dtype
    return a.to(dtype), b.to(dtype), kept, float(kept)  # scaling 1


def _peft_matches(name: str, targets: Sequence[str]) -> bool:
    """peft's rule for a list of target_modules: the full name, or a ``.``-suffix of it."""
    return any(name == t or name.endswith("." + t) for t in targets)


def _number(value: float) -> int | float:
    return int(value) if float(value).is_integer() else float(value)


def base_model_state(model: nn.Module, lora_layers: Mapping[str, nn.Module]) -> Tensors:
    """The state dict of the model without its adapters: ``<layer>.base.weight`` becomes
    ``<layer>.weight`` and the factors are dropped, so it loads into the model as built before
    ``apply_lora`` (the base model peft wraps). Modules a LoRA algorithm adds outside the layers
    (FedSDG's gates) stay in; load such a state with ``strict=False``."""
    prefixes = [f"{name}." for name in lora_layers]
    out: Tensors = {}
    for key, tensor in model.state_dict().items():
        owner = next((prefix for prefix in prefixes if key.startswith(prefix)), None)
        if owner is None:
            out[key] = tensor
        elif key.startswith(owner + "base."):
            out[owner + key[len(owner + "base.") :]] = tensor
    return out


def export_peft_adapter(
    model: nn.Module,
    folder: str | Path,
    lora_layers: Mapping[str, nn.Module],
    rank: int | None = None,
    alpha: float | None = None,
    target_modules: Iterable[str] | None = None,
    base_model_name: str | None = None,
    modules_to_save: Iterable[str] | None | str = "auto",
) -> Path:
    """Write ``adapter_config.json`` + ``adapter_model.safetensors`` that peft loads as LoRA.

    ``model``: the pflbench model with the weights to export loaded (the global model, or a
    client's personal model). ``lora_layers``: ``pflbench.models.lora.lora_layers(model)``.
    ``rank``/``alpha``: the run's LoRA settings, used for layers that do not carry them (a layer's
    own ``active_rank``/``alpha`` win; a given ``alpha`` that disagrees with a layer's raises
    ``ValueError``, since the export would not reproduce the model). ``target_modules``: the
    run's ``--lora-targets``; written as given when peft's matching of them picks exactly the
    exported layers, else the full module names (or, if even those match more, a regex). ``modules_to_save``: modules
    whose full weights go into the adapter (peft's ``modules_to_save``); ``"auto"``: the head
    (``pflbench.models.zoo.head_module_names``) when any of its parameters is trainable.
    Returns ``folder``.
    """
    if not lora_layers:
        raise ValueError("the model has no LoRA layers to export")
    folder = Path(folder)
    layer_names = list(lora_layers)
    exported: dict[str, tuple[torch.Tensor, torch.Tensor, int, float]] = {}
    for name, layer in lora_layers.items():
        layer_alpha = getattr(layer, "alpha", None)
        if layer_alpha is None:
            if alpha is None:
                raise ValueError(f"LoRA layer {name!r} has no alpha; pass alpha=")
            layer_alpha = alpha
        elif alpha is not None and abs(float(layer_alpha) - float(alpha)) > 1e-12:
            raise ValueError(f"alpha={alpha} disagrees with LoRA layer {name!r} (alpha {layer_alpha})")
        exported[name] = _factors(layer, _layer_rank(layer, rank), float(layer_alpha))

    # The most common (r, alpha) is the config's; the others go into rank/alpha patterns.
    common_rank = Counter(r for _, _, r, _ in exported.values()).most_common(1)[0][0]
    common_alpha = Counter(a for _, _, _, a in exported.values()).most_common(1)[0][0]
    rank_pattern = {n: r for n, (_, _, r, _) in exported.items() if r != common_rank}
    alpha_pattern = {n: _number(a) for n, (_, _, _, a) in exported.items() if a != common_alpha}

    inner = tuple(f"{name}." for name in layer_names)  # modules inside a LoRA layer (base, ...)
    module_names = [n for n, _ in model.named_modules() if n and not n.startswith(inner)]
    targets: list[str] | str = "^(?:" + "|".join(re.escape(n) for n in layer_names) + ")$"
    for candidate in (sorted(set(target_modules or ())), sorted(layer_names)):
        if candidate and {n for n in module_names if _peft_matches(n, candidate)} == set(layer_names):
            targets = candidate  # the readable form, when peft's suffix matching is exact
            break

    if modules_to_save == "auto":
        head = head_module_names(model)
        trainable = any(p.requires_grad for m in head for p in model.get_submodule(m).parameters())
        modules_to_save = head if trainable else []
    save_names = list(modules_to_save or [])
    overlap = [m for m in save_names if any(m == n or n.startswith(m + ".") for n in layer_names)]
    if overlap:
        raise ValueError(f"modules_to_save {overlap} contain LoRA layers; peft cannot save both")

    weights: Tensors = {}
    for name, (a, b, _, _) in exported.items():
        weights[f"{PEFT_PREFIX}{name}.lora_A.weight"] = a
        weights[f"{PEFT_PREFIX}{name}.lora_B.weight"] = b
    for module_name in save_names:
        for key, tensor in model.get_submodule(module_name).state_dict().items():
            weights[f"{PEFT_PREFIX}{module_name}.{key}"] = tensor

    config = {
        "peft_type": "LORA",
        "task_type": None,
        "base_model_name_or_path": base_model_name,
        "revision": None,
        "inference_mode": True,
        "r": common_rank,
        "lora_alpha": _number(common_alpha),
        "lora_dropout": 0.0,
        "target_modules": targets,
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
        "init_lora_weights": True,
        "modules_to_save": save_names or None,
        "rank_pattern": rank_pattern,
        "alpha_pattern": alpha_pattern,
        "layers_to_transform": None,
        "layers_pattern": None,
    }
    save_tensors(folder / "adapter_model.safetensors", weights, "safetensors", metadata={"format": "pt"})
    atomic_write_json(folder / "adapter_config.json", config, default=str)
    return folder
