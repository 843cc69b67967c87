"""pFedHN — Shamsian, Navon, Fetaya & Chechik, "Personalized Federated Learning using
Hypernetworks", ICML 2021 (arXiv:2103.04628).

The server holds a hypernetwork h(·; φ) and one learned embedding v_i per client. Client i's
model is generated, θ_i = h(v_i; φ), sent to it, and trained locally to θ̃_i; the client uploads
Δθ_i = θ_i − θ̃_i. The server then moves φ and v_i by the chain rule — a vector–Jacobian product
through the generation:

    ∇_φ = (∂θ_i/∂φ)ᵀ·Δθ_i,     ∇_{v_i} = (∂θ_i/∂v_i)ᵀ·Δθ_i        (``hypernetwork_gradient``)

(Δθ_i is the local training's descent direction: for plain SGD it is η·Σ_steps ∇f_i.)

Hypernetwork (the authors' ``CNNHyper``, generalised to any target model): embedding table
(K × e) → Linear(e, H) → ``--hn-hidden-layers`` × [ReLU, Linear(H, H)] → one linear output head
per target tensor (H → numel, reshaped). Initialisation: PyTorch's defaults (embeddings N(0, 1),
linear layers U(±1/√fan_in)) drawn from the run's seed (stream ``pfedhn.init``).

Defaults from the authors' code (``experiments/pfedhn/trainer.py``): embedding size
e = int(1 + K/4) (``--embed-dim -1``), H = 100 (``--hn-hidden``), 3 hidden layers; server
optimizer SGD with momentum 0.9, weight decay 1e-3, the hypernetwork's gradient clipped to norm
50. The server learning rate is this suite's choice, 3e-3 (``--hn-lr``; the embeddings' lr
``--embed-lr``, default the same), not the authors' 1e-2, because of the round structure below:
the authors take one server step per client with φ regenerated after each step, while here the M
clients of a round are all generated at φ^t and their M steps follow one another, each with a
VJP taken at φ^t, so momentum 0.9 sums M stale steps (up to ~10× one step). Measured (full
Fashion-MNIST, Dir(0.1), 20 clients, M = 18, ``mlp`` hidden 100, 25 rounds, client SGD lr 0.1,
pers_acc): hn_lr 1e-2 diverged (non-finite loss) at round 5 on seed 0 (82.0% and 90.1% on seeds
1, 2), 3e-2 at round 2; 3e-3: 83.1 / 92.0 / 90.8% on seeds 0 / 1 / 2; on seed 0, 1e-3: 82.4%,
and 1e-2 without momentum: 82.6% — the momentum over stale steps, not the step size alone, is
what 1e-2 cannot afford at M = 18 (the client lr is not the cause: lr 0.05 gave 68.2%). The inner
(client) optimizer is the run's local optimizer (the authors: SGD lr 5e-3, momentum 0.9, weight
decay 5e-5, 50 inner steps of batch 64, gradient clipped to 50 — use ``--optimizer sgd --lr 0.005
--momentum 0.9 --weight-decay 5e-5 --max-grad-norm 50 --batch-size 64 --inner-steps 50`` for their
client side; by default this suite trains ``--local-epochs`` epochs like every other algorithm).

Choices the paper leaves open, and what the authors' code does:
- One client per server step in the paper and code (sample i, generate, train, update). Here a
  round trains M clients in parallel from the same φ^t; the server then takes M optimizer steps,
  one per reporting client in client-id order, each with that client's VJP evaluated at φ^t (where
  its θ_i was generated): with M = 1 exactly the paper's step.
- The server-step budget. The paper trains 5,000 server steps (``num_steps``), one per sampled
  client; a run of R rounds with M clients per round takes R·M (digits, 20 rounds × 20 clients:
  400), so for the paper's total budget run R·M ≥ 5,000 uploads (e.g. 250 rounds of 20 clients).
  ``--hn-server-steps`` S (default 1, the paper's one step per upload) takes S steps per upload
  instead, R·M·S in all: step 1 is the paper's step above; steps 2..S continue descending the same
  objective, ½‖h(v_i; φ) − θ̃_i‖² with θ̃_i = θ_i − Δθ_i the client's trained model (whose
  gradient at φ^t is exactly the paper's VJP with Δθ_i), at the current φ
  (``regression_residual``). They are no substitute for more rounds: measured (digits, Dir(0.1),
  cnn_bn, 20 clients, 20 rounds, lr 0.05, seeds 0–2, one H200, pers_acc) S = 1: 26.8%, S = 4:
  11.5%, S = 13 (5,200 steps, the paper's budget): 11.7% — repeated steps on one round's stale
  targets pull the shared output heads from client to client. The server's learning rate does not
  rescue this short budget either (``--hn-lr`` 0.001 / 0.003 / 0.03: 12.4 / 24.5 / 18.8%).
- The target tensors: every trainable parameter. Float buffers (BatchNorm statistics) are not
  generated; they stay with each client (private), as FL-bench refuses global buffers for pFedHN.
- Weight decay applies to the whole embedding table at every step (as torch's SGD does with a
  dense embedding gradient in the authors' code).

What travels (bytes): down, the generated model θ_i; up, Δθ_i (the same size). The hypernetwork
never leaves the server. Its memory: the output heads hold (H + 1)·d numbers for a model of d
parameters (about 100 models' worth at H = 100), twice with the momentum buffers. Server state —
φ, the embeddings and the SGD momentum buffers — is in checkpoints (``checkpoint_attributes``), so
a resumed run continues bit for bit.

Evaluation: pers_acc uses the generated model h(v_i; φ) as it is (the authors evaluate it without
local fine-tuning); there is no global model (global_acc null). New clients (``--new-clients``):
as the paper's novel clients, φ is frozen and only the client's embedding is learned — from the
mean embedding of the clients that have reported, ``--local-epochs`` epochs of the run's optimizer
on its train split (``PFedHNNewClientProgram``) — and the generated model is tested.

Refused: ``--executor vmap`` (the server update needs each client's upload separately and in full,
as does ``--dp``) and ``--dp`` (the upload drives a VJP, not an averaged update).
"""

