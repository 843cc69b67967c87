"""FedBABU — Oh, Kim & Yun, "FedBABU: Toward Enhanced Representation for Federated Image
Classification", ICLR 2022 (arXiv:2106.06042).

During federated training the head (the last ``--head-layers`` layers, the classifier) stays at
its random initialisation: clients train only the body ("body update") for ``--local-epochs``
epochs and upload it; the server averages the body, b ← Σ_k n_k·b_k / Σ_k n_k. At evaluation each
client fine-tunes the received model — body and head, the paper's personalization — for
``--ft-epochs`` epochs on its own train split with the run's local optimizer and is tested with
the result (pers_acc). global_acc is the global model before any fine-tuning (the trained body
with the initial head). The fine-tuning runs through the executor
(``Algorithm.personalization_program``, engine ``FineTuneProgram``), the ``personalize`` random
stream; it changes nothing that is trained.

Hyperparameters: ``--ft-epochs`` τ_f (default 5, the fine-tuning epochs of the paper's main
personalization results), ``--ft-part`` full | head (default full: the paper fine-tunes the whole
model; head = fine-tune only the head, an ablation).

State: shared = the body (sent down and uploaded, counted in bytes). The head never changes and is
the same on every client (all build it from the run's common initialisation), so it never travels
and nothing is stored per client: each client's model is the received body + the initial head.

New clients (``--new-clients``): served like every client at evaluation — the global model
(trained body + initial head) fine-tuned for ``--ft-epochs`` on the client's train split (the
paper's personalization); with ``--ft-epochs 0`` the global model as it is.
"""

from __future__ import annotations

from dataclasses import dataclass

from pflbench import (
    Algorithm,
    Capabilities,
    ClientProgram,
    ConfigError,
    LocalPhase,
    ProgramCapabilities,
    Tensors,
    option,
    register_algorithm,
)
from pflbench.engine import FineTuneProgram
from pflbench.models.zoo import head_parameter_names


@dataclass(frozen=True)
class FedBABUHyperparameters:
    ft_epochs: int = option(
        5, "Fine-tuning epochs of each client at evaluation (0 = evaluate the global model as it is)."
    )
    ft_part: str = option(
        "full",
        "What the evaluation fine-tunes: full (body and head, as in the paper) or head.",
        choices=("full", "head"),
    )

    def validate(self) -> None:
        if self.ft_epochs < 0:
            raise ConfigError(f"--ft-epochs must be ≥ 0, got {self.ft_epochs}")


class FedBABUProgram(ClientProgram[FedBABUHyperparameters]):
    capabilities = ProgramCapabilities(batch_loop=True, model_upload=True)

    def local_phases(self, client_id: int) -> list[LocalPhase]:
        """Body only: the head is frozen at its initialisation."""
        shared = set(self.layout.shared)
        return [LocalPhase(self.local.epochs, frozenset(n for n in self.layout.trainable if n in shared))]

    def private_state(self, state: Tensors, job_private: Tensors) -> Tensors:
        return {}  # the head is the initial one on every client: nothing to keep


@register_algorithm("fedbabu")
class FedBABU(Algorithm[FedBABUHyperparameters]):
    """Body trained and averaged with the head frozen at init; each client fine-tunes at test time."""

    capabilities = Capabilities.of_defaults()

    display_name = "FedBABU"
    paper = "Oh et al., ICLR 2022"
    method_family = "decoupling"
    hyperparameters = FedBABUHyperparameters
    program_class = FedBABUProgram
    uses_head_layers = True

    def select_shared(self, names: list[str]) -> list[str]:
        head = head_parameter_names(self.model, self.config.head_layers)
        return [name for name in names if name not in head]

    def clients_share_one_model(self) -> bool:
        return self.hparams.ft_epochs == 0  # without fine-tuning every client has the global model

    def new_client_program(self) -> ClientProgram | None:
        """The same fine-tuning as every client's (none with ``--ft-epochs 0``)."""
        return self.personalization_program()

    def personalization_program(self) -> ClientProgram | None:
        if self.hparams.ft_epochs == 0:
            return None
        trainable = self.layout.trainable
        tuned = (
            trainable
            if self.hparams.ft_part == "full"
            else tuple(n for n in trainable if n not in set(self.layout.shared))
        )
        return FineTuneProgram(trainable, self.config.local_spec, self.hparams.ft_epochs, frozenset(tuned))
