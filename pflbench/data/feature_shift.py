"""Feature shift on any image dataset: clients see different input distributions (``--feature-shift``).

Each client belongs to a domain: client k is in domain k mod G (``--shift-groups`` G; 0 = one
domain per client, G = K). The partitioners hand out clients in random order, so k mod G is a
balanced and unbiased assignment, and it needs nothing but K: a partition exported and read back
with ``--partition-file`` gets the same domains. Each listed transform t gives domain g a
strength s_{t,g}: the G evenly spaced levels 0, 1/(G−1), …, 1 dealt to the domains in a random
order (``feature_shift.domains`` stream; independently per transform, so with several transforms
the domains differ in their mix, and one domain per transform keeps the original images). A
strength becomes the transform's parameter:

=========  ==============================================  ===========================
transform  what it does to an image x (pixels in [0, 255])  parameter at strength s
=========  ==============================================  ===========================
rotate     rotation about the centre (bilinear, black fill)  θ = 90°·s
blur       Gaussian blur (separable, radius ⌈3σ⌉, edge pad)  σ = s·max(1, H/16) pixels
contrast   m + c·(x − m), m the image's mean                 c = 1 − 0.7·s
color      channel (g mod C) multiplied by a gain            gain = 1 − 0.6·s (grey: brightness)
invert     255 − x                                           on when s > 1/2 (half the domains)
noise      x + 255·σ·z, z ~ N(0, 1) per pixel                σ = 0.2·s
=========  ==============================================  ===========================

A domain applies its transforms in that order (geometry, optics, photometry, then sensor noise),
computed in float and rounded once to uint8. A parameter at its identity (strength 0) is
skipped, so the images of such a domain are the original bytes. The noise of client k is drawn
from its own generator (``feature_shift.noise`` stream, key k), so it does not depend on the
other clients. The transforms are applied once, when a run builds its data
(``Partition.shifted``): every sample of a client (train, validation and test) gets its
domain's transform; the public fraction and samples of no client stay as they are. The
domain's parameters and each client's domain are recorded in ``partition.json``
(``feature_shift``, and ``client_domains``: one label per client, as ``pflbench partition
--plot`` shows them).

The choices the setting leaves open, and why: ranges whose strongest setting of each transform
alone still leaves a digit readable to the eye (a 90° turn, contrast down to 0.3, noise up to
0.2 of the range; stacking all of them at full strength is a hard domain on purpose); evenly
spaced rather than random strengths (no two domains alike by chance with few domains); k mod G
rather than a drawn assignment (reproducible from K alone). Parameters are rounded to 6
decimals, so that partition.json shows 0.3, not 0.30000000000000004.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F

from pflbench.config.run_config import FEATURE_SHIFTS, feature_shift_names
from pflbench.errors import ConfigError
from pflbench.util.seeding import derive_seed, rng_stream

if TYPE_CHECKING:
    from pflbench.config.groups import PartitionSpec
    from pflbench.data.dataset import TensorDataset

APPLY_ORDER = ("rotate", "blur", "contrast", "color", "invert", "noise")
assert sorted(APPLY_ORDER) == sorted(FEATURE_SHIFTS)

MAX_ROTATION_DEGREES = 90.0
CONTRAST_DROP = 0.7
COLOR_DROP = 0.6
NOISE_STD = 0.2  # of the pixel range
IDENTITY = {"rotate": 0.0, "blur": 0.0, "contrast": 1.0, "color": 1.0, "invert": 0.0, "noise": 0.0}


# ---- the transforms: pure functions on float images [n, C, H, W] in [0, 255] -----------------


def rotate(images: torch.Tensor, degrees: float) -> torch.Tensor:
    """Counter-clockwise rotation by ``degrees`` about the image centre (bilinear; outside: 0)."""
    theta = math.radians(degrees)
    cos, sin = math.cos(theta), math.sin(theta)
    # affine_grid maps each output position (x right, y down) to the input position it samples;
    # for a counter-clockwise turn as displayed (row 0 on top) that is the matrix below
    # (a quarter turn equals torch.rot90(images, 1, dims=(2, 3)), tested)
    matrix = torch.tensor([[cos, -sin, 0.0], [sin, cos, 0.0]], dtype=images.dtype, device=images.device)
    grid = F.affine_grid(matrix.expand(len(images), 2, 3), list(images.shape), align_corners=False)
    return F.grid_sample(images, grid, mode="bilinear", padding_mode="zeros", align_corners=False)


def gaussian_kernel(sigma: float) -> torch.Tensor:
    """The normalised 1-D Gaussian kernel of radius ⌈3σ⌉: k_i ∝ exp(−i²/(2σ²))."""
    radius = max(1, math.ceil(3 * sigma))
    offsets = torch.arange(-radius, radius + 1, dtype=torch.float64)
    kernel = torch.exp(-(offsets**2) / (2 * sigma**2))
    return (kernel / kernel.sum()).float()


def blur(images: torch.Tensor, sigma: float) -> torch.Tensor:
    """Separable Gaussian blur with standard deviation ``sigma`` pixels (edges replicated)."""
    kernel = gaussian_kernel(sigma).to(images.device, images.dtype)
    channels, radius = images.shape[1], (len(kernel) - 1) // 2
    rows = kernel.view(1, 1, 1, -1).expand(channels, 1, 1, -1)
    columns = kernel.view(1, 1, -1, 1).expand(channels, 1, -1, 1)
    padded = F.pad(images, (radius, radius, 0, 0), mode="replicate")
    images = F.conv2d(padded, rows, groups=channels)
    padded = F.pad(images, (0, 0, radius, radius), mode="replicate")
    return F.conv2d(padded, columns, groups=channels)


def contrast(images: torch.Tensor, factor: float) -> torch.Tensor:
    """m + c·(x − m) with m each image's mean over channels and pixels."""
    mean = images.mean(dim=(1, 2, 3), keepdim=True)
    return mean + factor * (images - mean)


