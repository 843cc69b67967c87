"""Example plugin: an algorithm that adds a loss term (FedProx's proximal term).

What it shows: the smallest useful algorithm — one ``ClientProgram.loss_terms`` override and a
hyperparameter dataclass. Everything else (what travels, FedAvg's aggregation, evaluation) is
the engine's default.

The algorithm is FedProx (Li et al., MLSys 2020, arXiv:1812.06127): client k starts from the
global weights w^t it received and minimises, over its minibatches,

    f_k(w) + (μ/2)·‖w − w^t‖²

The server averages the uploads as FedAvg does: w^{t+1} = Σ_k n_k·w_k / Σ_k n_k. The engine
logs each term's mean per round in rounds.jsonl (``loss_task``, ``loss_proximal``); μ = 0 is
FedAvg exactly. (pflbench's built-in ``fedprox`` is the same algorithm; this file is its
self-contained twin for reading.)

Run it (``--prox-mu`` is the hyperparameter below, turned into a CLI option):

    pflbench run --plugin algorithms/example_loss_term.py --algo example_prox --prox-mu 0.1 \\
        --dataset digits --model mlp --num-clients 10 --rounds 20

Rules ``loss_terms`` follows so that every executor can run it (``--executor vmap`` included):
it is a pure function of ``params`` and the batch (the model's output is
``forward(params, inputs)``), uses per-tensor operations and never updates ``params`` in place.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pflbench import (
    Algorithm,
    Capabilities,
    ClientProgram,
    ConfigError,
    ProgramCapabilities,
    Tensors,
    option,
    register_algorithm,
)


def proximal_term(params: Tensors, anchor: Tensors, mu: float) -> torch.Tensor:
    """(μ/2)·Σ_name ‖params[name] − anchor[name]‖², over the trainable tensors in ``params``."""
    return 0.5 * mu * sum((params[n] - anchor[n]).pow(2).sum() for n in params if n in anchor)


@dataclass(frozen=True)
class ExampleProxHyperparameters:
    # Each field becomes a CLI option (--prox-mu) and is recorded in config.json; names are
    # shared by all algorithms' options, so pick one no run option or other plugin uses.
    prox_mu: float = option(0.01, "μ of the proximal term (μ/2)·‖w − w_global‖².")

    def validate(self) -> None:  # called once, before the run starts: bad values are usage errors
        if not self.prox_mu >= 0:
            raise ConfigError(f"--prox-mu must be ≥ 0, got {self.prox_mu}")


class ExampleProxProgram(ClientProgram[ExampleProxHyperparameters]):
    """Client side: the default loss (``task``: cross-entropy) plus the proximal term."""

    # declared, not inherited: only loss_terms is new, so the batch loop and the default upload
    capabilities = ProgramCapabilities.of_defaults()

    def loss_terms(self, forward, params, inputs, targets, received):
        terms = super().loss_terms(forward, params, inputs, targets, received)  # {"task": CE}
        terms["proximal"] = proximal_term(params, received, self.hparams.prox_mu)  # received = w^t
        return terms  # the engine minimises Σ loss_weights[name]·term (every weight 1 here)


@register_algorithm("example_prox")
class ExampleProx(Algorithm[ExampleProxHyperparameters]):
    """FedAvg with (μ/2)·‖w − w_global‖² added to every local loss (example plugin)."""

    display_name = "ExampleProx"  # the name leaderboards show
    paper = "Li et al., MLSys 2020 (FedProx)"
    hyperparameters = ExampleProxHyperparameters
    program_class = ExampleProxProgram
    capabilities = Capabilities.of_defaults()  # FedAvg's server hooks: --dp, --attack, --robust-agg, streaming
