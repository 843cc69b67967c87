"""Malicious clients: who they are, how they poison their data or their uploads, and the backdoor's
attack success rate.

**Who.** A fraction ρ = ``--attackers`` of the training clients (never a new client), a = ⌊ρ·K_train
+ ½⌋ of them (at least 1), drawn without replacement from the ``attacks.choice`` stream of the run
seed: the same clients for every algorithm, every executor and after a resume. The list is
recorded in config.json (``resolved.attackers``); each round's record lists the attackers that
reported (``attackers``). A run whose attackers would be every training client is refused (the
run's checks live with the settings: ``config.settings.attack.AttackSettings.check_run``).

**Data poisoning** (applied once, when the run builds its data, to the attackers' train splits
only: their validation and test splits, and every honest client, stay clean):

- ``label-flip`` (Tolpegin, Truex, Gursoy, Liu, "Data Poisoning Attacks Against Federated
  Learning Systems", ESORICS 2020; the all-classes variant): y → C − 1 − y.
- ``backdoor`` (BadNets: Gu, Dolan-Gavitt, Garg 2017; in FL: Bagdasaryan et al. 2020, Sun et al.
  2019): a share ``--backdoor-frac`` of each attacker's train images (a seeded choice, stream
  ``attacks.backdoor`` keyed by the client) gets the trigger — a 3×3 white patch (255 in every
  channel) in the bottom-right corner — and the label t = ``--backdoor-target``. Images only
  (uint8 [N, C, H, W], H and W ≥ 3); other data is refused.

  **Attack success rate** ``asr``: every honest training client's test samples of true class
  ≠ t, with the trigger stamped (copies appended to the run's data, so the clean test splits
  are untouched), are the ``backdoor`` evaluation split; asr = the fraction of them classified
  as t, pooled over the clients (Σ hits / Σ samples), by the global model; for an algorithm
  without one (``has_global_model`` False) each honest client's personal model on its own
  triggered samples, as it is (``personal_model(k)``, no personalization program: as
  ``ood_acc``). The attackers' own samples are left out: their personal models learnt the
  trigger from their own data, and the attack's aim is the honest clients' models.
  Measured at every evaluation; the summary keeps the last (and its last-10% mean). The
  appended copies are part of the pooled data whose per-channel mean and std normalise the
  inputs (as the test samples are), so a backdoor run's normalisation differs slightly from
  a clean run's.

**Model poisoning** (applied at the server's seam, ``Federation.aggregation``, to each
attacker's upload as it arrives, before differential privacy's clipping and noise and before
the aggregation rule; the attacker trains honestly first, Δ = upload − received):

- ``sign-flip`` (Li, Xu, Chen, Giannakis, Ling, "RSA", AAAI 2019; Karimireddy et al. 2021):
  upload received − Δ.
- ``scale`` (boosting / model replacement: Bhagoji et al. 2019, Bagdasaryan et al. 2020):
  upload received + λ·Δ, λ = ``--attack-scale``.
- ``gaussian`` (Blanchard et al. 2017, Fang et al. 2020): upload received + ε with ε ~
  N(0, λ²) per entry, drawn from the ``attacks.gaussian`` stream keyed by (round, client)
  on the CPU, so every executor and a resumed run draw the same.

Model poisoning and ``--robust-agg`` need an upload that is a model update averaged by the
FedAvg rule (the ``averaged-upload`` capability, the same predicate as ``--dp client``); the
others are refused at planning. Data poisoning serves every algorithm.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from pflbench.config.groups import AttackSpec
from pflbench.config.settings.attack import MODEL_POISONING, TRIGGER_SIZE, attacker_count
from pflbench.data.dataset import TensorDataset
from pflbench.engine.privacy import gaussian_noise_like, model_update
from pflbench.engine.types import ClientUpdate, Tensors
from pflbench.util.seeding import derive_seed, rng_stream

CHOICE_STREAM, BACKDOOR_STREAM, GAUSSIAN_STREAM = "attacks.choice", "attacks.backdoor", "attacks.gaussian"
TRIGGER_VALUE = 255  # white, in every channel


# ---- who attacks (how many: ``attacker_count``, the attack group's rule) --------------------------
def choose_attackers(seed: int, training_clients: Sequence[int], fraction: float) -> list[int]:
    """The malicious clients: ``attacker_count`` of ``training_clients``, drawn without
    replacement from the ``attacks.choice`` stream (sorted)."""
    count = attacker_count(len(training_clients), fraction)
    if count == 0:
        return []
    chosen = rng_stream(seed, CHOICE_STREAM).choice(len(training_clients), size=count, replace=False)
    return sorted(int(training_clients[int(i)]) for i in chosen)


# ---- data poisoning: pure functions ------------------------------------------------------------
def flip_labels(labels: torch.Tensor, indices: np.ndarray, num_classes: int) -> torch.Tensor:
    """A copy of ``labels`` with y → C − 1 − y at ``indices`` (every other label unchanged)."""
    flipped = labels.clone()
    where = torch.as_tensor(indices, dtype=torch.long)
    flipped[where] = num_classes - 1 - labels[where]
    return flipped


def stamp_trigger(images: torch.Tensor) -> torch.Tensor:
    """A copy of uint8 images [N, C, H, W] with the 3×3 bottom-right patch set to 255."""
    stamped = images.clone()
    stamped[..., -TRIGGER_SIZE:, -TRIGGER_SIZE:] = TRIGGER_VALUE
    return stamped


def backdoor_samples(train: np.ndarray, fraction: float, seed: int, client: int) -> np.ndarray:
    """The ⌈β·n⌉ of a client's train indices that carry the trigger (stream ``attacks.backdoor``, key k)."""
    count = min(len(train), math.ceil(fraction * len(train)))
    chosen = rng_stream(seed, BACKDOOR_STREAM, client).choice(len(train), size=count, replace=False)
    return np.sort(train[chosen])


