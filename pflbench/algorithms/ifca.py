"""IFCA — Ghosh, Chung, Yin & Ramchandran, "An Efficient Framework for Clustered Federated
Learning", NeurIPS 2020 (arXiv:2006.04088).

The server keeps M cluster models θ_1..θ_M (``--clusters``). Each round every sampled client k
receives all M models, estimates its cluster identity as the one with the lowest empirical loss
on its own train split

    ĵ_k = argmin_j F_k(θ_j),   F_k = mean cross-entropy over k's train samples  (``select_cluster``)

trains θ_ĵ locally (``--local-epochs`` of the run's optimizer: the paper's *model averaging*
variant, Algorithm 2 option II) and uploads the trained model with ĵ. The server averages per
cluster, sample-weighted over the clients that chose it (``cluster_average``):

    θ_j ← Σ_{k: ĵ_k = j} n_k·θ_k / Σ_{k: ĵ_k = j} n_k;  a cluster nobody chose stays unchanged.

Choices the paper leaves open, and what this file does:

- Initialisation. The paper draws the M models at random (it notes that IFCA needs an
  initialisation that separates the clusters, and re-runs with random restarts). Cluster 0 is the
  run's initial model (``--seed``'s init stream); cluster j ≥ 1 re-initialises every module whose
  own parameters are all trainable (``reset_parameters``) from the seed
  ``derive_seed(seed, "ifca.init", j)``, on the CPU, so the clusters differ and the run stays
  reproducible on any device. Frozen tensors (a LoRA backbone) are the same in every cluster;
  with ``--pretrained``/``--weights`` clusters ≥ 1 lose the pretrained values of the re-initialised
  modules (the paper's random initialisation). Random initialisation can let one cluster win every
  client from the first round (then IFCA is FedAvg): rounds.jsonl's ``ifca_cluster_sizes`` shows it.
- Ties in the argmin go to the lowest cluster index. The losses are computed in eval mode
  (BatchNorm running statistics, no dropout) over the whole train split.
- Evaluation (``pers_acc``) uses the paper's rule with the *current* models: each client picks the
  cluster with the lowest loss on its train split and is tested with it (``IFCASelection``, run as
  the algorithm's test-time personalization; the clusters are not retrained). New clients
  (``--new-clients``) are served exactly so (``new_client_program``).
- Global model (``global_acc``): the paper has none; this file reports the most popular cluster
  (the one chosen by most training clients at their last participation, ties to the lowest index;
  cluster 0 before any assignment), a one-model baseline beside the personalized accuracy.

What travels: down, the M cluster models (bytes_down = M × the model); up, the trained model and
the chosen index as one int64 (8 bytes). Nothing is private on the clients.

Diagnostics: rounds.jsonl gets ``ifca_assignment`` (the chosen cluster of each of the round's
``clients``, in their order) and ``ifca_cluster_sizes`` (clients per cluster that round);
clients.csv gets ``ifca_cluster`` (each client's cluster at its last participation; -1: never
trained). When the partition records true groups (partition.json ``client_domains``, e.g. a
feature-shift or multi-domain scenario), the adjusted Rand index of the assignment against them
(``adjusted_rand_index``: 1 = the same grouping, ≈ 0 = chance) is reported per round over the
round's clients (``ifca_ari``) and at the end over all training clients (summary.json ``ifca_ari``).

Defaults: ``--clusters`` M = 2, the paper's value on CIFAR-10 (it uses 4 on rotated MNIST, one per
rotation): set it to the scenario's number of groups.

Executors: the cluster choice is a custom local update, so ``--executor vmap`` refuses it; the
sequential and Ray executors give identical numbers.
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from pflbench import (
    Algorithm,
    Capabilities,
    ClientProgram,
    ClientUpdate,
    ConfigError,
    ProgramCapabilities,
    RunConfig,
    Tensors,
    option,
    register_algorithm,
)
from pflbench.engine import LocalResult, LocalTrainer, standard_local_update, weighted_average
from pflbench.util.seeding import derive_seed

PREFIX = "ifca."
CHOSEN = "ifca.cluster"  # uploaded: the index of the cluster the client trained (int64, 8 bytes)
LOSS_CHUNK = 1024  # samples per forward pass when a client measures the cluster losses


def cluster_prefix(index: int) -> str:
    return f"{PREFIX}{index}."


def select_cluster(losses: Sequence[float]) -> int:
    """IFCA's cluster estimate: argmin_j of the losses, the lowest index on ties."""
    if not len(losses):
        raise ValueError("select_cluster needs at least one loss")
    return min(range(len(losses)), key=lambda j: (losses[j], j))


