"""Differential privacy: client-level DP-FedAvg at the server, sample-level DP-SGD on the clients,
and the accountant that turns what was done into ε at a given δ.

**Client level** (``--dp client``; McMahan, Ramage, Talwar, Zhang, "Learning Differentially Private
Recurrent Language Models", ICLR 2018, DP-FedAvg with a fixed-size sample). One client's whole
data is the unit protected. Each sampled client's update Δ_k = upload_k − received is clipped to
norm C (the norm over every uploaded tensor as one vector),

    clip(Δ_k) = Δ_k · min(1, C / ‖Δ_k‖₂),

and the server adds Gaussian noise to the *unweighted* mean of the m updates that reported:

    w ← w + (1/m)·Σ_k clip(Δ_k) + N(0, (z_Δ·C/m)²·I).

The paper leaves the weights open (its estimators weight clients and cap the weights); we use
uniform weights, as Andrew et al. 2021, Flower's DP strategies and TensorFlow Federated do: one
client moves the mean by at most C/m, whatever its number of samples (the sample counts n_k of
FedAvg's rule would have to be private too). With DP the algorithm's FedAvg rule is replaced by
this one, so only algorithms whose upload is a model update averaged by the default rule are
served (``client_level_refusal``); the others are refused at start, never given an ε that is
not true.

**Adaptive clipping** (``--dp-adaptive-quantile γ``; Andrew, Thakkar, McMahan, Ramaswamy,
"Differentially Private Learning with Adaptive Clipping", NeurIPS 2021, Algorithm 1). The clip
norm follows the γ-quantile of the update norms: each client also reports b_k = 1[‖Δ_k‖ ≤ C],
the server forms the noised fraction b̃ = (Σ_k b_k + N(0, σ_b²)) / m and moves the clip
geometrically, C ← C·exp(−η_C·(b̃ − γ)) (η_C ``--dp-clip-lr``, default 0.2 and σ_b
``--dp-count-noise``, default m/20: the paper's recommendations). Two Gaussian mechanisms are
released per round; the paper gives the multiplier z_Δ of the update noise such that
both together cost exactly what one Gaussian mechanism of multiplier z (``--dp-noise``) costs:

    z_Δ = (z⁻² − (2σ_b)⁻²)^(−1/2),    which needs z < 2σ_b.

**Sample level** (``--dp sample``; Abadi et al., "Deep Learning with Differential Privacy", CCS
2016, DP-SGD). One training sample is the unit protected. In the engine's batch loop each step's
gradient is replaced by the sum of the per-sample gradients, each clipped to C, plus
N(0, z²C²·I), divided by the batch's size. Per-sample gradients are ``torch.func.vmap`` of
``torch.func.grad`` over the batch (each sample's loss is the program's ``loss_terms`` on that
sample alone, so regularizers such as FedProx's term are part of every sample's gradient, as in
Opacus), under ``func_grad.autograd_without_dynamo`` (same bits; the first step of a process
no longer imports ``torch._dynamo``: 2.1–2.6 s → 0.6–0.8 s, 784→10 linear model, batch 64, busy
2-core CPU, alternated). The noise is drawn from a generator seeded from the job's seed (``privacy.sgd``):
identical on every executor and after a resume. A model with BatchNorm is refused (its batch
statistics mix samples, so no per-sample gradient exists); so are programs that replace the
batch loop (``local_update``) or upload something other than their model tensors.

**Accountant.** Opacus' RDP accountant (``pip install 'pflbench[dp]'``), the moments accountant
of both papers: ε(q, z, steps, δ) of the sampled Gaussian mechanism. Client level: q = M/K_train
(the sampled clients per round over the training clients; with over-selection M'/K_train, with
an availability trace 1: ``client_sample_rate``), one step per round. Sample level: each client
k has its own ε_k with q_k = B/n_k and its own count of local steps (steps only happen in rounds
where it reports: the steps its batch loop took, ``--local-epochs`` × its batches per epoch
summed over the phases unless a deadline cut them short); a round reports the largest ε_k (the
worst-off client). Both follow the usual practice of accounting a fixed-size (or shuffled)
sample as Poisson sampling at rate q, as Opacus and the papers do. σ = 0 releases the updates
without noise: ε = ∞ (``null`` in JSON).

What is **not** privatized (diagnostics of the experiment, not a model release): the training
losses and accuracies in ``rounds.jsonl``, and ``dp_clipped_frac`` (the true fraction of clipped
client updates, to choose C).

**Randomness and resume.** The server's noise of round t comes from a generator seeded with
``derive_seed(seed, "privacy.noise", t)`` (and ``privacy.count`` for the adaptive count), so a
resumed run draws the same noise; the state that changes across rounds (the adaptive clip, each
client's DP-SGD step count) is saved in the checkpoint (``state`` / ``restore``).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.func import grad, vmap

from pflbench.config.groups import AvailabilitySpec, PrivacySpec
from pflbench.config.settings.privacy import check_adaptive_noise, count_noise_std
from pflbench.engine.availability import over_selected_count
from pflbench.engine.capabilities import refusal
from pflbench.engine.func_grad import autograd_without_dynamo
from pflbench.engine.types import ClientUpdate, Tensors
from pflbench.errors import ConfigError
from pflbench.util.seeding import derive_seed

INSTALL_HINT = "pip install 'pflbench[dp]'"
NOISE_STREAM, COUNT_STREAM, SGD_STREAM = "privacy.noise", "privacy.count", "privacy.sgd"


# ---- pure functions: the math ------------------------------------------------------------
def model_update(upload: Tensors, received: Tensors) -> Tensors:
    """Δ = upload − received for every uploaded tensor."""
    return {name: upload[name] - received[name] for name in upload}


def global_norm(tensors: Tensors) -> torch.Tensor:
    """‖x‖₂ of every tensor of ``tensors`` as one vector (float64, a 0-d tensor)."""
    if not tensors:
        return torch.zeros((), dtype=torch.float64)
    return torch.stack([t.detach().double().pow(2).sum().cpu() for t in tensors.values()]).sum().sqrt()


def clip_update(update: Tensors, clip: float) -> tuple[Tensors, float]:
    """(Δ·min(1, C/‖Δ‖₂), ‖Δ‖₂): the update scaled into the ball of radius C, and its norm before."""
    norm = float(global_norm(update))
    scale = min(1.0, clip / norm) if norm > 0 else 1.0
    return {name: t * scale for name, t in update.items()}, norm


def gaussian_noise_like(tensors: Tensors, std: float, generator: torch.Generator) -> Tensors:
    """N(0, std²) per entry, shaped like ``tensors`` (drawn on the CPU in ``tensors``' order, so
    the draws do not depend on the device)."""
    return {
        name: (torch.randn(t.shape, generator=generator, dtype=torch.float32) * std).to(t.device, t.dtype)
        for name, t in tensors.items()
    }


def noised_mean(
    total: Tensors, count: int, clip: float, noise_multiplier: float, generator: torch.Generator
) -> Tensors:
    """total/m + N(0, (z·C/m)²): the mean of m clipped updates with the Gaussian mechanism's noise
    (one client moves the mean by at most C/m)."""
    noise = gaussian_noise_like(total, noise_multiplier * clip / count, generator)
    return {name: t / count + noise[name] for name, t in total.items()}


def update_noise_multiplier(noise_multiplier: float, count_noise: float) -> float:
    """z_Δ = (z⁻² − (2σ_b)⁻²)^(−1/2) (Andrew et al. 2021): the update's multiplier
    when the clipped-count query with noise σ_b is released too; z = 0 stays 0 (no privacy)."""
    if noise_multiplier == 0:
        return 0.0
    check_adaptive_noise(noise_multiplier, count_noise)  # z < 2σ_b (the privacy group's check)
    return (noise_multiplier**-2 - (2 * count_noise) ** -2) ** -0.5


def adapted_clip(
    clip: float,
    unclipped: int,
    count: int,
    quantile: float,
    learning_rate: float,
    count_std: float,
    generator: torch.Generator,
) -> tuple[float, float]:
    """(C·exp(−η_C·(b̃ − γ)), b̃) with b̃ = (Σ b_k + N(0, σ_b²))/m, the noised fraction of
    updates whose norm was ≤ C (Andrew et al. 2021, Algorithm 1, geometric update)."""
    noise = float(torch.randn((), generator=generator, dtype=torch.float64)) * count_std
    fraction = (unclipped + noise) / count
    return clip * math.exp(-learning_rate * (fraction - quantile)), fraction


def clip_per_sample(gradients: Tensors, clip: float) -> Tensors:
    """Σ_i g_i·min(1, C/‖g_i‖₂) over the leading (sample) dimension of per-sample gradients; the
    norm of sample i is over every tensor as one vector."""
    flat = [g.reshape(g.shape[0], -1) for g in gradients.values()]
    squares = torch.stack([torch.linalg.vector_norm(f, dim=1).pow(2) for f in flat]).sum(0)
    scale = (clip / (squares.sqrt() + 1e-12)).clamp(max=1.0)
    return {name: (scale.to(f.dtype) @ f).reshape(g.shape[1:]) for (name, g), f in zip(gradients.items(), flat)}


def batches_per_epoch(size: int, batch_size: int) -> int:
    """Minibatches of one pass over ``size`` samples (``LocalTrainer.epoch``: a trailing single
    sample joins the previous batch)."""
    count = max(1, -(-size // batch_size))
    return count - 1 if batch_size > 1 and count > 1 and size - (count - 1) * batch_size == 1 else count


def client_sample_rate(sampled_per_round: int, num_training: int, availability: AvailabilitySpec) -> float:
    """q of client-level accounting: the largest chance a client has to be in a round's release.
    M/K_train for the uniform sample; over-selection samples M' = ⌈M·(1 + f)⌉ (those that report
    are among them); an availability trace makes some clients likelier than others, so no
    amplification by sampling is claimed (q = 1). Dropout and deadlines only remove clients."""
    if availability.availability != "always":
        return 1.0
    sampled = over_selected_count(sampled_per_round, availability.over_select, num_training)
    return min(1.0, sampled / num_training)


def epsilon(history: Sequence[tuple[float, float, int]], delta: float) -> float:
    """ε at δ of the composition of sampled Gaussian mechanisms (noise multiplier, sample rate,
    steps), from Opacus' RDP accountant; ∞ for any step without noise, 0 without steps."""
    history = [(z, q, steps) for z, q, steps in history if steps > 0]
    if not history:
        return 0.0
    if any(z == 0 for z, _, _ in history):
        return math.inf
    accountant = opacus_accountant()
    accountant.history = list(history)
    with warnings.catch_warnings():  # "optimal order is the smallest alpha": a loose bound, still a bound
        warnings.simplefilter("ignore")
        return float(accountant.get_epsilon(delta))


