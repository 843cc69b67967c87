"""Defaults of the settings a run may leave unset (``None`` in ``RunConfig``), in one table.

``config.resolve`` fills an unset setting from, in order: the algorithm's ``run_defaults``
(e.g. LoRA runs: ``config.lora.RUN_DEFAULTS``; FedSDG's clipping), a sweep's shared defaults, the defaults of the resolved
model's family (``DEFAULTS_BY_FAMILY``), then ``BASE_DEFAULTS``. ``config.json`` records every
value filled this way under ``resolved.run_defaults`` (and the family under
``resolved.defaults_family``). No torch import here: the CLI shows these without loading it.
"""

from __future__ import annotations

from typing import Any

# Settings left unset (None) that nothing else gave a value: the plain defaults.
BASE_DEFAULTS: dict[str, Any] = {
    "model": "cnn",
    "public_frac": 0.0,
    "optimizer": "sgd",
    "lr": 0.01,
    "max_grad_norm": 0.0,
}
AUTO_FIELDS = tuple(BASE_DEFAULTS)


# The zoo's small models trained from scratch with plain SGD (no momentum, batch 32, 1 local
# epoch) on the small built-in data. On digits (1,797 samples over 20 clients: about 2
# minibatches per client and round) lr 0.01 barely moves (FedAvg: chance after 5 rounds); the
# learning rates below were measured (digits, CNN, α 0.5, 20 clients, 50 rounds, seed 0) to
# learn within the default 50 rounds for every built-in algorithm: the table is in the docs,
# docs/guides/configuration.md, "Defaults that learn". The same lr 0.1 is what the docs' digits
# reference runs used. timm models
# (pretrained or not, other scales) keep the base lr 0.01; LoRA runs keep config.lora.RUN_DEFAULTS.
MODEL_FAMILIES: dict[str, str] = {"mlp": "small", "cnn": "small", "lenet": "small", "cnn_bn": "small"}
DEFAULTS_BY_FAMILY: dict[str, dict[str, Any]] = {
    "small": {"lr": 0.1},
}
# An algorithm measured not to learn with its family's values declares its own in its plugin
# (``Algorithm.defaults_by_family``, e.g. SCAFFOLD's and FedDyn's lr): the core names no algorithm.


def model_family(model: str | None) -> str | None:
    """The defaults family of a model name (``None``: no family, the base defaults apply)."""
    return MODEL_FAMILIES.get(model or "")


def family_defaults(model: str | None, refinements: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """The defaults of ``model``'s family, refined by an algorithm's ``defaults_by_family``."""
    family = model_family(model)
    if family is None:
        return {}
    return {**DEFAULTS_BY_FAMILY.get(family, {}), **(refinements or {}).get(family, {})}
