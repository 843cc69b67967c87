"""Client/Server base classes and the round engine.

``Server.run`` is the template method (sample → send → local train → aggregate → evaluate →
log). The engine owns the batch loop and calls the optimizer; algorithms override small hooks:

- Server: ``select_shared`` (what travels), ``broadcast`` (what client k receives),
  ``load_client`` (how a client's model is assembled), ``aggregate`` (the update rule),
  ``round_diagnostics``, ``run_info``; ``has_global_model``; ``lora_rank`` and
  ``lora_layer_class`` (LoRA runs: the runner wraps the model before the server sees it).
- Client: ``local_phases`` (which params train for how many epochs), ``loss_terms`` (a pure
  function of (params, batch): CE plus any extra terms), ``make_optimizer``, ``upload``.

Parameters are either *shared* (the server holds them; sent every round), *private* (kept per
client in the ``ClientStateStore``) or frozen (never trained, never copied).
"""
from __future__ import annotations

import resource
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .config import RunConfig
from .data import FederatedData
from .lora import LoRALinear
from .metrics import accuracy_metrics
from .seeding import derive_seed, rng_stream

Tensors = dict[str, torch.Tensor]
Forward = Callable[[Tensors, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class NoHyperparameters:
    """An algorithm without hyperparameters of its own."""


@dataclass(frozen=True)
class LocalPhase:
    """``epochs`` passes over the client's train split updating only ``trainable`` params."""

    epochs: int
    trainable: frozenset[str]


@dataclass
class ClientUpdate:
    client_id: int
    num_samples: int
    params: Tensors  # exactly what the client uploaded
    loss_terms: dict[str, float]  # mean over local steps of each named term (unweighted)
    loss: float = float("nan")  # mean over local steps of the minimised (weighted) total


def tensor_bytes(tensors: Tensors) -> int:
    """Bytes on the wire: Σ numel × element size."""
    return sum(t.numel() * t.element_size() for t in tensors.values())


def weighted_average(updates: list[Tensors], weights: Iterable[float]) -> Tensors:
    """Σ_k w_k · params_k per tensor (the weights are used as given), using foreach kernels."""
    weights = list(weights)
    names = list(updates[0])
    total = [torch.zeros_like(updates[0][n]) for n in names]
    for update, weight in zip(updates, weights):
        torch._foreach_add_(total, [update[n] for n in names], alpha=weight)
    return dict(zip(names, total))


class ClientStateStore:
    """Each client's private tensors, created on first write; unseen clients read the initial state.

    Memory is O(clients seen × private size); shared and frozen weights are never stored here.
    """

    def __init__(self, initial: Tensors) -> None:
        self.initial = initial
        self._states: dict[int, Tensors] = {}

    def get(self, client_id: int) -> Tensors:
        return self._states.get(client_id, self.initial)

    def put(self, client_id: int, state: Tensors) -> None:
        stored = self._states.get(client_id)
        if stored is None:
            self._states[client_id] = {n: t.detach().clone() for n, t in state.items()}
        else:
            torch._foreach_copy_(list(stored.values()), [state[n] for n in stored])

    def __contains__(self, client_id: int) -> bool:
        return client_id in self._states

    def nbytes(self) -> int:
        return sum(tensor_bytes(state) for state in self._states.values())


class Client:
    """Client-side hooks. One instance serves every client; their state lives in the store."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.config: RunConfig = server.config
        self.hparams = server.hparams
        self.loss_weights: dict[str, float] = {}  # loss = Σ weight·term (default weight 1)
        self.max_grad_norm: float | None = self.config.max_grad_norm

    def local_phases(self) -> list[LocalPhase]:
        """Default: ``--local-epochs`` epochs over every trainable parameter."""
        return [LocalPhase(self.config.local_epochs, frozenset(self.server.trainable_names))]

    def loss_terms(self, forward: Forward, params: Tensors, inputs: torch.Tensor,
                   targets: torch.Tensor, received: Tensors) -> dict[str, torch.Tensor]:
        """Named loss terms; Σ ``loss_weights[name]``·term is minimised and each term is logged.

        ``received`` is what the server sent."""
        return {"task": F.cross_entropy(forward(params, inputs), targets)}

    def make_optimizer(self, params: dict[str, nn.Parameter]) -> torch.optim.Optimizer:
        config = self.config
        if config.optimizer == "adam":
            return torch.optim.Adam(params.values(), lr=config.lr, weight_decay=config.weight_decay)
        return torch.optim.SGD(params.values(), lr=config.lr, momentum=config.momentum,
                               weight_decay=config.weight_decay)

    def upload(self, state: Tensors, received: Tensors) -> Tensors:
        """Default: a copy of the shared tensors after local training."""
        return {name: state[name].detach().clone() for name in self.server.shared_names}


class Server:
    """Server-side hooks and the round loop. Subclass per algorithm and register it."""

    hyperparameters: type = NoHyperparameters
    client_class: type[Client] = Client
    has_global_model: bool = True  # False: global_acc is reported as null
    lora_layer_class: type[LoRALinear] = LoRALinear  # a subclass adds branches (FedSDG)

    @classmethod
    def lora_rank(cls, config: RunConfig, hparams: Any) -> int | None:
        """Rank the LoRA layers are built with (None: no LoRA); default ``--lora-rank``.

        The runner applies LoRA before constructing the server, so the frozen backbone is not
        trainable state and never travels."""
        return config.lora_rank

    def __init__(self, config: RunConfig, hparams: Any, model: nn.Module,
                 data: FederatedData) -> None:
        self.config, self.hparams, self.model, self.data = config, hparams, model, data
        self.parameters = dict(model.named_parameters())
        self.trainable_names = [n for n, p in self.parameters.items() if p.requires_grad]
        float_buffers = {n: b for n, b in model.named_buffers() if b.is_floating_point()}
        # Live tensors of the one working model that clients are loaded into, in place.
        self.state = {**{n: self.parameters[n] for n in self.trainable_names}, **float_buffers}
        self.shared_names = self.select_shared(list(self.state))
        self.private_names = [n for n in self.state if n not in set(self.shared_names)]
        self.global_state = {n: self.state[n].detach().clone() for n in self.shared_names}
        self.store = ClientStateStore({n: self.state[n].detach().clone() for n in self.private_names})
        self.client = self.client_class(self)
        self.sampling_rng = rng_stream(config.seed, "sampling")
        self._test_owner = torch.cat([torch.full((n,), k, dtype=torch.long, device=data.device)
                                      for k, n in enumerate(data.num_test)])
        self._all_test = torch.cat(data.test_indices)

    # ---- hooks ---------------------------------------------------------------------------
    def select_shared(self, names: list[str]) -> list[str]:
        """Which state tensors are shared (the rest stay private on each client)."""
        return names

    def broadcast(self, client_id: int) -> Tensors:
        """What client ``client_id`` receives this round (counted in bytes_down)."""
        return self.global_state

    def aggregate(self, updates: list[ClientUpdate]) -> None:
        """FedAvg: w ← Σ_k n_k·w_k / Σ_k n_k over the uploaded tensors."""
        if not updates or not updates[0].params:
            return
        total = sum(u.num_samples for u in updates)
        average = weighted_average([u.params for u in updates], [u.num_samples / total for u in updates])
        self.load_into(self.global_state, average)

    def round_diagnostics(self, updates: list[ClientUpdate]) -> dict[str, Any]:
        return {}

    def final_report(self) -> tuple[dict[str, Any], dict[str, list[Any]]]:
        """After the last round: extra summary.json entries and extra clients.csv columns."""
        return {}, {}

    def run_info(self) -> dict[str, Any]:
        """Settings the algorithm resolved at start (recorded in config.json)."""
        return {}

    def clients_share_one_model(self) -> bool:
        """True when every client's evaluation model is the global one (one pass evaluates all)."""
        return not self.private_names

    def load_client(self, client_id: int, received: Tensors) -> None:
        """Put client ``client_id``'s model in the working model: what it received + its private state."""
        self.load_into(self.state, received)
        self.load_into(self.state, self.store.get(client_id))

    def load_personal_model(self, client_id: int) -> None:
        self.load_client(client_id, self.broadcast(client_id))

    def load_global_model(self) -> None:
        self.load_into(self.state, self.global_state)

    # ---- engine --------------------------------------------------------------------------
    @staticmethod
    @torch.no_grad()
    def load_into(target: Tensors, source: Tensors) -> None:
        if source:
            torch._foreach_copy_([target[n] for n in source], list(source.values()))

    def sample_clients(self) -> list[int]:
        k, m = self.config.num_clients, self.config.sampled_per_round
        return sorted(int(c) for c in self.sampling_rng.choice(k, size=m, replace=False))

    def forward(self, params: Tensors, inputs: torch.Tensor) -> torch.Tensor:
        # Sequential execution: ``params`` are the working model's own parameters.
        return self.model(inputs)

    def train_client(self, client_id: int, received: Tensors, round_index: int) -> ClientUpdate:
        """Load the client, run its local phases (the batch loop), store private state, upload."""
        self.load_client(client_id, received)
        generator = torch.Generator().manual_seed(derive_seed(self.config.seed, "train", round_index, client_id))
        params, client, config = self.parameters, self.client, self.config
        sums: dict[str, torch.Tensor] = {}
        total = torch.zeros((), device=self.data.device)
        steps = 0
        self.model.train()
        for phase in client.local_phases():
            trainable = {n: params[n] for n in self.trainable_names if n in phase.trainable}
            for name in self.trainable_names:
                params[name].requires_grad_(name in phase.trainable)
            optimizer = client.make_optimizer(trainable)
            for _ in range(phase.epochs):
                for inputs, targets in self.data.train_batches(client_id, config.batch_size, generator):
                    terms = client.loss_terms(self.forward, params, inputs, targets, received)
                    loss = sum(client.loss_weights.get(n, 1.0) * t for n, t in terms.items())
                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    if client.max_grad_norm is not None:
                        torch.nn.utils.clip_grad_norm_(trainable.values(), client.max_grad_norm)
                    optimizer.step()
                    total += loss.detach()
                    for name, value in terms.items():
                        sums[name] = sums[name] + value.detach() if name in sums else value.detach()
                    steps += 1
        for name in self.trainable_names:
            params[name].requires_grad_(True)
        if self.private_names:
            self.store.put(client_id, {n: self.state[n] for n in self.private_names})
        means = torch.stack([total, *sums.values()]).div(max(steps, 1)).tolist()
        loss_terms = dict(zip(sums, means[1:])) if steps else {}
        return ClientUpdate(client_id, self.data.num_train[client_id],
                            client.upload(self.state, received), loss_terms,
                            means[0] if steps else float("nan"))

    @torch.no_grad()
    def _count_correct(self, indices: torch.Tensor, batch: int = 1024) -> torch.Tensor:
        """Per-sample correctness (bool) of the working model on ``indices``."""
        hits = []
        for start in range(0, len(indices), batch):
            inputs, targets = self.data.gather(indices[start:start + batch])
            hits.append(self.model(inputs).argmax(dim=1) == targets)
        return torch.cat(hits) if hits else torch.zeros(0, dtype=torch.bool)

    def evaluate(self) -> tuple[dict[str, Any], np.ndarray]:
        """Metrics over all clients' test splits, and each client's accuracy."""
        self.model.eval()
        num_clients = self.data.num_clients
        correct = torch.zeros(num_clients, dtype=torch.long, device=self.data.device)
        if self.clients_share_one_model():
            self.load_global_model()
            hits = self._count_correct(self._all_test)
            correct.index_add_(0, self._test_owner, hits.long())
            global_acc = float(hits.float().mean()) if self.has_global_model else None
        else:
            for k in range(num_clients):
                self.load_personal_model(k)
                correct[k] = self._count_correct(self.data.test_indices[k]).sum()
            global_acc = None
            if self.has_global_model:
                self.load_global_model()
                global_acc = float(self._count_correct(self._all_test).float().mean())
        correct_np, totals = correct.cpu().numpy(), np.asarray(self.data.num_test)
        metrics = accuracy_metrics(correct_np, totals)
        metrics["global_acc"] = global_acc
        return metrics, correct_np / totals

    def run(self, on_round: Callable[[dict[str, Any]], None] | None = None) -> np.ndarray:
        """The template method. Returns the final per-client accuracies."""
        config = self.config
        bytes_up_total = bytes_down_total = 0
        client_accuracy = np.zeros(self.data.num_clients)
        for round_index in range(1, config.rounds + 1):
            started = time.perf_counter()
            sampled = self.sample_clients()
            updates, bytes_up, bytes_down = [], 0, 0
            for client_id in sampled:
                received = self.broadcast(client_id)
                bytes_down += tensor_bytes(received)
                update = self.train_client(client_id, received, round_index)
                bytes_up += tensor_bytes(update.params)
                updates.append(update)
            self.aggregate(updates)
            bytes_up_total += bytes_up
            bytes_down_total += bytes_down
            record: dict[str, Any] = {"round": round_index, "clients": sampled}
            record.update(mean_loss_terms(updates))
            record.update(bytes_up=bytes_up, bytes_down=bytes_down,
                          bytes_up_cum=bytes_up_total, bytes_down_cum=bytes_down_total)
            record.update(self.round_diagnostics(updates))
            record["round_time_s"] = time.perf_counter() - started
            if round_index % config.resolved_eval_every == 0 or round_index == config.rounds:
                eval_started = time.perf_counter()
                metrics, client_accuracy = self.evaluate()
                record.update(metrics, eval_time_s=time.perf_counter() - eval_started)
            record["peak_mem_mb"] = peak_memory_mb(self.data.device)
            if on_round is not None:
                on_round(record)
        return client_accuracy


def mean_loss_terms(updates: list[ClientUpdate]) -> dict[str, float]:
    """train_loss = mean over the round's clients of their mean total loss; plus each term."""
    if not updates:
        return {"train_loss": float("nan")}
    names = list(updates[0].loss_terms)
    result = {"train_loss": float(np.mean([u.loss for u in updates]))}
    if len(names) > 1:
        result.update({f"loss_{n}": float(np.mean([u.loss_terms[n] for u in updates])) for n in names})
    return result


def peak_memory_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