def opacus_accountant() -> Any:
    """A fresh ``opacus.accountants.RDPAccountant``; ConfigError naming the extra without opacus."""
    try:
        from opacus.accountants import RDPAccountant
    except ImportError:
        raise ConfigError(f"--dp needs Opacus for its privacy accountant: {INSTALL_HINT}") from None
    return RDPAccountant()


# ---- who can be made private -------------------------------------------------------------
def client_level_refusal(algorithm: type) -> str | None:
    """Why client-level DP cannot serve ``algorithm`` (an ``Algorithm`` class), or None.

    Served: an upload that is a model update averaged by the FedAvg rule, as the class declares
    it (``engine.capabilities``, feature ``averaged-upload``): everyone receives the global state,
    the FedAvg average (which DP's noised mean replaces), a client program whose upload is its
    model tensors trained by the batch loop, diagnostics that read no uploads; or a class that
    vouches for it (``Capabilities(averaged_upload=True)``)."""
    return refusal("averaged-upload", algorithm)


def sample_level_refusal(algorithm: type) -> str | None:
    """Why DP-SGD cannot serve ``algorithm``, or None: its clients must train with the engine's
    batch loop (where the per-sample clipping happens) and upload only their model tensors, as
    its program class declares (``engine.capabilities``, feature ``dp-sample``)."""
    return refusal("dp-sample", algorithm)


