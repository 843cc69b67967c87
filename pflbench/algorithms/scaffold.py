"""SCAFFOLD — Karimireddy et al., "SCAFFOLD: Stochastic Controlled Averaging for Federated
Learning", ICML 2020 (arXiv:1910.06378).

Server model x and server control variate c; client i keeps its control variate c_i
(init c = c_i = 0). Client i starts from y = x and takes K local SGD steps with the corrected
gradient

    y ← y − η·(g_i(y) − c_i + c)                                   (``corrected_gradient``)

then (option II of the paper, no extra pass over the data)

    c_i⁺ = c_i − c + (x − y) / (K·η)                               (``client_control_update``)

and uploads Δy_i = y − x and Δc_i = c_i⁺ − c_i. The server, with S the round's clients and N
all clients that train (``--new-clients`` are never part of the population):

    x ← x + η_g · (1/|S|)·Σ_{i∈S} Δy_i,     c ← c + (|S|/N) · (1/|S|)·Σ_{i∈S} Δc_i

(``--server-lr`` η_g, default 1 as in the paper's experiments). The averages are uniform over
the round's clients, as in the paper's algorithm. Float buffers (BatchNorm statistics), which
have no gradient, travel as values and are averaged sample-weighted (FedAvg).

State and bytes: x and c travel down (bytes_down counts both); Δy (same size as x) and Δc_i
travel up (bytes_up counts both). c_i is extra private state in the ClientStateStore
(``scaffold.ci.<param>``). K is the number of local steps the client actually took, η the local
``--lr``. Evaluation: the global model x on every client (SCAFFOLD has no personal model).

Optimizer: plain SGD only. The correction is a gradient correction; with momentum or Adam the
paper's update (and option II's control estimate, which assumes y − x = −η·Σ steps) would not
hold, so ``check_config`` refuses them. Weight decay and ``--max-grad-norm`` apply to the
corrected gradient.

New clients (``--new-clients``): served by the global model as it is (with
``--finetune-epochs E`` also fine-tuned for E epochs: ``new_acc_ft``; ``Algorithm``'s default).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from pflbench import (
    Algorithm,
    Capabilities,
    ClientProgram,
    ClientUpdate,
    ConfigError,
    LocalResult,
    ProgramCapabilities,
    RunConfig,
    Tensors,
    option,
    register_algorithm,
    sample_weights,
    weighted_average,
)
from pflbench.engine import standard_local_update

SERVER_CONTROL = "scaffold.c."  # c, sent with x (bytes_down)
CLIENT_CONTROL = "scaffold.ci."  # c_i, private
CONTROL_DELTA = "scaffold.dc."  # Δc_i, uploaded (bytes_up)
PREFIX = "scaffold."


def corrected_gradient(
    gradient: torch.Tensor, client_control: torch.Tensor, server_control: torch.Tensor
) -> torch.Tensor:
    """g − c_i + c: the direction of SCAFFOLD's local step."""
    return gradient - client_control + server_control


def client_control_update(
    client_control: torch.Tensor,
    server_control: torch.Tensor,
    server_model: torch.Tensor,
    local_model: torch.Tensor,
    steps: int,
    lr: float,
) -> torch.Tensor:
    """Option II: c_i⁺ = c_i − c + (x − y)/(K·η); unchanged when no step was taken (K = 0)."""
    if steps == 0:
        return client_control.clone()
    return client_control - server_control + (server_model - local_model) / (steps * lr)


def server_update(
    model: Tensors,
    control: Tensors,
    model_deltas: list[Tensors],
    control_deltas: list[Tensors],
    server_lr: float,
    num_clients: int,
) -> tuple[Tensors, Tensors]:
    """x + η_g·mean Δy and c + (|S|/N)·mean Δc (uniform means over the |S| updates)."""
    sampled = len(model_deltas)
    mean_dy = weighted_average(model_deltas, [1 / sampled] * sampled)
    mean_dc = weighted_average(control_deltas, [1 / sampled] * sampled)
    new_model = {n: model[n] + server_lr * mean_dy[n] for n in mean_dy}
    new_control = {n: control[n] + (sampled / num_clients) * mean_dc[n] for n in mean_dc}
    return new_model, new_control


@dataclass(frozen=True)
class ScaffoldHyperparameters:
    server_lr: float = option(1.0, "Global step size η_g: x ← x + η_g·mean Δy (the paper uses 1).")

    def validate(self) -> None:
        if not self.server_lr > 0:
            raise ConfigError(f"--server-lr must be > 0, got {self.server_lr}")