from __future__ import annotations

import math
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
from pflbench.engine import LocalResult, LocalTrainer, mean_terms
from pflbench.util.seeding import derive_seed

EMBEDDINGS = "embeddings"
PHI = "pfedhn.phi."  # a new client's job: the hypernetwork's tensors (not model state)
NEW_EMBEDDING = "pfedhn.embedding"  # a new client's job: its embedding's start


def layer_name(index: int, kind: str) -> str:
    return f"mlp.{index}.{kind}"


def head_name(target: str, kind: str) -> str:
    return f"head[{target}].{kind}"


def init_hypernetwork(
    num_clients: int,
    embed_dim: int,
    hidden: int,
    hidden_layers: int,
    targets: dict[str, torch.Size],
    generator: torch.Generator,
) -> Tensors:
    """φ and the embeddings with PyTorch's default initialisation (nn.Embedding: N(0, 1);
    nn.Linear: weight and bias U(±1/√fan_in))."""

    def linear(fan_in: int, fan_out: int) -> tuple[torch.Tensor, torch.Tensor]:
        bound = 1.0 / math.sqrt(fan_in)
        weight = torch.empty(fan_out, fan_in).uniform_(-bound, bound, generator=generator)
        return weight, torch.empty(fan_out).uniform_(-bound, bound, generator=generator)

    params = {EMBEDDINGS: torch.randn(num_clients, embed_dim, generator=generator)}
    for index in range(hidden_layers + 1):
        weight, bias = linear(embed_dim if index == 0 else hidden, hidden)
        params[layer_name(index, "weight")], params[layer_name(index, "bias")] = weight, bias
    for target, shape in targets.items():
        weight, bias = linear(hidden, math.prod(shape))
        params[head_name(target, "weight")], params[head_name(target, "bias")] = weight, bias
    return params