def count_noise(spec: PrivacySpec, sampled_per_round: int) -> float:
    """σ_b of adaptive clipping: ``--dp-count-noise``, or the paper's m/20 when it is 0."""
    return count_noise_std(spec.count_noise, sampled_per_round)


# ---- the server side: the private mean and the accountant ---------------------------------
class PrivateMean:
    """Client-level DP's aggregation stream (the ``Algorithm.streaming_aggregate`` interface):
    ``add`` clips each update against ``target`` as it was broadcast; ``finish`` adds the noised
    mean of the clipped updates to ``target``."""

    def __init__(self, target: Tensors, clip: float, noise_multiplier: float, generator: torch.Generator) -> None:
        self.target, self.clip, self.noise_multiplier, self.generator = target, clip, noise_multiplier, generator
        self.received = {name: t.detach().clone() for name, t in target.items()}
        self.total: Tensors = {}
        self.norms: list[float] = []

    def add(self, update: ClientUpdate) -> None:
        if not update.params:
            return
        clipped, norm = clip_update(model_update(update.params, self.received), self.clip)
        self.norms.append(norm)
        for name, value in clipped.items():
            self.total[name] = self.total[name] + value if name in self.total else value

    def finish(self) -> None:
        if self.norms:
            mean = noised_mean(self.total, len(self.norms), self.clip, self.noise_multiplier, self.generator)
            with torch.no_grad():
                for name, value in mean.items():
                    self.target[name].copy_(self.received[name] + value)
        self.total = {}