def color(images: torch.Tensor, channel: int, gain: float) -> torch.Tensor:
    """Channel ``channel`` multiplied by ``gain`` (a tint; the brightness of a grey image)."""
    gains = torch.ones(images.shape[1], dtype=images.dtype, device=images.device)
    gains[channel] = gain
    return images * gains.view(1, -1, 1, 1)


def invert(images: torch.Tensor) -> torch.Tensor:
    """255 − x."""
    return 255.0 - images


def noise(images: torch.Tensor, std: float, generator: torch.Generator) -> torch.Tensor:
    """x + 255·std·z, z ~ N(0, 1) per pixel from ``generator``."""
    z = torch.randn(images.shape, generator=generator, dtype=images.dtype)
    return images + 255.0 * std * z.to(images.device)


def to_pixels(images: torch.Tensor) -> torch.Tensor:
    """Float images back to uint8: rounded, clipped to [0, 255]."""
    return images.round().clamp_(0, 255).to(torch.uint8)


# ---- domains ---------------------------------------------------------------------------------


def parameter_at(transform: str, strength: float, image_height: int) -> float:
    """The parameter of ``transform`` at ``strength`` in [0, 1] (the module docstring's table)."""
    if transform == "rotate":
        return round(MAX_ROTATION_DEGREES * strength, 6)
    if transform == "blur":
        return round(strength * max(1.0, image_height / 16), 6)
    if transform == "contrast":
        return round(1.0 - CONTRAST_DROP * strength, 6)
    if transform == "color":
        return round(1.0 - COLOR_DROP * strength, 6)
    if transform == "invert":
        return 1.0 if strength > 0.5 else 0.0
    if transform == "noise":
        return round(NOISE_STD * strength, 6)
    raise ConfigError(f"--feature-shift {transform!r} is not a transform; valid: {', '.join(FEATURE_SHIFTS)}")


def domain_strengths(transforms: tuple[str, ...], num_domains: int, rng: np.random.Generator) -> list[dict[str, float]]:
    """Per domain, each transform's strength: the levels linspace(0, 1, G) in a random order
    (one permutation per transform, drawn in ``APPLY_ORDER``)."""
    levels = np.linspace(0.0, 1.0, num_domains)
    dealt = {t: rng.permutation(levels) for t in APPLY_ORDER if t in transforms}
    return [{t: float(dealt[t][g]) for t in dealt} for g in range(num_domains)]