class ScaffoldProgram(ClientProgram[ScaffoldHyperparameters]):
    capabilities = ProgramCapabilities(model_upload=True)

    def assemble(self, received: Tensors, private: Tensors) -> Tensors:
        """The model: x (the control variates are not model state)."""
        return {n: t for n, t in {**received, **private}.items() if not n.startswith(PREFIX)}

    def local_update(self, trainer) -> LocalResult:
        """The engine's batch loop with each step's gradient corrected by c − c_i (a gradient
        hook on every controlled parameter), then option II's control update."""
        received, private = trainer.job.received, trainer.job.private
        names = self.layout.groups["controlled"]
        shift = {n: received[SERVER_CONTROL + n] - private[CLIENT_CONTROL + n] for n in names}
        steps = [0]

        def correct(name: str):
            def hook(gradient: torch.Tensor) -> torch.Tensor:
                if name == names[0]:
                    steps[0] += 1  # one backward pass = one local step
                return gradient + shift[name]  # = corrected_gradient(g, c_i, c)

            return hook

        handles = [trainer.params[n].register_hook(correct(n)) for n in names]
        try:
            result = standard_local_update(self, trainer)
        finally:
            for handle in handles:
                handle.remove()
        state, upload, kept = trainer.state, {}, {}
        for n in self.layout.shared:
            upload[n] = state[n].detach().clone()
        for n in names:
            y, x = state[n].detach(), received[n]
            new_control = client_control_update(
                private[CLIENT_CONTROL + n], received[SERVER_CONTROL + n], x, y, steps[0], self.local.lr
            )
            upload[n] = y - x  # Δy
            upload[CONTROL_DELTA + n] = new_control - private[CLIENT_CONTROL + n]  # Δc_i
            kept[CLIENT_CONTROL + n] = new_control
        kept.update({n: state[n].detach().clone() for n in self.layout.private})
        result.upload, result.private = upload, kept
        return result


@register_algorithm("scaffold")
class Scaffold(Algorithm[ScaffoldHyperparameters]):
    """Control variates c (server) and c_i (clients) correct client drift; plain SGD only."""

    capabilities = Capabilities(received_personal_model=True)

    display_name = "SCAFFOLD"
    paper = "Karimireddy et al., ICML 2020"
    method_family = "global"
    hyperparameters = ScaffoldHyperparameters
    program_class = ScaffoldProgram
    checkpoint_attributes = ("control",)  # server state across rounds (checkpoints)
    personal_model_is_received = True  # c_i is not a model: every client evaluates x
    # The control variates blow up at the small models' lr 0.1 on digits (chance again before
    # round 50, also at lr 0.05); 0.02 learns within the default 50 rounds (docs/guides/configuration.md, "Defaults that learn").
    defaults_by_family = {"small": {"lr": 0.02}}

    @classmethod
    def check_config(cls, config: RunConfig, hparams: ScaffoldHyperparameters) -> None:
        if config.optimizer != "sgd" or config.momentum:
            raise ConfigError(
                f"scaffold corrects plain SGD steps (y ← y − η(g − c_i + c)); --optimizer "
                f"{config.optimizer} --momentum {config.momentum:g} would not be SCAFFOLD: use "
                "--optimizer sgd --momentum 0"
            )

    def __init__(self, config: RunConfig, hparams: ScaffoldHyperparameters, model, num_train) -> None:
        super().__init__(config, hparams, model, num_train)
        self.control = {n: torch.zeros_like(self.global_state[n]) for n in self.layout.groups["controlled"]}

    def param_groups(self) -> dict[str, tuple[str, ...]]:
        """``controlled``: the trainable shared parameters (the ones with control variates)."""
        return {"controlled": tuple(n for n, p in self.model.named_parameters() if p.requires_grad)}

    def extra_private_state(self) -> Tensors:
        return {CLIENT_CONTROL + n: torch.zeros_like(self.global_state[n]) for n in self.layout.groups["controlled"]}

    def broadcast(self, client_id: int) -> Tensors:
        return {**self.global_state, **{SERVER_CONTROL + n: c for n, c in self.control.items()}}

    @torch.no_grad()
    def aggregate(self, updates: list[ClientUpdate]) -> None:
        if not updates:
            return
        names = list(self.control)
        model, control = server_update(
            {n: self.global_state[n] for n in names},
            self.control,
            [{n: u.params[n] for n in names} for u in updates],
            [{n: u.params[CONTROL_DELTA + n] for n in names} for u in updates],
            self.hparams.server_lr,
            self.config.num_training_clients,  # N: the clients that train (new clients never do)
        )
        buffers = [n for n in self.layout.shared if n not in self.control]
        if buffers:
            model.update(
                weighted_average([{n: u.params[n] for n in buffers} for u in updates], sample_weights(updates))
            )
        for n, value in model.items():
            self.global_state[n].copy_(value)
        for n, value in control.items():
            self.control[n].copy_(value)

    def round_diagnostics(self, updates: list[ClientUpdate]) -> dict[str, Any]:
        norm = (
            torch.linalg.vector_norm(torch.stack([c.norm() for c in self.control.values()]))
            if self.control
            else torch.zeros(())
        )
        return {"server_control_norm": float(norm)}