def generate_weights(
    hypernetwork: Tensors, embedding: torch.Tensor, targets: dict[str, torch.Size], hidden_layers: int
) -> Tensors:
    """θ = h(v; φ): z = L_0(v), z ← L_j(ReLU(z)) for j = 1..hidden_layers, θ[t] = head_t(z)."""
    features = F.linear(embedding, hypernetwork[layer_name(0, "weight")], hypernetwork[layer_name(0, "bias")])
    for index in range(1, hidden_layers + 1):
        weight, bias = hypernetwork[layer_name(index, "weight")], hypernetwork[layer_name(index, "bias")]
        features = F.linear(F.relu(features), weight, bias)
    return {
        target: F.linear(
            features, hypernetwork[head_name(target, "weight")], hypernetwork[head_name(target, "bias")]
        ).reshape(shape)
        for target, shape in targets.items()
    }


def hypernetwork_gradient(
    hypernetwork: Tensors, client: int, delta: Tensors, targets: dict[str, torch.Size], hidden_layers: int
) -> Tensors:
    """(∂θ_i/∂(φ, V))ᵀ·Δθ_i: the VJP of θ_i = h(V[i]; φ) with the upload Δθ_i = θ_i − θ̃_i (rows of
    the embedding table V other than i get zero)."""
    leaves = {n: t.detach().requires_grad_(True) for n, t in hypernetwork.items()}
    generated = generate_weights(leaves, leaves[EMBEDDINGS][client], targets, hidden_layers)
    gradients = torch.autograd.grad(
        list(generated.values()), list(leaves.values()), [delta[t].to(generated[t].dtype) for t in generated]
    )
    return dict(zip(leaves, gradients))


def regression_residual(generated: Tensors, generated_at_upload: Tensors, delta: Tensors) -> Tensors:
    """h(v_i; φ) − θ̃_i with θ̃_i = θ_i − Δθ_i (θ_i generated at φ^t, Δθ_i the upload): the
    gradient signal of ½‖h(v_i; φ) − θ̃_i‖², equal to Δθ_i at φ = φ^t."""
    return {n: generated[n] - (generated_at_upload[n] - delta[n]) for n in generated}


def clip_total_norm(gradients: Tensors, max_norm: float) -> Tensors:
    """``gradients`` scaled by min(1, max_norm / (‖g‖ + 1e-6)), ‖g‖ over all of them
    (torch.nn.utils.clip_grad_norm_'s rule)."""
    total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in gradients.values()]))
    scale = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    return {n: g * scale for n, g in gradients.items()}


@torch.no_grad()
def sgd_step(
    params: Tensors,
    gradients: Tensors,
    momentum_buffers: Tensors,
    learning_rates: dict[str, float],
    momentum: float,
    weight_decay: float,
) -> None:
    """torch.optim.SGD's step (no dampening, no Nesterov), in place: d = g + wd·p,
    b ← μ·b + d (b starts at 0, so the first b = d), p ← p − lr·b."""
    for name, param in params.items():
        direction = gradients[name] + weight_decay * param if weight_decay else gradients[name]
        buffer = momentum_buffers[name]
        buffer.mul_(momentum).add_(direction)
        param.sub_(learning_rates[name] * buffer)


class PFedHNProgram(ClientProgram["PFedHNHyperparameters"]):
    capabilities = ProgramCapabilities(batch_loop=True)

    def upload(self, state: Tensors, received: Tensors) -> Tensors:
        """Δθ = θ − θ̃: the generated model minus the trained one (the authors' delta)."""
        return {n: (received[n] - state[n]).detach() for n in self.layout.shared}