def cluster_average(
    clusters: list[Tensors], uploads: list[Tensors], chosen: list[int], num_samples: list[int]
) -> list[Tensors]:
    """Per cluster j, the sample-weighted mean of the uploads that chose j; a cluster nobody chose
    is returned unchanged."""
    result = []
    for j, cluster in enumerate(clusters):
        members = [i for i, c in enumerate(chosen) if c == j]
        if not members:
            result.append(cluster)
            continue
        total = sum(num_samples[i] for i in members)
        result.append(weighted_average([uploads[i] for i in members], [num_samples[i] / total for i in members]))
    return result


def adjusted_rand_index(labels_true: Sequence[Any], labels_pred: Sequence[Any]) -> float:
    """Hubert & Arabie's adjusted Rand index of two groupings of the same items:
    (Σ_ij C(n_ij,2) − E) / (½(Σ_i C(a_i,2) + Σ_j C(b_j,2)) − E), E = Σ_i C(a_i,2)·Σ_j C(b_j,2)/C(n,2),
    with n_ij the contingency table and a, b its row and column sums. 1.0 when both groupings are
    trivial in the same way (the formula's 0/0: e.g. one group each, or fewer than two items)."""
    if len(labels_true) != len(labels_pred):
        raise ValueError(f"adjusted_rand_index: {len(labels_true)} true labels vs {len(labels_pred)} predicted")

    def pairs(count: int) -> float:
        return count * (count - 1) / 2

    n = len(labels_true)
    together = sum(pairs(c) for c in Counter(zip(labels_true, labels_pred)).values())
    rows = sum(pairs(c) for c in Counter(labels_true).values())
    columns = sum(pairs(c) for c in Counter(labels_pred).values())
    expected = rows * columns / pairs(n) if n > 1 else 0.0
    maximum = (rows + columns) / 2
    if maximum == expected:
        return 1.0
    return (together - expected) / (maximum - expected)


@dataclass(frozen=True)
class IFCAHyperparameters:
    clusters: int = option(
        2, "M: number of cluster models (the paper uses 2 on CIFAR-10 and 4 on rotated MNIST: set it to your groups)."
    )

    def validate(self) -> None:
        if self.clusters < 1:
            raise ConfigError(f"--clusters must be ≥ 1, got {self.clusters}")


class IFCAProgram(ClientProgram[IFCAHyperparameters]):
    """Receives the M cluster models; picks the lowest-loss one, trains it, uploads it with ĵ."""

    capabilities = ProgramCapabilities(model_upload=True)

    def model_names(self) -> tuple[str, ...]:
        return self.layout.shared + self.layout.private

    def cluster(self, received: Tensors, index: int) -> Tensors:
        prefix = cluster_prefix(index)
        return {n: received[prefix + n] for n in self.model_names() if prefix + n in received}

    def assemble(self, received: Tensors, private: Tensors) -> Tensors:
        """Cluster 0's model (``local_update`` loads the chosen one before anything runs)."""
        return {**self.cluster(received, 0), **private}

    @torch.no_grad()
    def cluster_losses(self, trainer: LocalTrainer) -> list[float]:
        """F_k(θ_j) for every cluster j: the mean cross-entropy over the client's train split."""
        indices = trainer.data.train_indices[trainer.job.client_id]
        was_training = trainer.model.training
        trainer.model.eval()
        losses = []
        for j in range(self.hparams.clusters):
            params = self.cluster(trainer.job.received, j)
            total = 0.0  # a Python float: exact enough, and no float64 on devices without it
            for start in range(0, len(indices), LOSS_CHUNK):
                inputs, targets = trainer.data.gather(indices[start : start + LOSS_CHUNK])
                total += F.cross_entropy(trainer.forward(params, inputs), targets, reduction="sum").item()
            losses.append(float(total) / max(len(indices), 1))
        trainer.model.train(was_training)
        return losses

    def choose(self, trainer: LocalTrainer) -> int:
        """Load the lowest-loss cluster into the working model; returns its index."""
        chosen = select_cluster(self.cluster_losses(trainer))
        trainer.load(self.cluster(trainer.job.received, chosen))
        return chosen

    def local_update(self, trainer: LocalTrainer) -> LocalResult:
        chosen = self.choose(trainer)
        result = standard_local_update(self, trainer)
        upload = {n: trainer.state[n].detach().clone() for n in self.layout.shared}
        upload[CHOSEN] = torch.tensor([chosen], dtype=torch.int64, device=trainer.device)
        result.upload = upload
        return result


class IFCASelection(IFCAProgram):
    """Test-time rule (and new clients): the lowest-loss cluster's model, untrained, uploaded as
    the model the client is evaluated with."""

    def local_update(self, trainer: LocalTrainer) -> LocalResult:
        self.choose(trainer)
        model = {n: trainer.state[n].detach().clone() for n in self.model_names()}
        return LocalResult(float("nan"), {}, upload=model, private={})


