"""pFedFDA — Mclaughlin et al., "Personalized Federated Learning via Feature Distribution
Adaptation", NeurIPS 2024 (OpenReview Wl2optQcng).

The model is a feature extractor z = φ(x) (the body, shared and FedAvg-averaged) followed by a
*generative* linear classifier: class-conditional Gaussians p(z | y = c) = N(μ_c, Σ) with one
covariance Σ shared by the classes and the client's label priors π_c. Bayes' rule gives linear
logits (linear discriminant analysis, ``lda_head``):

    Σ̃ = (1 − ε)·Σ + ε·(tr Σ / D)·I                         (shrinkage, the authors' ε = 1e-4)
    w_c = Σ̃⁻¹·μ_c,   b_c = −½·μ_cᵀ·Σ̃⁻¹·μ_c + log π_c,   logits_c(z) = w_cᵀ·z + b_c

Round t, client k (n_k train samples, label priors π_k = normalise(n_{k,c}/n_k + ε)):

1. head ← LDA(μ_g, Σ_g, π_k) from the received global statistics; the head is frozen and the
   body trained on cross-entropy for ``--local-epochs`` epochs with the run's optimizer.
2. Local maximum-likelihood estimates on the features z of the batches it trained on
   (``gaussian_mle``; see "Which features" below):
   μ̂_{k,c} = mean of class c's features (the global μ_{g,c} where the class has ≤ 2 samples, as
   the authors), Σ̂_k = (1/(n_k − 1))·Σ_i (z_i − μ̂_{k,y_i})(z_i − μ̂_{k,y_i})ᵀ + ε·I.
3. Interpolation (the paper's adaptation of the global distribution to the client):
       μ_k = β_μ·μ̂_k + (1 − β_μ)·μ_g,     Σ_k = β_Σ·Σ̂_k + (1 − β_Σ)·Σ_g,
   with (β_μ, β_Σ) ∈ [0, 1]² minimising the ``--cv-folds``-fold cross-validated cross-entropy of
   the LDA classifier on the client's own features (``cross_validated_beta``): on each fold the
   local estimates come from the other folds, the loss from the held-out fold, summed over folds.
4. Upload the body and (μ_k, Σ_k); the server averages all of them by sample count:
       φ ← Σ_k (n_k/n)·φ_k,   μ_g ← Σ_k (n_k/n)·μ_k,   Σ_g ← Σ_k (n_k/n)·Σ_k
   — the FedAvg rule, so the default aggregation does it (the authors' ``aggregate_models``).

Evaluation (pers_acc), as the authors' ``evaluate_personalized``: each client takes the current
global body and statistics, re-estimates (μ̂_k, Σ̂_k) and (β_μ, β_Σ) on its train split, and is
tested with LDA(μ_k, Σ_k, π_k) (``personalization_program``, through the executor; it trains
nothing). global_acc: LDA(μ_g, Σ_g, uniform priors), the authors' "global" number.
New clients (``--new-clients``): the same adaptation — the paper's point is exactly that a client
adapts the global feature distribution to its data with no gradient training.

Defaults and their sources:
- ε = 1e-4 (``--eps``; the authors' ``self.eps``, used for the shrinkage, the priors and the
  covariance jitter); ``--cv-folds`` 2 (the authors' ``num_cv_folds``); two interpolation
  coefficients β_μ, β_Σ (``--beta-mode cv``; the authors' default, ``--single_beta`` off);
  ``--beta-mode single`` is the authors' ``--single_beta`` (β_μ = β_Σ), ``--beta-mode local`` their
  ``--local_beta`` ablation (β = 1: local statistics only).
- Initial global statistics: μ_g ~ U[0, 1)^{C×D}, Σ_g = I (the authors' server), drawn from the
  run's seed (stream ``pfedfda.means``), so round 1 trains the body against a random LDA head.
- ``pflbench tune``: the default space (the local lr); β is fitted by the method itself.

Departures from the authors' code (cj-mclaughlin/pFedFDA), each for a stated reason:
- β search: the authors run 10 iterations of L-BFGS (pytorch-minimize) from β = 0.5, clipping to
  [0, 1]. We evaluate the same cross-validated loss on a grid of ``--beta-grid`` points per
  coefficient (default 11: 0, 0.1, …, 1) and take the minimum: no extra dependency, exact to
  the grid step, deterministic, and it cannot stop in a flat region of the clipped loss.
- Which features: as the authors, the statistics a client uploads are fitted on the features of
  every batch of its local training (train mode, all epochs, a moving body: the features the
  next round trains against, BatchNorm in train mode); at evaluation, one eval-mode pass over
  the train split with the global body (their ``compute_feats``).
- Σ̂_k: the code we read adds ε to every entry *and* the identity (``scatter/(n−1) + eps +
  eye``) and then projects onto the PSD cone (statsmodels ``cov_nearest``). We add ε·I, the
  paper's sample covariance made positive definite; the projection is then a no-op.
- Folds: a stratified split drawn from the job's seed (stream ``pfedfda.folds``; the authors:
  scikit-learn's StratifiedKFold, seed 0); classes with fewer samples than folds are left out of
  the β search (as the authors prune them); with no class left, β = 0 (the authors' fallback).
- The LDA solve runs in float64 (the authors: float32 ``lstsq``); the result is cast to the model's
  dtype.

What travels: down, the body and (μ_g, Σ_g) (C·D + D² numbers); up, the body and (μ_k, Σ_k). The
final layer's weights are never uploaded (they are recomputed from statistics), nor stored.
Refused: ``--head-layers`` other than 1 (the Gaussians live on the final layer's input), a model
whose final layer is not ``nn.Linear``, ``--executor vmap`` (custom local update), ``--dp``,
``--attack`` model poisoning and ``--robust-agg`` (the upload holds second-moment statistics and
the local update is its own code: the engine's predicate refuses them).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from pflbench import (
    Algorithm,
    Capabilities,
    ClientProgram,
    ConfigError,
    LocalPhase,
    LocalResult,
    ParamLayout,
    ProgramCapabilities,
    RunConfig,
    Tensors,
    option,
    register_algorithm,
    standard_local_update,
)
from pflbench.algorithms.fedproto import rebuilt_linear
from pflbench.models.zoo import final_linear_layer, head_module_names
from pflbench.util.seeding import derive_seed

MIN_CLASS_SAMPLES = 2  # a class needs more samples than this for its own mean (the authors' min_samples)


# ---- the math ----------------------------------------------------------------------------
def lda_head(
    means: torch.Tensor, covariance: torch.Tensor, priors: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(W [C × D], b [C]) of the Gaussian classifier: Σ̃ = (1 − ε)Σ + ε·tr(Σ)/D·I,
    w_c = Σ̃⁻¹μ_c, b_c = −½·μ_cᵀΣ̃⁻¹μ_c + log π_c (float64)."""
    means, covariance = means.double(), covariance.double()
    dim = covariance.shape[0]
    eye = torch.eye(dim, dtype=torch.float64, device=covariance.device)
    shrunk = (1 - eps) * covariance + eps * torch.trace(covariance) / dim * eye
    coefs = torch.linalg.solve(shrunk, means.t()).t()
    intercepts = -0.5 * (means * coefs).sum(dim=1) + torch.log(priors.double())
    return coefs, intercepts