class PFedHNInnerStepsProgram(PFedHNProgram):
    """``--inner-steps K``: exactly K minibatch steps of the run's local optimizer (epoch after
    shuffled epoch), the paper's local schedule, instead of ``--local-epochs`` epochs."""

    capabilities = ProgramCapabilities()

    def local_update(self, trainer: LocalTrainer) -> LocalResult:
        spec, steps = self.optimizer(), self.hparams.inner_steps
        assert steps is not None
        params = trainer.train_only(frozenset(self.layout.trainable), self.layout.trainable)
        optimizer = trainer.optimizer(spec, params)
        total = torch.zeros((), device=trainer.device)
        trainer.model.train()
        for _, (inputs, targets) in zip(range(steps), trainer.batches()):
            with trainer.autocast():  # --precision bf16: forward and loss, as the batch loop
                loss = F.cross_entropy(trainer.model(inputs), targets)
            trainer.step(optimizer, loss, params, spec.max_grad_norm)
            total += loss.detach()
        result = mean_terms(total, {"task": total}, steps)
        return LocalResult(result.loss, result.loss_terms, steps=steps)


class PFedHNNewClientProgram(PFedHNProgram):
    """A new client (the paper's novel clients): φ frozen, only its embedding v is learned,
    ``--local-epochs`` epochs of the run's optimizer on CE(f(x; h(v; φ))), from the mean embedding
    of the trained clients; the model generated from the final v is uploaded (and tested)."""

    def local_update(self, trainer: LocalTrainer) -> LocalResult:
        received, spec = trainer.job.received, self.optimizer()
        phi = {n[len(PHI) :]: t for n, t in received.items() if n.startswith(PHI)}
        targets = {n: received[n].shape for n in self.layout.shared}
        embedding = received[NEW_EMBEDDING].detach().clone().requires_grad_(True)
        optimizer = trainer.optimizer(spec, {NEW_EMBEDDING: embedding})  # type: ignore[dict-item]
        hidden_layers = self.hparams.hn_hidden_layers
        total, steps = torch.zeros((), device=trainer.device), 0
        trainer.model.train()
        for _ in range(self.local.epochs):
            for inputs, targets_batch in trainer.epoch():
                theta = generate_weights(phi, embedding, targets, hidden_layers)
                loss = F.cross_entropy(trainer.forward(theta, inputs), targets_batch)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                total += loss.detach()
                steps += 1
        with torch.no_grad():
            theta = generate_weights(phi, embedding, targets, hidden_layers)
        model = {n: t for n, t in received.items() if not n.startswith("pfedhn.")}
        upload = {**{n: t.detach().clone() for n, t in model.items()}, **theta}
        result = mean_terms(total, {"task": total}, steps)
        return LocalResult(result.loss, result.loss_terms, upload=upload, private={}, steps=steps)


