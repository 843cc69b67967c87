"""Where a run's initial weights come from, and the offline backbone: pretraining on public data.

LoRA adapts a *pretrained* frozen backbone; on a random one it barely learns (SPEC §4). Offline,
a label-stratified ``--public-frac`` of the pooled data is held out (``public_split``; no client
ever gets it), the full model is trained on it centrally (AdamW, weight decay 0.05, batch 16,
``--pretrain-epochs``, ``--pretrain-lr``: small ViTs on a few hundred images need the small
batches and the decay; a stratified 20% of the public data is kept back to report accuracy), and
the weights are cached in ``$PFLBENCH_CACHE/backbones/`` under a hash of everything that
determines them (``backbone_key``). Runs then load that file exactly like ``--weights``.

The file holds the backbone *without* the classifier head, as with hub weights (whose head
never fits the task): every run learns its task head from client data only, so a run's
starting accuracy is chance and algorithms are compared on what federated training adds.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from pflbench.config.identity import cpu_threads
from pflbench.config.run_config import RunConfig
from pflbench.data.dataset import FederatedData, TensorDataset, cache_dir
from pflbench.data.partitioners import split_train_test
from pflbench.errors import ConfigError
from pflbench.models.zoo import build_model, head_parameter_names, load_weights
from pflbench.util import cache, progress
from pflbench.util.atomic import atomic_write_bytes, remove_stale_temporaries
from pflbench.util.hashing import settings_hash
from pflbench.util.precision import autocast
from pflbench.util.seeding import derive_seed, rng_stream

PRETRAIN_BATCH_SIZE = 16
PRETRAIN_WEIGHT_DECAY = 0.05
PRETRAIN_VAL_FRAC = 0.2
PRETRAIN_FORMAT_VERSION = 3  # 3: the CPU thread count is part of the key


def indices_digest(indices: np.ndarray) -> str:
    return hashlib.sha256(np.asarray(indices, dtype=np.int64).tobytes()).hexdigest()[:16]


def backbone_key(config: RunConfig, dataset: TensorDataset, public: np.ndarray, device: torch.device) -> dict[str, Any]:
    """Everything that determines the pretrained weights. On the CPU that includes the thread
    count: torch's reductions split work by thread, so 1 and 2 threads give weights that differ
    in the last bits (measured, issue 25), and a backbone made with one count is not the one
    another count would make."""
    threads = cpu_threads(config) if device.type == "cpu" else None
    return {
        "version": PRETRAIN_FORMAT_VERSION,
        "dataset": config.dataset,
        "dataset_options": config.dataset_options(),
        "dataset_source": dataset.source,
        "input_shape": list(dataset.input_shape),
        "num_classes": dataset.num_classes,
        "model": config.model,
        "model_options": config.model_options(),
        "public_frac": config.public_frac,
        "seed": config.seed,
        "public_indices": indices_digest(public),
        "epochs": config.pretrain_epochs,
        "lr": config.pretrain_lr,
        "batch_size": PRETRAIN_BATCH_SIZE,
        "weight_decay": PRETRAIN_WEIGHT_DECAY,
        "val_frac": PRETRAIN_VAL_FRAC,
        "threads": threads,
        # --precision bf16 pretrains under autocast: other weights (fp32 keys stay as before it existed)
        **({"precision": config.precision} if config.precision != "fp32" else {}),
    }


def backbone_path(config: RunConfig, key: dict[str, Any]) -> Path:
    """``$PFLBENCH_CACHE/backbones/<dataset>-<model>-<hash of key>.pt`` (names made file-safe)."""
    digest = settings_hash(key)
    stem = re.sub(r"[^A-Za-z0-9_.-]", "_", f"{config.dataset}-{config.model}")[:120]
    return cache_dir() / "backbones" / f"{stem}-{digest}.pt"


@dataclass
class PretrainedBackbone:
    path: Path
    val_accuracy: float  # on the kept-back 20% of the public data
    num_train: int
    num_val: int
    from_cache: bool
    content: bytes | None = None  # the entry's bytes when its cache file could not be written


def train_centrally(
    model: nn.Module,
    data: FederatedData,
    epochs: int,
    lr: float,
    generator: torch.Generator,
    precision: str = "fp32",
) -> None:
    """``epochs`` of AdamW on cross-entropy over ``data``'s one train split (client 0), reported
    as a progress stage: samples/s, ETA, each epoch's mean loss and, when someone is watching
    and there is a held-back split, its accuracy after the epoch (an extra forward pass over
    the held-back part per epoch, skipped when silent; it consumes no randomness, so the
    weights are the same either way). ``precision`` bf16: forward and loss under autocast."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=PRETRAIN_WEIGHT_DECAY)
    held_back = data.test_indices[0] if progress.active() and data.num_test[0] > 0 else None
    with progress.stage("pretraining", epochs * data.num_train[0], "sample") as stage:
        last = ""  # the previous epoch's loss (and held-back accuracy)
        for epoch in range(1, epochs + 1):
            model.train()
            status = f"epoch {epoch}/{epochs}{last}"
            total_loss, batches = torch.zeros((), device=data.device), 0
            for inputs, targets in data.train_batches(0, PRETRAIN_BATCH_SIZE, generator):
                with autocast(data.device, precision):
                    loss = F.cross_entropy(model(inputs), targets)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                total_loss += loss.detach()  # read once per epoch: no host sync per batch
                batches += 1
                stage.advance(len(targets), status)
            summary = f"loss {float(total_loss) / max(1, batches):.4f}"
            if held_back is not None:
                summary += f"  held-back acc {split_accuracy(model, data, held_back, precision):.4f}"
            last = f"  (epoch {epoch}: {summary})"
            stage.advance(0, f"epoch {epoch}/{epochs} done  {summary}")
    model.train()