def label_priors(counts: torch.Tensor, eps: float) -> torch.Tensor:
    """π_c ∝ n_c/n + ε (the authors' smoothing: no class has prior 0)."""
    smoothed = counts.double() / counts.sum() + eps
    return smoothed / smoothed.sum()


def gaussian_mle(
    features: torch.Tensor, labels: torch.Tensor, fallback_means: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(μ̂ [C × D], Σ̂ [D × D]): per-class means (``fallback_means``' row for a class with ≤ 2
    samples) and the pooled within-class covariance Σ_i (z_i − μ̂_{y_i})(…)ᵀ/(n − 1) + ε·I."""
    features = features.double()
    num_classes = fallback_means.shape[0]
    one_hot = F.one_hot(labels, num_classes).double()
    counts = one_hot.sum(dim=0)
    own = (one_hot.t() @ features) / counts.clamp(min=1).unsqueeze(1)
    means = torch.where((counts > MIN_CLASS_SAMPLES).unsqueeze(1), own, fallback_means.double())
    centred = features - means[labels]
    dim = features.shape[1]
    eye = torch.eye(dim, dtype=torch.float64, device=features.device)
    covariance = centred.t() @ centred / max(len(labels) - 1, 1) + eps * eye
    return means, covariance


def interpolate(local: torch.Tensor, global_: torch.Tensor, beta: float) -> torch.Tensor:
    """β·local + (1 − β)·global."""
    return beta * local + (1 - beta) * global_


def stratified_folds(labels: torch.Tensor, folds: int, generator: torch.Generator) -> torch.Tensor:
    """Each sample's fold (−1: left out): within each class holding ≥ ``folds`` samples, a
    random order (``generator``) dealt round-robin to the folds."""
    assignment = torch.full((len(labels),), -1, dtype=torch.long)
    cpu_labels = labels.cpu()
    for label in torch.unique(cpu_labels).tolist():
        members = torch.nonzero(cpu_labels == label).flatten()
        if len(members) >= folds:
            order = members[torch.randperm(len(members), generator=generator)]
            assignment[order] = torch.arange(len(order)) % folds
    return assignment.to(labels.device)


def beta_grid_losses(
    features: torch.Tensor,
    labels: torch.Tensor,
    assignment: torch.Tensor,
    global_means: torch.Tensor,
    global_covariance: torch.Tensor,
    priors: torch.Tensor,
    grid: torch.Tensor,
    eps: float,
) -> torch.Tensor:
    """L[i, j]: Σ over folds of the held-out fold's mean cross-entropy of the LDA classifier with
    μ = interpolate(μ̂, μ_g, grid[i]), Σ = interpolate(Σ̂, Σ_g, grid[j]), where (μ̂, Σ̂) are
    ``gaussian_mle`` of the other folds."""
    losses = torch.zeros(len(grid), len(grid), dtype=torch.float64, device=features.device)
    features = features.double()
    for fold in range(int(assignment.max()) + 1):
        train, test = (assignment >= 0) & (assignment != fold), assignment == fold
        means, covariance = gaussian_mle(features[train], labels[train], global_means, eps)
        for j, beta_cov in enumerate(grid.tolist()):
            shared = interpolate(covariance, global_covariance.double(), beta_cov)
            for i, beta_mean in enumerate(grid.tolist()):
                coefs, intercepts = lda_head(interpolate(means, global_means.double(), beta_mean), shared, priors, eps)
                logits = features[test] @ coefs.t() + intercepts
                losses[i, j] += F.cross_entropy(logits, labels[test])
    return losses


def cross_validated_beta(
    features: torch.Tensor,
    labels: torch.Tensor,
    global_means: torch.Tensor,
    global_covariance: torch.Tensor,
    priors: torch.Tensor,
    mode: str,
    points: int,
    folds: int,
    eps: float,
    generator: torch.Generator,
) -> tuple[float, float]:
    """(β_μ, β_Σ): ``local`` (1, 1); else the grid point of least cross-validated loss
    (``single``: on the diagonal β_μ = β_Σ); (0, 0) when no class has enough samples for a split."""
    if mode == "local":
        return 1.0, 1.0
    assignment = stratified_folds(labels, folds, generator)
    if int((assignment >= 0).sum()) == 0:
        return 0.0, 0.0
    grid = torch.linspace(0, 1, points, dtype=torch.float64)
    losses = beta_grid_losses(features, labels, assignment, global_means, global_covariance, priors, grid, eps)
    if mode == "single":
        best = int(torch.argmin(torch.diagonal(losses)))
        return float(grid[best]), float(grid[best])
    flat = int(torch.argmin(losses.flatten()))
    return float(grid[flat // points]), float(grid[flat % points])


# ---- the model ---------------------------------------------------------------------------
class GaussianHead(nn.Linear):
    """The final classifier (same parameter names as the ``nn.Linear`` it replaces) holding the
    global Gaussian statistics μ_g (``means``, C × D) and Σ_g (``covariance``, D × D) as buffers;
    its weights are the LDA classifier of some statistics, set before each use."""

    def __init__(
        self, in_features: int, out_features: int, bias: bool = True, device: Any = None, dtype: Any = None
    ) -> None:
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self.register_buffer("means", torch.zeros(out_features, in_features, device=device, dtype=dtype))
        self.register_buffer("covariance", torch.eye(in_features, device=device, dtype=dtype))


# ---- client ------------------------------------------------------------------------------
@dataclass(frozen=True)
class PFedFDAHyperparameters:
    beta_mode: str = option(
        "cv",
        "Interpolation of local and global statistics: cv (β_μ, β_Σ cross-validated, the authors' default), "
        "single (one cross-validated β, their --single_beta) or local (β = 1, their --local_beta).",
        choices=("cv", "single", "local"),
    )
    beta_grid: int = option(11, "Grid points per β in [0, 1] searched by cross-validation (11: steps of 0.1).")
    cv_folds: int = option(2, "Cross-validation folds of the β search (the authors' 2).")
    eps: float = option(1e-4, "ε: covariance shrinkage, prior smoothing and jitter (the authors' 1e-4).")

    def validate(self) -> None:
        if self.beta_grid < 2:
            raise ConfigError(f"--beta-grid must be ≥ 2, got {self.beta_grid}")
        if self.cv_folds < 2:
            raise ConfigError(f"--cv-folds must be ≥ 2, got {self.cv_folds}")
        if not 0 <= self.eps < 1:
            raise ConfigError(f"--eps must be in [0, 1), got {self.eps}")


class PFedFDAProgram(ClientProgram[PFedFDAHyperparameters]):
    capabilities = ProgramCapabilities(model_upload=True)
    head_module: str = ""  # the final linear layer (make_program)
    seen: list[torch.Tensor] | None = None  # per-job copy: the labels of the batches trained on

    def names(self) -> tuple[str, str, str, str]:
        h = self.head_module
        return f"{h}.weight", f"{h}.bias", f"{h}.means", f"{h}.covariance"

    def local_phases(self, client_id: int) -> list[LocalPhase]:
        """The body only: the head is the (frozen) LDA classifier of the global statistics."""
        weight, bias = self.names()[:2]
        return [LocalPhase(self.local.epochs, frozenset(n for n in self.layout.trainable if n not in (weight, bias)))]

    def priors(self, trainer) -> torch.Tensor:
        data, client = trainer.data, trainer.job.client_id
        counts = torch.bincount(data.labels[data.train_indices[client]], minlength=data.num_classes)
        return label_priors(counts, self.hparams.eps)

    def set_head(self, trainer, means: torch.Tensor, covariance: torch.Tensor, priors: torch.Tensor) -> None:
        weight, bias = self.names()[:2]
        coefs, intercepts = lda_head(means, covariance, priors, self.hparams.eps)
        dtype = trainer.state[weight].dtype
        trainer.load({weight: coefs.to(dtype), bias: intercepts.to(dtype)})

    @torch.no_grad()
    def features(self, trainer) -> tuple[torch.Tensor, torch.Tensor]:
        """The head's input z for the whole train split (eval mode, in index order), and labels."""
        data, client = trainer.data, trainer.job.client_id
        captured: list[torch.Tensor] = []
        head = trainer.model.get_submodule(self.head_module)
        handle = head.register_forward_pre_hook(lambda module, args: captured.append(args[0].float()))
        trainer.model.eval()
        try:
            for batch in data.train_indices[client].split(max(trainer.batch_size, 1)):
                inputs, _ = data.gather(batch)
                with trainer.autocast():
                    trainer.model(inputs)
        finally:
            handle.remove()
            trainer.model.train()
        return torch.cat(captured), data.labels[data.train_indices[client]]

    def adapted_statistics(
        self, trainer, priors: torch.Tensor, seen: tuple[torch.Tensor, torch.Tensor] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(μ_k, Σ_k): the local estimates from the features ``seen`` (default: one eval-mode pass
        over the train split) interpolated with the received global ones by the cross-validated
        β (steps 2–3)."""
        _, _, means_name, covariance_name = self.names()
        global_means = trainer.job.received[means_name].double()
        global_covariance = trainer.job.received[covariance_name].double()
        features, labels = self.features(trainer) if seen is None else seen
        generator = torch.Generator().manual_seed(derive_seed(trainer.job.seed, "pfedfda.folds"))
        hp = self.hparams
        beta_mean, beta_cov = cross_validated_beta(
            features,
            labels,
            global_means,
            global_covariance,
            priors,
            hp.beta_mode,
            hp.beta_grid,
            hp.cv_folds,
            hp.eps,
            generator,
        )
        means, covariance = gaussian_mle(features, labels, global_means, hp.eps)
        return interpolate(means, global_means, beta_mean), interpolate(covariance, global_covariance, beta_cov)

    def loss_terms(self, forward, params, inputs, targets, received):
        if self.seen is not None:  # the per-job copy of local_update records the batch's labels
            self.seen.append(targets)
        return super().loss_terms(forward, params, inputs, targets, received)

    def local_update(self, trainer) -> LocalResult:
        """LDA head of the global statistics, body epochs (recording the head's input z and the
        labels of every batch, as the authors fit the statistics), then the adapted statistics."""
        _, _, means_name, covariance_name = self.names()
        received = trainer.job.received
        priors = self.priors(trainer)
        self.set_head(trainer, received[means_name], received[covariance_name], priors)
        job_program = copy.copy(self)
        job_program.seen, features = [], []
        head = trainer.model.get_submodule(self.head_module)
        handle = head.register_forward_pre_hook(lambda module, args: features.append(args[0].detach().float()))
        try:
            result = standard_local_update(job_program, trainer)
        finally:
            handle.remove()
        means, covariance = self.adapted_statistics(trainer, priors, (torch.cat(features), torch.cat(job_program.seen)))
        state = trainer.state
        upload = {n: state[n].detach().clone() for n in self.layout.shared if n not in (means_name, covariance_name)}
        upload[means_name] = means.to(state[means_name].dtype)
        upload[covariance_name] = covariance.to(state[covariance_name].dtype)
        result.upload, result.private = upload, {}
        return result


class PFedFDAAdaptProgram(PFedFDAProgram):
    """Evaluation and new clients: the received body and global statistics adapted to the
    client's train split (steps 2–3, no training); uploads the model with LDA(μ_k, Σ_k, π_k)."""

    def __init__(self, layout: ParamLayout, hparams: PFedFDAHyperparameters, local, head_module: str) -> None:
        super().__init__(ParamLayout(trainable=layout.trainable, shared=(), private=()), hparams, local)
        self.head_module = head_module

    def local_update(self, trainer) -> LocalResult:
        priors = self.priors(trainer)
        means, covariance = self.adapted_statistics(trainer, priors)
        self.set_head(trainer, means, covariance, priors)
        upload = {n: trainer.state[n].detach().clone() for n in trainer.job.received}
        return LocalResult(0.0, {}, upload=upload, private={})


# ---- server ------------------------------------------------------------------------------
@register_algorithm("pfedfda")
class PFedFDA(Algorithm[PFedFDAHyperparameters]):
    """Shared body + Gaussian class statistics; each client's LDA head from the global statistics
    interpolated with its own by a cross-validated β."""

    capabilities = Capabilities.of_defaults()

    display_name = "pFedFDA"
    paper = "Mclaughlin et al., NeurIPS 2024"
    method_family = "representation"
    hyperparameters = PFedFDAHyperparameters
    program_class = PFedFDAProgram

    @classmethod
    def check_config(cls, config: RunConfig, hparams: Any) -> None:
        if config.head_layers != 1:
            raise ConfigError(
                f"pfedfda's Gaussians live on the final layer's input; --head-layers {config.head_layers} "
                "would be ignored (leave it at 1)"
            )

    @classmethod
    def inert_hyperparameters(cls, config: RunConfig, hparams: Any) -> dict[str, str]:
        if hparams.beta_mode == "local":
            why = "--beta-mode local uses the local statistics only (no cross-validation)"
            return {"beta_grid": why, "cv_folds": why}
        return {}

    @classmethod
    def configure_model(cls, model: nn.Module, config: RunConfig, hparams: Any) -> dict[str, Any]:
        """The final ``nn.Linear`` becomes a ``GaussianHead`` holding μ_g ~ U[0, 1) and Σ_g = I."""
        record = super().configure_model(model, config, hparams)
        name, head = final_linear_layer(model, "pfedfda")
        if head.bias is None:
            raise ConfigError(
                f"pfedfda needs a bias in the final layer {name!r} (the LDA intercepts log π_c − ½μ_cᵀΣ⁻¹μ_c)"
            )
        replacement = rebuilt_linear(GaussianHead, head)
        generator = torch.Generator().manual_seed(derive_seed(config.seed, "pfedfda.means"))
        with torch.no_grad():
            replacement.weight.copy_(head.weight)
            if head.bias is not None:
                replacement.bias.copy_(head.bias)
            replacement.means.copy_(torch.rand(replacement.means.shape, generator=generator))
            replacement.covariance.copy_(torch.eye(head.in_features))
        replacement.train(head.training)
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, child, replacement)
        return {**record, "gaussian_head": f"{name} (features: its input, D = {head.in_features})"}

    def __init__(self, config: RunConfig, hparams: Any, model: nn.Module, num_train: list[int]) -> None:
        self.head_module = head_module_names(model, 1)[0]
        super().__init__(config, hparams, model, num_train)

    def select_shared(self, names: list[str]) -> list[str]:
        """The body and the global statistics; the LDA weights are recomputed, never sent."""
        return [n for n in names if n not in (f"{self.head_module}.weight", f"{self.head_module}.bias")]

    def make_program(self) -> ClientProgram:
        program = super().make_program()
        program.head_module = self.head_module  # type: ignore[attr-defined]
        return program

    def global_model(self) -> Tensors:
        """The body with LDA(μ_g, Σ_g, uniform priors) (the authors' global evaluation)."""
        state = dict(super().global_model())
        h = self.head_module
        classes = state[f"{h}.means"].shape[0]
        priors = torch.full((classes,), 1.0 / classes, dtype=torch.float64, device=state[f"{h}.means"].device)
        coefs, intercepts = lda_head(state[f"{h}.means"], state[f"{h}.covariance"], priors, self.hparams.eps)
        state[f"{h}.weight"] = coefs.to(state[f"{h}.weight"].dtype)
        state[f"{h}.bias"] = intercepts.to(state[f"{h}.bias"].dtype)
        return state

    def personalization_program(self) -> ClientProgram | None:
        return PFedFDAAdaptProgram(self.layout, self.hparams, self.config.local_spec, self.head_module)

    def new_client_program(self) -> ClientProgram | None:
        return self.personalization_program()