@dataclass(frozen=True)
class PFedHNHyperparameters:
    embed_dim: int = option(-1, "Client embedding size; -1: int(1 + K/4), the authors' rule.")
    hn_hidden: int = option(100, "Width of the hypernetwork's hidden layers (the authors' 100).")
    hn_hidden_layers: int = option(3, "Hidden Linear layers after the first (the authors' trainer: 3).")
    hn_lr: float = option(
        3e-3,
        "Server SGD learning rate of the hypernetwork φ (the suite's 3e-3: the authors' 1e-2 assumes one "
        "client per server step and diverges with a round's clients' steps in a row; see the docstring).",
    )
    embed_lr: float | None = option(None, "Server learning rate of the client embeddings [default: --hn-lr].")
    hn_momentum: float = option(0.9, "Server SGD momentum (the authors' 0.9).")
    hn_weight_decay: float = option(1e-3, "Server SGD weight decay (the authors' 1e-3).")
    hn_max_grad_norm: float = option(50.0, "Clip the hypernetwork's gradient to this norm (the authors' 50).")
    hn_server_steps: int = option(
        1,
        "Server SGD steps per client upload (the paper's 1; the paper's 5,000-step budget is rounds × clients "
        "per round uploads).",
    )
    inner_steps: int | None = option(
        None, "Local minibatch steps per round instead of --local-epochs epochs (the authors: 50) [default: epochs]."
    )

    def validate(self) -> None:
        if self.hn_server_steps < 1:
            raise ConfigError(f"--hn-server-steps must be ≥ 1, got {self.hn_server_steps}")
        if self.inner_steps is not None and self.inner_steps < 1:
            raise ConfigError(f"--inner-steps must be ≥ 1, got {self.inner_steps}")
        if self.embed_dim != -1 and self.embed_dim < 1:
            raise ConfigError(f"--embed-dim must be ≥ 1 or -1 (automatic), got {self.embed_dim}")
        if self.hn_hidden < 1 or self.hn_hidden_layers < 0:
            raise ConfigError(
                f"--hn-hidden must be ≥ 1 and --hn-hidden-layers ≥ 0, got {self.hn_hidden}, {self.hn_hidden_layers}"
            )
        for flag, value in (("--hn-lr", self.hn_lr), ("--embed-lr", self.embed_lr)):
            if value is not None and not value > 0:
                raise ConfigError(f"{flag} must be > 0, got {value}")
        if not 0 <= self.hn_momentum < 1 or not self.hn_weight_decay >= 0 or not self.hn_max_grad_norm > 0:
            raise ConfigError(
                f"--hn-momentum must be in [0, 1), --hn-weight-decay ≥ 0 and --hn-max-grad-norm > 0, got "
                f"{self.hn_momentum}, {self.hn_weight_decay}, {self.hn_max_grad_norm}"
            )