def shift_images(
    images: torch.Tensor, parameters: dict[str, float], domain: int, generator: torch.Generator
) -> torch.Tensor:
    """uint8 images [n, C, H, W] under one domain's ``parameters`` (applied in ``APPLY_ORDER``,
    identities skipped, rounded once)."""
    active = [t for t in APPLY_ORDER if t in parameters and parameters[t] != IDENTITY[t]]
    if not active or len(images) == 0:
        return images.clone()
    result = images.float()
    for transform in active:
        value = parameters[transform]
        if transform == "rotate":
            result = rotate(result, value)
        elif transform == "blur":
            result = blur(result, value)
        elif transform == "contrast":
            result = contrast(result, value)
        elif transform == "color":
            result = color(result, domain % images.shape[1], value)
        elif transform == "invert":
            result = invert(result)
        else:
            result = noise(result, value, generator)
    return to_pixels(result)


@dataclass(frozen=True)
class FeatureShift:
    """A run's feature shift: the transforms, each domain's parameters, each client's domain."""

    transforms: tuple[str, ...]
    domains: tuple[dict[str, float], ...]  # per domain: transform → parameter (module table)
    client_domain: tuple[int, ...]  # per client
    seed: int

    def client_labels(self) -> list[str]:
        """One label per client: ``d<g>`` and its domain's parameters that are not the identity."""
        return [self.domain_label(g) for g in self.client_domain]

    def domain_label(self, domain: int) -> str:
        shown = [f"{t}={v:.3g}" for t, v in self.domains[domain].items() if v != IDENTITY[t]]
        return f"d{domain}" + (f" {' '.join(shown)}" if shown else " original")

    def to_json(self) -> dict[str, Any]:
        return {
            "transforms": list(self.transforms),
            "domains": [dict(d) for d in self.domains],
            "client_domain": list(self.client_domain),
        }

    def apply(self, dataset: TensorDataset, client_indices: list[np.ndarray]) -> TensorDataset:
        """A copy of ``dataset`` whose samples of client k are shifted to k's domain (once, here)."""
        inputs = dataset.inputs.clone()
        for k, indices in enumerate(client_indices):
            index = torch.as_tensor(np.asarray(indices, dtype=np.int64))
            generator = torch.Generator().manual_seed(derive_seed(self.seed, "feature_shift.noise", k))
            domain = self.client_domain[k]
            inputs[index] = shift_images(inputs[index], self.domains[domain], domain, generator)
        return dataclasses.replace(dataset, inputs=inputs)


def plan_feature_shift(spec: PartitionSpec, dataset: TensorDataset, num_clients: int) -> FeatureShift | None:
    """The run's feature shift (None without ``--feature-shift``); ConfigError for data that are
    not images or more domains than clients."""
    transforms = feature_shift_names(spec.feature_shift)
    if not transforms:
        return None
    if not dataset.is_image:
        raise ConfigError(
            f"--feature-shift transforms images (uint8 [N, C, H, W]); dataset {spec.dataset!r} holds "
            f"{dataset.inputs.dtype} inputs of shape {list(dataset.input_shape)}; leave --feature-shift out"
        )
    num_domains = spec.shift_groups or num_clients
    if num_domains > num_clients or num_domains < 2:
        raise ConfigError(
            f"--shift-groups {spec.shift_groups} needs 2 to {num_clients} domains (the {num_clients} clients); "
            "0 gives each client its own domain"
        )
    height = int(dataset.input_shape[1])
    strengths = domain_strengths(transforms, num_domains, rng_stream(spec.seed, "feature_shift.domains"))
    domains = tuple({t: parameter_at(t, s, height) for t, s in levels.items()} for levels in strengths)
    return FeatureShift(transforms, domains, tuple(k % num_domains for k in range(num_clients)), spec.seed)


def domain_examples(shift: FeatureShift, dataset: TensorDataset, index: int) -> np.ndarray:
    """Sample ``index`` under every domain's shift, uint8 [G, H, W, C] (for ``partition --plot``;
    its noise from the ``feature_shift.noise`` stream with key 2³¹ + g, no client's)."""
    image = dataset.inputs[index : index + 1]
    shown = []
    for domain, parameters in enumerate(shift.domains):
        generator = torch.Generator().manual_seed(derive_seed(shift.seed, "feature_shift.noise", 2**31 + domain))
        shown.append(shift_images(image, parameters, domain, generator)[0])
    return torch.stack(shown).permute(0, 2, 3, 1).numpy()