def poison_data(
    dataset: TensorDataset,
    train: Sequence[np.ndarray],
    test: Sequence[np.ndarray],
    training_clients: Sequence[int],
    attackers: Sequence[int],
    spec: AttackSpec,
    seed: int,
) -> tuple[TensorDataset, list[np.ndarray] | None]:
    """(the run's data with the attackers' train splits poisoned, each client's ``backdoor``
    evaluation indices or None). Never modifies ``dataset`` (it may be a cached object):
    label flipping and the backdoor build new tensors; the backdoor also appends the triggered
    copies of the honest training clients' test samples of true class ≠ t (labelled t)."""
    if spec.kind == "label-flip":
        indices = np.concatenate([train[k] for k in attackers]).astype(np.int64)
        return dataclasses.replace(dataset, labels=flip_labels(dataset.labels, indices, dataset.num_classes)), None
    if spec.kind != "backdoor":
        return dataset, None
    inputs, labels = dataset.inputs.clone(), dataset.labels.clone()
    poisoned = np.concatenate([backdoor_samples(train[k], spec.backdoor_frac, seed, k) for k in attackers])
    where = torch.as_tensor(poisoned.astype(np.int64))
    inputs[where] = stamp_trigger(inputs[where])
    labels[where] = spec.backdoor_target
    honest = set(training_clients) - set(attackers)
    sources = [
        test[k][dataset.labels[torch.as_tensor(test[k], dtype=torch.long)].numpy() != spec.backdoor_target]
        if k in honest
        else np.zeros(0, dtype=np.int64)
        for k in range(len(test))
    ]
    start, splits = len(labels), []
    for source in sources:
        splits.append(np.arange(start, start + len(source), dtype=np.int64))
        start += len(source)
    copies = torch.as_tensor(np.concatenate(sources).astype(np.int64))
    inputs = torch.cat([inputs, stamp_trigger(dataset.inputs[copies])])
    labels = torch.cat([labels, torch.full((len(copies),), spec.backdoor_target, dtype=labels.dtype)])
    groups = dataset.groups
    if groups is not None:  # the copies keep their source's group
        groups = np.concatenate([np.asarray(groups), np.asarray(groups)[copies.numpy()]])
    return dataclasses.replace(dataset, inputs=inputs, labels=labels, groups=groups), splits


# ---- model poisoning: pure function and the seam's stream -------------------------------------
def poison_upload(
    kind: str, upload: Tensors, received: Tensors, scale: float, generator: torch.Generator | None = None
) -> Tensors:
    """What an attacker uploads instead of ``upload``: received − Δ (sign-flip), received + λΔ
    (scale) or received + N(0, λ²) (gaussian, from ``generator``)."""
    if kind == "sign-flip":
        return {name: received[name] - delta for name, delta in model_update(upload, received).items()}
    if kind == "scale":
        return {name: received[name] + scale * delta for name, delta in model_update(upload, received).items()}
    if kind == "gaussian":
        if generator is None:
            raise ValueError("the gaussian attack draws from a generator")
        noise = gaussian_noise_like({name: upload[name] for name in upload}, scale, generator)
        return {name: received[name] + noise[name] for name in upload}
    raise ValueError(f"{kind!r} is not a model-poisoning attack; valid: {', '.join(MODEL_POISONING)}")


class PoisonedUploads:
    """The seam's first stage: each attacker's upload is replaced (``poison_upload``) before it
    reaches ``inner`` (differential privacy's private mean, a robust rule or FedAvg's stream)."""

    def __init__(
        self, inner: Any, received: Tensors, attackers: set[int], spec: AttackSpec, seed: int, round_index: int
    ) -> None:
        self.inner, self.attackers, self.spec, self.seed, self.round = inner, attackers, spec, seed, round_index
        self.received = {name: t.detach().clone() for name, t in received.items()}

    def add(self, update: ClientUpdate) -> None:
        if update.client_id in self.attackers and update.params:
            generator = None
            if self.spec.kind == "gaussian":
                seed = derive_seed(self.seed, GAUSSIAN_STREAM, self.round, update.client_id)
                generator = torch.Generator().manual_seed(seed)
            poisoned = poison_upload(self.spec.kind, update.params, self.received, self.spec.scale, generator)
            update = dataclasses.replace(update, params=poisoned)
        self.inner.add(update)

    def finish(self) -> None:
        self.inner.finish()