@torch.no_grad()
def split_accuracy(model: nn.Module, data: FederatedData, indices: torch.Tensor, precision: str = "fp32") -> float:
    model.eval()
    inputs, targets = data.gather(indices)
    with autocast(data.device, precision):
        return float((model(inputs).argmax(dim=1) == targets).float().mean())


def pretrain_backbone(
    config: RunConfig, dataset: TensorDataset, public: np.ndarray, device: torch.device
) -> PretrainedBackbone:
    """Train ``config.model`` on the public indices, or find the cached result; returns its file."""
    key = backbone_key(config, dataset, public, device)
    path = backbone_path(config, key)
    entry = cache.load_entry(path, expect={"key": json.loads(json.dumps(key, default=str))})
    if entry is not None:
        meta = entry[1]
        progress.note(f"reusing the pretrained {config.model} backbone cached at {path}")
        return PretrainedBackbone(path, meta["val_accuracy"], meta["num_train"], meta["num_val"], True)
    labels = dataset.labels.numpy()
    train, val = split_train_test(labels, [public], PRETRAIN_VAL_FRAC, rng_stream(config.seed, "public", 1))
    data = FederatedData(dataset, train, val, device)
    torch.manual_seed(derive_seed(config.seed, "public", 2))
    model = build_model(config.model, dataset.input_shape, dataset.num_classes, **config.model_options()).to(device)
    generator = torch.Generator().manual_seed(derive_seed(config.seed, "public", 3))
    progress.note(
        f"pretraining the {config.model} backbone on the public {config.public_frac:g} of {config.dataset}: "
        f"{config.pretrain_epochs} epochs over {len(train[0])} samples ({len(val[0])} held back), "
        "time estimate in the progress line below; cached for later runs. To skip it: --weights FILE, "
        "--backbone random, or a smaller --pretrain-epochs"
    )
    train_centrally(model, data, config.pretrain_epochs, config.pretrain_lr, generator, config.precision)
    accuracy = split_accuracy(model, data, data.test_indices[0], config.precision)
    meta = {"key": key, "val_accuracy": accuracy, "num_train": len(train[0]), "num_val": len(val[0])}
    head = head_parameter_names(model)
    backbone = {n: t.cpu() for n, t in model.state_dict().items() if n not in head}
    content = cache.entry_bytes(backbone, json.loads(json.dumps(meta, default=str)))
    try:
        atomic_write_bytes(path, content)  # the run loads it from there
    except OSError as error:  # a full or read-only cache costs the next run's time, not this run
        cache.warn(
            f"could not write the pretrained backbone to the cache ({path}: {error.strerror or error}); "
            "this run uses it from memory, the next one pretrains again"
        )
        return PretrainedBackbone(path, accuracy, len(train[0]), len(val[0]), False, content)
    remove_stale_temporaries(path)
    return PretrainedBackbone(path, accuracy, len(train[0]), len(val[0]), False)


@dataclass(frozen=True)
class InitialWeights:
    """The weights file a run starts from (``path`` None: hub or random init), how it was
    obtained (``record``), and its bytes when they exist only in memory (``content``)."""

    path: Path | None
    record: dict[str, Any]
    content: bytes | None = None


def initial_weights(
    config: RunConfig, dataset: TensorDataset, public: np.ndarray, device: torch.device, uses_lora: bool
) -> InitialWeights:
    """The weights the run starts from and how they were obtained.

    ``--backbone auto``: ``--weights`` or ``--pretrained`` if given, else a LoRA run pretrains on
    the public fraction and any other run starts at random.
    """
    if config.weights:
        return InitialWeights(Path(config.weights), {"source": f"file:{config.weights}"})
    if config.pretrained:
        return InitialWeights(None, {"source": f"hub:{config.model}"})
    if config.backbone == "random" or (config.backbone == "auto" and not uses_lora):
        return InitialWeights(None, {"source": "random init"})
    if config.public_frac <= 0:
        raise ConfigError(
            "LoRA on a random frozen backbone barely learns: give --public-frac F (e.g. 0.2) to "
            "pretrain one on public data no client gets, --weights FILE, --pretrained (network), "
            "or --backbone random to accept a random init"
        )
    backbone = pretrain_backbone(config, dataset, public, device)
    cache_state = (
        "hit" if backbone.from_cache else "created" if backbone.content is None else "not written (kept in memory)"
    )
    record = {
        "source": (
            f"pretrained on public fraction {config.public_frac:g} of {config.dataset} "
            f"({backbone.num_train} train / {backbone.num_val} held-back samples, "
            f"{config.pretrain_epochs} epochs, AdamW lr {config.pretrain_lr:g}), "
            f"cached at {backbone.path}"
        ),
        "public_val_acc": backbone.val_accuracy,
        "cache": cache_state,
    }
    return InitialWeights(backbone.path, record, backbone.content)


def load_initial_weights(
    model: nn.Module, weights: InitialWeights, config: RunConfig, public: np.ndarray
) -> dict[str, Any]:
    """Load ``weights`` (if any) into ``model``; refuse a backbone pretrained on this run's client data."""
    path, record = weights.path, weights.record
    if path is None:
        return record
    loaded = load_weights(model, path, weights.content)
    key = loaded.pop("meta").get("key", {})
    if key.get("dataset") == config.dataset and key.get("public_indices") != indices_digest(public):
        raise ConfigError(
            f"{path} was pretrained on a public fraction {key.get('public_frac')} (seed {key.get('seed')}) "
            f"of {config.dataset}; this run would give that data to clients. Use --public-frac "
            f"{key.get('public_frac')} --seed {key.get('seed')}, or let --backbone public build "
            "a matching one"
        )
    return {**record, **loaded}