@register_algorithm("pfedhn")
class PFedHN(Algorithm[PFedHNHyperparameters]):
    """A server hypernetwork generates each client's model from its learned embedding."""

    display_name = "pFedHN"
    paper = "Shamsian et al., ICML 2021"
    method_family = "hypernetwork"
    hyperparameters = PFedHNHyperparameters
    program_class = PFedHNProgram
    has_global_model = False
    capabilities = Capabilities(averaged_upload=False)
    checkpoint_attributes = ("hypernetwork", "momentum_buffers", "reported")

    @classmethod
    def check_config(cls, config: RunConfig, hparams: Any) -> None:
        if config.executor == "vmap":
            raise ConfigError(
                "pfedhn generates a different model for every client and updates its hypernetwork "
                "from each upload; --executor vmap cannot host it: use --executor sequential or ray"
            )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        hparams, num_clients = self.hparams, len(self.num_train)
        device = next(iter(self.initial_state.values())).device
        self.targets = {n: self.initial_state[n].shape for n in self.layout.shared}
        self.embed_dim = hparams.embed_dim if hparams.embed_dim > 0 else int(1 + num_clients / 4)
        generator = torch.Generator().manual_seed(derive_seed(self.config.seed, "pfedhn.init"))
        initial = init_hypernetwork(
            num_clients, self.embed_dim, hparams.hn_hidden, hparams.hn_hidden_layers, self.targets, generator
        )
        self.hypernetwork = {n: t.to(device) for n, t in initial.items()}
        self.momentum_buffers = {n: torch.zeros_like(t) for n, t in self.hypernetwork.items()}
        embed_lr = hparams.hn_lr if hparams.embed_lr is None else hparams.embed_lr
        self.learning_rates = {n: embed_lr if n == EMBEDDINGS else hparams.hn_lr for n in self.hypernetwork}
        self.reported: list[int] = []  # clients whose embedding has been trained (new clients: their mean)
        self.server_steps = hparams.hn_server_steps

    def make_program(self) -> ClientProgram:
        if self.hparams.inner_steps is None:
            return super().make_program()
        return PFedHNInnerStepsProgram(self.layout, self.hparams, self.config.local_spec)

    def select_shared(self, names: list[str]) -> list[str]:
        trainable = {n for n, p in self.model.named_parameters() if p.requires_grad}
        return [n for n in names if n in trainable]  # generated; float buffers stay with each client

    @torch.no_grad()
    def generate(self, embedding: torch.Tensor) -> Tensors:
        return generate_weights(self.hypernetwork, embedding, self.targets, self.hparams.hn_hidden_layers)

    def broadcast(self, client_id: int) -> Tensors:
        """θ_i = h(v_i; φ) (counted in bytes_down)."""
        return self.generate(self.hypernetwork[EMBEDDINGS][client_id])

    def aggregate(self, updates: list[ClientUpdate]) -> None:
        """``server_steps`` SGD steps per reporting client (client-id order): the first with its
        VJP at φ^t (a copy of φ^t keeps memory at one gradient at a time), the others with the
        regression residual at the current φ."""
        hparams = self.hparams
        at_generation = (
            {n: t.clone() for n, t in self.hypernetwork.items()}
            if len(updates) > 1 or self.server_steps > 1
            else self.hypernetwork
        )
        for update in sorted(updates, key=lambda u: u.client_id):
            generated_at_upload: Tensors = {}
            if self.server_steps > 1:
                embedding = at_generation[EMBEDDINGS][update.client_id]
                with torch.no_grad():
                    generated_at_upload = generate_weights(
                        at_generation, embedding, self.targets, hparams.hn_hidden_layers
                    )
            for step in range(self.server_steps):
                if step == 0:
                    phi, signal = at_generation, update.params
                else:
                    with torch.no_grad():
                        generated = self.generate(self.hypernetwork[EMBEDDINGS][update.client_id])
                    phi, signal = self.hypernetwork, regression_residual(generated, generated_at_upload, update.params)
                gradient = hypernetwork_gradient(phi, update.client_id, signal, self.targets, hparams.hn_hidden_layers)
                sgd_step(
                    self.hypernetwork,
                    clip_total_norm(gradient, hparams.hn_max_grad_norm),
                    self.momentum_buffers,
                    self.learning_rates,
                    hparams.hn_momentum,
                    hparams.hn_weight_decay,
                )
        self.reported = sorted(set(self.reported) | {u.client_id for u in updates})

    def clients_share_one_model(self) -> bool:
        return False  # every client has its own generated model

    def personal_model(self, client_id: int) -> Tensors:
        return self.model_state({**self.broadcast(client_id), **self.store.get(client_id)})

    def new_client_model(self, client_id: int) -> Tensors:
        """The model generated from the mean embedding of the reported clients (the start of the
        new client's embedding), with what its adaptation needs: φ and that embedding."""
        embeddings = self.hypernetwork[EMBEDDINGS]
        embedding = embeddings[self.reported].mean(0) if self.reported else embeddings[client_id]
        model = self.model_state({**self.generate(embedding), **self.store.initial})
        phi = {PHI + n: t for n, t in self.hypernetwork.items() if n != EMBEDDINGS}
        return {**model, **phi, NEW_EMBEDDING: embedding}

    def new_client_program(self) -> ClientProgram:
        return PFedHNNewClientProgram(self.layout, self.hparams, self.config.local_spec)

    def run_info(self) -> dict[str, Any]:
        """The run's server-step budget against the paper's 5,000."""
        total = self.config.rounds * self.config.sampled_per_round * self.server_steps
        return {"pfedhn_server_steps": f"{total} ({self.server_steps} per upload; the paper trains 5000)"}

    def round_diagnostics(self, updates: list[ClientUpdate]) -> dict[str, Any]:
        """The mean norm of the uploads Δθ_i (how far local training moved the generated models)."""
        norms = [math.sqrt(sum(float(t.pow(2).sum()) for t in u.params.values())) for u in updates]
        return {"pfedhn_delta_norm": sum(norms) / len(norms)} if norms else {}