@dataclass
class SampleLevelDP:
    """What each training job carries under ``--dp sample`` (``ClientJob.sample_privacy``): the
    batch loop replaces each step's gradient with ``private_gradients``
    (``engine.local.standard_local_update``)."""

    clip: float
    noise_multiplier: float

    def generator(self, job_seed: int) -> torch.Generator:
        return torch.Generator().manual_seed(derive_seed(job_seed, SGD_STREAM))

    def private_gradients(
        self,
        loss_of: Callable[[Tensors, torch.Tensor, torch.Tensor], tuple[torch.Tensor, dict[str, torch.Tensor]]],
        params: Tensors,
        inputs: torch.Tensor,
        targets: torch.Tensor,
        generator: torch.Generator,
    ) -> tuple[Tensors, torch.Tensor, dict[str, torch.Tensor]]:
        """(noised mean of the clipped per-sample gradients, mean loss, mean of each term) for
        one batch; ``loss_of(params, x, y)`` is the (loss, terms) of a batch."""

        def one_sample(p: Tensors, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, Any]:
            loss, terms = loss_of(p, x.unsqueeze(0), y.unsqueeze(0))
            return loss, (loss.detach(), {n: t.detach() for n, t in terms.items()})

        detached = {n: p.detach() for n, p in params.items()}
        with autograd_without_dynamo():  # the first call would import torch._dynamo (seconds)
            per_sample, (losses, terms) = vmap(
                grad(one_sample, has_aux=True), in_dims=(None, 0, 0), randomness="different"
            )(detached, inputs, targets)
        summed = clip_per_sample(per_sample, self.clip)
        noise = gaussian_noise_like(summed, self.noise_multiplier * self.clip, generator)
        size = inputs.shape[0]
        gradients = {n: (g + noise[n]) / size for n, g in summed.items()}
        return gradients, losses.mean(), {n: t.mean() for n, t in terms.items()}


