"""Differential privacy (``engine.privacy``): DP-FedAvg on the client updates or DP-SGD on the
clients, the clip norm, the noise, the δ of the reported ε and adaptive clipping; and what the
algorithm, the clients sampled per round and the built upload must allow for a true ε
(``PrivacySettings.check_run``)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from pflbench.config.settings.base import RunFacts, RunReads, SettingGroup, check_choice, option, refuse_first
from pflbench.errors import ConfigError

DP_MODES = ("off", "client", "sample")  # --dp (engine.privacy)
PAPER_COUNT_NOISE_DIVISOR = 20  # Andrew et al. 2021 recommend σ_b = m/20


def count_noise_std(count_noise: float, sampled_per_round: int) -> float:
    """σ_b of adaptive clipping: ``--dp-count-noise``, or the paper's m/20 when it is 0."""
    return count_noise or sampled_per_round / PAPER_COUNT_NOISE_DIVISOR


def check_adaptive_noise(noise_multiplier: float, count_noise: float) -> None:
    """Adaptive clipping releases the clipped count too, so the update keeps
    z_Δ = (z⁻² − (2σ_b)⁻²)^(−1/2), which needs z < 2σ_b (z = 0: no privacy, nothing to check)."""
    if noise_multiplier != 0 and not noise_multiplier < 2 * count_noise:
        raise ConfigError(
            f"--dp-noise {noise_multiplier:g} with adaptive clipping needs --dp-count-noise > "
            f"{noise_multiplier / 2:g} (z < 2σ_b, Andrew et al. 2021; 0 = m/20), got σ_b = {count_noise:g}"
        )


