"""Example plugin: server state that changes across rounds, checkpointed (FedAvgM).

What it shows: an ``aggregate`` override with server state of its own — a momentum buffer —
and the one line that makes a run with such state resume exactly after a kill:
``checkpoint_attributes = ("velocity",)``. ``global_state`` and the client store are saved by
default; any other attribute the server changes across rounds must be named there (a tensor, a
dict of tensors, or a JSON-able value). Without it the engine notices the attribute change at the
first checkpoint, warns naming it and writes no checkpoints for the run (a resume then starts
over). Attributes set once in ``__init__`` need nothing.

The algorithm is FedAvgM (Hsu, Qi & Brown 2019, arXiv:1909.06335): clients train as in FedAvg;
with w̄ = Σ_k n_k·w_k / Σ_k n_k the average of the round's uploads, the server takes a momentum
step on the pseudo-gradient Δ = w^t − w̄:

    v ← β·v + Δ,        w^{t+1} = w^t − η·v          (v⁰ = 0)

β = ``--server-momentum``, η = ``--server-lr``; β = 0, η = 1 is FedAvg. Float buffers
(BatchNorm statistics) have no gradient and are averaged. ``round_diagnostics`` logs ‖v‖ in
rounds.jsonl (``server_velocity_norm``).

Run it (``--checkpoint-every 5`` writes a checkpoint every 5 rounds; after a kill, the same
command with ``--resume`` continues from the last one):

    pflbench run --plugin algorithms/example_server_state.py --algo example_server_momentum \\
        --server-momentum 0.9 --dataset digits --model mlp --num-clients 10 --rounds 20 --checkpoint-every 5
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pflbench import (
    Algorithm,
    Capabilities,
    ConfigError,
    option,
    register_algorithm,
    sample_weights,
    weighted_average,
)


@dataclass(frozen=True)
class ServerMomentumHyperparameters:
    server_momentum: float = option(0.9, "β of the server's momentum v ← β·v + (w − w_avg).")
    server_lr: float = option(1.0, "η of the server step w ← w − η·v.")

    def validate(self) -> None:
        if not 0 <= self.server_momentum < 1:
            raise ConfigError(f"--server-momentum must be in [0, 1), got {self.server_momentum}")
        if not self.server_lr > 0:
            raise ConfigError(f"--server-lr must be > 0, got {self.server_lr}")


@register_algorithm("example_server_momentum")
class ExampleServerMomentum(Algorithm[ServerMomentumHyperparameters]):
    """FedAvg with server momentum on the averaged update (example plugin)."""

    display_name = "ExampleFedAvgM"
    paper = "Hsu et al., arXiv:1909.06335 (FedAvgM)"
    hyperparameters = ServerMomentumHyperparameters
    checkpoint_attributes = ("velocity",)  # server state across rounds: saved with every checkpoint
    # its own aggregate (not the FedAvg average: no --dp, --robust-agg or streaming); the default
    # broadcast and personal model; round_diagnostics reads the velocity, not the uploads
    capabilities = Capabilities(same_broadcast=True, diagnostics_without_uploads=True, received_personal_model=True)

    def __init__(self, config, hparams, model, num_train) -> None:
        super().__init__(config, hparams, model, num_train)
        # v⁰ = 0 for each shared trainable tensor (created here, so that a restore can fill it)
        trainable = set(self.layout.trainable)
        self.velocity = {n: torch.zeros_like(w) for n, w in self.global_state.items() if n in trainable}

    @torch.no_grad()
    def aggregate(self, updates) -> None:
        if not updates:
            return
        average = weighted_average([u.params for u in updates], sample_weights(updates))  # w̄
        beta, lr = self.hparams.server_momentum, self.hparams.server_lr
        for name, mean in average.items():
            weights = self.global_state[name]
            if name in self.velocity:
                self.velocity[name].mul_(beta).add_(weights - mean)  # v ← β·v + (w − w̄)
                weights.sub_(lr * self.velocity[name])  # w ← w − η·v
            else:
                weights.copy_(mean)  # float buffers: plain average

    def round_diagnostics(self, updates) -> dict[str, float]:
        """Extra keys for this round's line in rounds.jsonl (called after ``aggregate``)."""
        return {"server_velocity_norm": float(torch.sqrt(sum(v.pow(2).sum() for v in self.velocity.values())))}