class Privacy:
    """The run's privacy: the server's private mean (client level), each client's DP-SGD steps
    (sample level) and ε after each round. ``state``/``restore``: what a checkpoint keeps."""

    def __init__(
        self,
        spec: PrivacySpec,
        seed: int,
        sampled_per_round: int,
        sample_rate: float,
        num_train: Sequence[int],
        batch_size: int,
        local_phases: Callable[[int], list[Any]],
    ) -> None:
        self.spec, self.seed = spec, seed
        self.sample_rate = sample_rate  # q of client-level accounting (client_sample_rate)
        self.count_noise = count_noise(spec, sampled_per_round)
        self.update_multiplier = (
            update_noise_multiplier(spec.noise, self.count_noise) if spec.adaptive_quantile else spec.noise
        )
        self.num_train, self.batch_size, self.local_phases = list(num_train), batch_size, local_phases
        self.clip = spec.clip  # the clip norm of the next round (adaptive clipping moves it)
        self.steps: dict[int, int] = {}  # sample level: each client's DP-SGD steps so far
        self.stream: PrivateMean | None = None

    @property
    def client_level(self) -> bool:
        return self.spec.mode == "client"

    def program_privacy(self) -> SampleLevelDP | None:
        return SampleLevelDP(self.spec.clip, self.spec.noise) if self.spec.mode == "sample" else None

    def aggregation(self, target: Tensors, round_index: int) -> PrivateMean:
        """This round's private mean into ``target`` (client level)."""
        generator = torch.Generator().manual_seed(derive_seed(self.seed, NOISE_STREAM, round_index))
        self.stream = PrivateMean(target, self.clip, self.update_multiplier, generator)
        return self.stream

    def end_round(self, round_index: int, updates: Sequence[ClientUpdate]) -> dict[str, Any]:
        """Account round ``round_index`` (the updates that reported), adapt the clip; the round's
        ``dp_*`` entries for rounds.jsonl."""
        record: dict[str, Any] = {}
        if self.client_level:
            norms = self.stream.norms if self.stream is not None else []
            record["dp_clip"] = self.clip
            record["dp_clipped_frac"] = sum(n > self.clip for n in norms) / len(norms) if norms else None
            if self.spec.adaptive_quantile and norms:
                generator = torch.Generator().manual_seed(derive_seed(self.seed, COUNT_STREAM, round_index))
                unclipped = sum(n <= self.clip for n in norms)
                self.clip, record["dp_unclipped_noised"] = adapted_clip(
                    self.clip,
                    unclipped,
                    len(norms),
                    self.spec.adaptive_quantile,
                    self.spec.clip_lr,
                    self.count_noise,
                    generator,
                )
            self.stream = None
            record["dp_epsilon"] = epsilon([(self.spec.noise, self.sample_rate, round_index)], self.spec.delta)
        else:
            for update in updates:  # the steps the batch loop counted (partial work), else the planned ones
                k, steps = update.client_id, update.local_steps
                if steps is None:
                    per_epoch = batches_per_epoch(self.num_train[k], self.batch_size)
                    steps = sum(phase.epochs * per_epoch for phase in self.local_phases(k))
                self.steps[k] = self.steps.get(k, 0) + steps
            record["dp_epsilon"] = self.sample_epsilon()
        return record

    def sample_epsilon(self) -> float:
        """max_k ε_k over the clients that took DP-SGD steps (clients sharing (q, steps) share ε)."""
        found: dict[tuple[float, int], float] = {}
        for k, steps in self.steps.items():
            rate = min(1.0, self.batch_size / self.num_train[k])
            if (rate, steps) not in found:
                found[rate, steps] = epsilon([(self.spec.noise, rate, steps)], self.spec.delta)
        return max(found.values(), default=0.0)

    def state(self) -> dict[str, Any]:
        return {"clip": self.clip, "steps": {str(k): v for k, v in self.steps.items()}}

    def restore(self, state: dict[str, Any]) -> None:
        self.clip = float(state["clip"])
        self.steps = {int(k): int(v) for k, v in state["steps"].items()}