@dataclass(frozen=True)
class PrivacySettings(SettingGroup):
    title = "Differential privacy"
    omitted_at_default = ("dp",)

    dp: str = option(
        "off",
        "Differential privacy (engine.privacy): client = DP-FedAvg (each client's model update "
        "clipped to --dp-clip, Gaussian noise on the server's mean; McMahan et al. 2018); sample = "
        "DP-SGD on the clients (per-sample gradients clipped to --dp-clip, noised; Abadi et al. "
        "2016). ε at --dp-delta per round and in the summary (pip install 'pflbench[dp]'). off = none.",
        choices=DP_MODES,
    )
    dp_clip: float = option(1.0, "Clip norm C of --dp: of each client update (client) or per-sample gradient (sample).")
    dp_noise: float = option(
        1.0, "Noise multiplier z of --dp: Gaussian noise of std z·C (on the sum; client: z·C/m on the mean of m)."
    )
    dp_delta: float = option(1e-5, "δ at which --dp reports ε (dp_epsilon).")
    dp_adaptive_quantile: float = option(
        0.0,
        "--dp client adaptive clipping (Andrew et al. 2021): the clip norm follows this quantile γ "
        "of the update norms, starting at --dp-clip. 0 = fixed clipping.",
    )
    dp_clip_lr: float = option(0.2, "Learning rate η_C of --dp-adaptive-quantile's geometric clip update.")
    dp_count_noise: float = option(
        0.0, "Noise σ_b of --dp-adaptive-quantile's clipped count; 0 = m/20 (the paper's choice)."
    )

    def spec(self) -> PrivacySpec | None:
        """What the engine reads; None while --dp is off."""
        if self.dp == "off":
            return None
        return PrivacySpec(
            mode=self.dp,
            clip=self.dp_clip,
            noise=self.dp_noise,
            delta=self.dp_delta,
            adaptive_quantile=self.dp_adaptive_quantile,
            clip_lr=self.dp_clip_lr,
            count_noise=self.dp_count_noise,
        )

    def validate(self, config: Any) -> None:
        check_choice("dp", self.dp, DP_MODES)
        if self.dp == "off":
            return
        q = self.dp_adaptive_quantile
        refuse_first(
            [
                (
                    math.isfinite(self.dp_clip) and self.dp_clip > 0,
                    f"--dp-clip must be a finite number > 0, got {self.dp_clip}",
                ),
                (
                    math.isfinite(self.dp_noise) and self.dp_noise >= 0,
                    f"--dp-noise must be a finite number ≥ 0, got {self.dp_noise}",
                ),
                (0 < self.dp_delta < 1, f"--dp-delta must be in (0, 1), got {self.dp_delta}"),
                (
                    math.isfinite(q) and 0 <= q < 1,
                    f"--dp-adaptive-quantile must be in [0, 1) (0 = fixed clipping), got {q}",
                ),
                (
                    q == 0 or self.dp == "client",
                    "--dp-adaptive-quantile adapts the clip of client updates: use it with --dp client",
                ),
                (
                    math.isfinite(self.dp_clip_lr) and self.dp_clip_lr > 0,
                    f"--dp-clip-lr must be a finite number > 0, got {self.dp_clip_lr}",
                ),
                (
                    math.isfinite(self.dp_count_noise) and self.dp_count_noise >= 0,
                    f"--dp-count-noise must be ≥ 0 (0 = m/20), got {self.dp_count_noise}",
                ),
            ]
        )

    def check_run(self, config: Any, run: RunFacts) -> None:
        """A true ε or a refusal: client-level DP replaces the FedAvg average of model updates,
        DP-SGD clips in the engine's batch loop (the algorithm's capabilities; sequential or Ray
        only); adaptive clipping needs z < 2σ_b (σ_b: m/20 by default, M known); the built
        algorithm must upload something, no running statistics under client-level noise (a
        variance could turn negative) and no BatchNorm under DP-SGD (no per-sample gradients)."""
        if self.dp == "off":
            return
        if run.algorithm is not None:
            feature = "averaged-upload" if self.dp == "client" else "dp-sample"
            refusal = run.algorithm.refusals[feature]
            if refusal is not None:
                raise ConfigError(f"--dp {self.dp} cannot make --algo {config.algo} private: {refusal}")
            if self.dp == "sample" and config.executor == "vmap":
                raise ConfigError(
                    "--dp sample clips per-sample gradients in the sequential batch loop; "
                    "use --executor sequential or ray"
                )
        if run.clients is not None and self.dp_adaptive_quantile:
            check_adaptive_noise(self.dp_noise, count_noise_std(self.dp_count_noise, run.clients.sampled_per_round))
        upload = run.upload
        if upload is None:
            return
        if not upload.uploads:
            raise ConfigError(f"--dp: --algo {config.algo} uploads nothing, so there is nothing to make private")
        if self.dp == "client" and upload.buffers:
            raise ConfigError(
                f"--dp client cannot noise the running statistics --algo {config.algo} uploads "
                f"({upload.buffers[0]}); use a model without BatchNorm, or fedbn (it keeps them private)"
            )
        if self.dp == "sample" and upload.batch_norms:
            raise ConfigError(
                f"--dp sample cannot clip per-sample gradients through BatchNorm ({upload.batch_norms[0]}); "
                "use a model without it (e.g. --model cnn)"
            )

    def identity(self, run: RunReads) -> dict[str, Any]:
        """None without --dp (runs made before it keep their folders); the adaptive clipping's
        settings only with --dp-adaptive-quantile."""
        if self.dp == "off":
            return {}
        read: dict[str, Any] = {"dp": self.dp, "dp_clip": self.dp_clip, "dp_noise": self.dp_noise}
        read["dp_delta"] = self.dp_delta  # the ε reported is part of the run's results
        if self.dp_adaptive_quantile:
            read.update(
                dp_adaptive_quantile=self.dp_adaptive_quantile,
                dp_clip_lr=self.dp_clip_lr,
                dp_count_noise=self.dp_count_noise,
            )
        return read

    def inert(self, run: RunReads) -> dict[str, str]:
        read = self.identity(run)
        off = "no --dp (client or sample) is set"
        adaptive_off = "adaptive clipping is off (give --dp-adaptive-quantile with --dp client)"
        client_only = "adaptive clipping adapts client updates (--dp client)"
        reasons = {
            "dp_clip": off,
            "dp_noise": off,
            "dp_delta": off,
            "dp_adaptive_quantile": off if self.dp == "off" else client_only,
            "dp_clip_lr": adaptive_off,
            "dp_count_noise": adaptive_off,
        }
        if self.dp == "client":
            del reasons["dp_adaptive_quantile"]  # read at 0 too: fixed clipping
        return {name: why for name, why in reasons.items() if name not in read}


@dataclass(frozen=True)
class PrivacySpec:
    """What ``engine.privacy`` reads: ``mode`` client (DP-FedAvg) or sample (DP-SGD), the clip
    norm C, the noise multiplier z, δ of the reported ε and adaptive clipping's target quantile
    γ (0: fixed clip), its learning rate η_C and count noise σ_b (0: m/20). Defaults: those of
    ``PrivacySettings``."""

    mode: str
    clip: float = PrivacySettings.default("dp_clip")
    noise: float = PrivacySettings.default("dp_noise")
    delta: float = PrivacySettings.default("dp_delta")
    adaptive_quantile: float = PrivacySettings.default("dp_adaptive_quantile")
    clip_lr: float = PrivacySettings.default("dp_clip_lr")
    count_noise: float = PrivacySettings.default("dp_count_noise")