@register_algorithm("ifca")
class IFCA(Algorithm[IFCAHyperparameters]):
    """M cluster models; each client trains the one with its lowest loss; per-cluster averaging."""

    capabilities = Capabilities(same_broadcast=True)

    display_name = "IFCA"
    paper = "Ghosh et al., NeurIPS 2020"
    method_family = "clustering"
    hyperparameters = IFCAHyperparameters
    program_class = IFCAProgram
    checkpoint_attributes = ("assignment",)

    @classmethod
    def check_config(cls, config: RunConfig, hparams: IFCAHyperparameters) -> None:
        """More cluster models than clients can never all be chosen (and 10**20 of them exhaust memory)."""
        if config.num_clients is not None and hparams.clusters > config.num_clients:
            raise ConfigError(
                f"--clusters {hparams.clusters} is more than the {config.num_clients} clients (each picks one "
                f"cluster); give --clusters in [1, {config.num_clients}]"
            )

    def __init__(self, config, hparams: IFCAHyperparameters, model, num_train) -> None:
        super().__init__(config, hparams, model, num_train)
        if self.layout.private:  # nothing is private: select_shared keeps every tensor
            raise RuntimeError("IFCA shares every model tensor")
        initial = dict(self.global_state)
        self.global_state = {}
        for j in range(hparams.clusters):
            state = initial if j == 0 else self.reinitialised(j)
            self.global_state.update({cluster_prefix(j) + n: state[n].detach().clone() for n in initial})
        self.assignment: list[int] = [-1] * len(num_train)  # cluster at the last participation

    def reinitialised(self, index: int) -> Tensors:
        """The model with every fully trainable module re-initialised from cluster ``index``'s seed."""
        device = next(iter(self.initial_state.values())).device
        fresh = copy.deepcopy(self.model).cpu()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(derive_seed(self.config.seed, "ifca.init", index))
            for module in fresh.modules():
                own = list(module.parameters(recurse=False))
                reset = getattr(module, "reset_parameters", None)
                if own and all(p.requires_grad for p in own) and callable(reset):
                    reset()
        tensors = {**dict(fresh.named_parameters()), **dict(fresh.named_buffers())}
        return {n: t.detach().to(device) for n, t in tensors.items()}

    def cluster_model(self, index: int) -> Tensors:
        prefix = cluster_prefix(index)
        return {n[len(prefix) :]: t for n, t in self.global_state.items() if n.startswith(prefix)}

    @torch.no_grad()
    def aggregate(self, updates: list[ClientUpdate]) -> None:
        if not updates:
            return
        names = list(self.cluster_model(0))
        chosen = [int(u.params[CHOSEN]) for u in updates]
        clusters = [self.cluster_model(j) for j in range(self.hparams.clusters)]
        averaged = cluster_average(
            clusters, [{n: u.params[n] for n in names} for u in updates], chosen, [u.num_samples for u in updates]
        )
        for j, (before, after) in enumerate(zip(clusters, averaged)):
            if after is not before:
                for n in names:
                    self.global_state[cluster_prefix(j) + n].copy_(after[n])
        for update, j in zip(updates, chosen):
            self.assignment[update.client_id] = j

    def client_domains_of(self, clients: Sequence[int]) -> list[str] | None:
        domains = self.client_domains
        return None if domains is None else [domains[k] for k in clients]

    def round_diagnostics(self, updates: list[ClientUpdate]) -> dict[str, Any]:
        chosen = [self.assignment[u.client_id] for u in updates]
        sizes = [chosen.count(j) for j in range(self.hparams.clusters)]
        record: dict[str, Any] = {"ifca_assignment": chosen, "ifca_cluster_sizes": sizes}
        domains = self.client_domains_of([u.client_id for u in updates])
        if domains is not None:
            record["ifca_ari"] = adjusted_rand_index(domains, chosen)
        return record

    def final_report(self) -> tuple[dict[str, Any], dict[str, list[Any]]]:
        trained = [k for k, j in enumerate(self.assignment) if j >= 0]
        summary: dict[str, Any] = {"ifca_clusters_used": len({self.assignment[k] for k in trained})}
        domains = self.client_domains_of(trained)
        if domains is not None:
            summary["ifca_ari"] = adjusted_rand_index(domains, [self.assignment[k] for k in trained])
        return summary, {"ifca_cluster": list(self.assignment)}

    def most_popular_cluster(self) -> int:
        counts = Counter(j for j in self.assignment if j >= 0)
        return select_cluster([-counts.get(j, 0) for j in range(self.hparams.clusters)])

    def personal_model(self, client_id: int) -> Tensors:
        """Every cluster model: ``IFCASelection`` picks the client's on its train split."""
        return dict(self.global_state)

    def personalization_program(self) -> ClientProgram:
        return IFCASelection(self.layout, self.hparams, self.config.local_spec)

    def new_client_model(self, client_id: int) -> Tensors:
        return dict(self.global_state)

    def global_model(self) -> Tensors:
        return self.cluster_model(self.most_popular_cluster())

    def run_info(self) -> dict[str, Any]:
        return {"ifca_clusters": self.hparams.clusters}
