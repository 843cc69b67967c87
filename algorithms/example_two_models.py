"""Example plugin: two models per client (Ditto's shape), the second kept as private state.

What it shows: per-client state beyond the model. Client k keeps a personal model v_k next to
the global model w:

- ``Algorithm.extra_private_state`` gives every client its initial v (a copy of the initial
  model, stored under ``example.v.<name>`` so it is never mistaken for model state); it lives
  in the client store, so checkpoints capture it, and arrives in ``job.private``;
- ``ClientProgram.local_update`` trains both models and returns v in ``LocalResult.private``
  (kept on the client: never uploaded, never counted in bytes);
- ``Algorithm.personal_model`` makes v what the client is evaluated with (``pers_acc``), while
  ``global_acc`` is still w's. An algorithm with extra state that does not say how its clients
  are evaluated is refused at start.

The algorithm is Ditto (Li, Hu, Beirami & Smith, ICML 2021, arXiv:2012.04221): in round t the
client trains w exactly as FedAvg does (from the received w^t, uploaded, averaged by the server),
then trains v for as many epochs on

    f_k(v) + (λ/2)·‖v − w^t‖²

(w^t = the received global model, not the client's updated copy). The rounds.jsonl terms are
``loss_task`` (w's) and ``loss_personal_task``, ``loss_personal_pull`` (v's).

Run it:

    pflbench run --plugin algorithms/example_two_models.py --algo example_two_models \\
        --pull 0.1 --dataset digits --model mlp --num-clients 10 --rounds 20

A custom ``local_update`` runs on the sequential and Ray executors; ``--executor vmap`` refuses it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from pflbench import (
    Algorithm,
    Capabilities,
    ClientProgram,
    LocalResult,
    ProgramCapabilities,
    Tensors,
    mean_terms,
    option,
    register_algorithm,
    standard_local_update,
)

PERSONAL = "example.v."  # prefix of v's tensors in the client store (not model names)


@dataclass(frozen=True)
class TwoModelsHyperparameters:
    pull: float = option(0.1, "λ of (λ/2)·‖v − w‖², the personal model's pull towards the global one.")


class TwoModelsProgram(ClientProgram[TwoModelsHyperparameters]):
    capabilities = ProgramCapabilities(model_upload=True)  # its own local_update (not vmap's batch loop)

    def local_update(self, trainer):
        job, spec = trainer.job, self.optimizer()
        # 1. w: FedAvg's local training of the received global model; its upload is taken now
        result = standard_local_update(self, trainer)
        upload = self.upload(trainer.state, job.received)
        # 2. v: loaded into the same working model and trained with the pull towards w^t
        personal = {n[len(PERSONAL) :]: t for n, t in job.private.items() if n.startswith(PERSONAL)}
        trainer.load(personal)
        params = trainer.train_only(frozenset(personal), self.layout.trainable)
        optimizer = trainer.optimizer(spec, params)  # a fresh optimizer of the run's kind
        anchor = {n: job.received[n] for n in params}
        total, sums, steps = torch.zeros((), device=trainer.device), {}, 0
        for _ in range(self.local.epochs):
            for inputs, targets in trainer.epoch():
                task = F.cross_entropy(trainer.forward(trainer.params, inputs), targets)
                pull = 0.5 * self.hparams.pull * sum((params[n] - anchor[n]).pow(2).sum() for n in params)
                loss = task + pull
                trainer.step(optimizer, loss, params, spec.max_grad_norm)
                total += loss.detach()
                for name, value in (("personal_task", task), ("personal_pull", pull)):
                    sums[name] = sums[name] + value.detach() if name in sums else value.detach()
                steps += 1
        trainer.train_only(frozenset(self.layout.trainable), self.layout.trainable)  # leave it as found
        # 3. keep v (and any private model tensors); upload w
        private = {PERSONAL + n: t for n, t in trainer.snapshot(list(personal)).items()}
        private.update(self.private_state(trainer.state, job.private))
        terms = {**result.loss_terms, **mean_terms(total, sums, steps).loss_terms}  # means over v's steps
        return LocalResult(result.loss, terms, upload=upload, private=private)


@register_algorithm("example_two_models")
class ExampleTwoModels(Algorithm[TwoModelsHyperparameters]):
    """FedAvg's global model + a personal model per client pulled towards it (example plugin)."""

    display_name = "ExampleTwoModels"
    paper = "Li et al., ICML 2021 (Ditto)"
    hyperparameters = TwoModelsHyperparameters
    program_class = TwoModelsProgram
    # FedAvg's broadcast and aggregate; its own personal_model (v_k)
    capabilities = Capabilities(same_broadcast=True, fedavg_aggregate=True, diagnostics_without_uploads=True)

    def extra_private_state(self) -> Tensors:
        """v⁰ = w⁰ for every client: the shared tensors of the initial model (float buffers too)."""
        return {PERSONAL + n: t.clone() for n, t in self.global_state.items()}

    def personal_model(self, client_id: int) -> Tensors:
        """Client k is evaluated with v_k (its private model tensors, if any, as they are)."""
        state = self.store.get(client_id)
        model = self.model_state(self.program.assemble(self.broadcast(client_id), state))
        model.update({n[len(PERSONAL) :]: t for n, t in state.items() if n.startswith(PERSONAL)})
        return model
