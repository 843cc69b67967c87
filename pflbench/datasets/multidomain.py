"""Multi-domain datasets (feature shift), CINIC-10 and CelebA (natural clients).

A multi-domain dataset carries each sample's domain name in ``TensorDataset.groups`` and says so
with ``info["group_column"] == "domain"`` (the sorted domain names are in ``info["domains"]``).
``--partition domain`` / ``domain-dirichlet`` (``pflbench.data.domains``) draw K/D clients inside
each of the D domains, and ``--holdout-domain NAME`` keeps one domain out of training for the
out-of-domain accuracy ``ood_acc``. ``--partition natural`` on such a dataset makes one client per
domain (its groups are the domains).

* ``pacs`` — ``flwrlabs/pacs``: one ``train`` split of 9,991 images with ``image``, ``domain``
  (a string: art_painting, cartoon, photo, sketch) and ``label`` (a 7-class ``ClassLabel``: dog,
  elephant, giraffe, guitar, horse, house, person). The images are 227×227; ``size`` (default 64)
  resizes them, since 9,991 × 3 × 227² bytes would be 1.5 GB of uint8 in memory.
* ``mnist_usps`` — the digits-family feature shift: ``ylecun/mnist`` (70,000 28×28 digits) and
  ``flwrlabs/usps`` (``image`` 16×16 grayscale, ``label`` 10 classes, splits train 7,291 / test
  2,007) as the two domains ``mnist`` and ``usps``, every image resized to ``size`` (default 28,
  MNIST's own size; USPS is upsampled bilinearly). ``data_dir`` is a folder holding one local copy
  of each, in sub-folders ``mnist/`` and ``usps/`` (each a hub clone or a ``save_to_disk`` folder).
* ``imagefolder_domains`` — local images in ``path/<domain>/<class>/<image file>``: domains are
  the sorted top-level folders, classes the sorted union of the class folders over all domains
  (a domain may lack a class).
* ``cinic10`` — ``flwrlabs/cinic10``: 270,000 32×32 RGB images (train, validation and test of
  90,000 each), ``image`` and ``label`` (the 10 CIFAR-10 classes): a larger label-skew set.
* ``celeba`` — ``flwrlabs/celeba`` (config ``img_align+identity+attr``): 202,599 aligned 178×218
  faces with ``image``, ``celeb_id`` (int, the natural client: 10,177 celebrities) and 40 boolean
  attributes. As in LEAF's CelebA task the label is ``Smiling`` (binary) and the clients are the
  celebrities (``--partition natural``); ``attribute`` picks another of the 40 columns. ``size``
  (default 64; LEAF resizes to 84) keeps the pooled uint8 images at 2.5 GB instead of 23 GB.

All hub datasets load like the other hub datasets (``pflbench.datasets.hub``): from Hugging
Face's cache or a local copy (``--data-dir``), with a one-line error saying how to get the data.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch
from PIL import Image

from pflbench.data.dataset import TensorDataset
from pflbench.datasets.hub import (
    MNIST,
    HubSource,
    _decode,
    decode_images,
    hub_splits,
    image_sources,
    label_info,
    require_columns,
)
from pflbench.datasets.local_files import _fingerprint_of, _parse_size, _resolve_path
from pflbench.errors import ConfigError
from pflbench.registry import register_dataset

DOMAIN_GROUPS = "domain"  # info["group_column"] of a dataset whose groups are domains

PACS = HubSource("pacs", "flwrlabs/pacs", "image", "label")
PACS_DOMAIN_COLUMN = "domain"
PACS_DEFAULT_SIZE = 64
USPS = HubSource("usps", "flwrlabs/usps", "image", "label")
DIGITS_DOMAINS = {"mnist": MNIST, "usps": USPS}  # domain name → its hub dataset
DIGITS_DEFAULT_SIZE = 28
CINIC10 = HubSource("cinic10", "flwrlabs/cinic10", "image", "label")
CELEBA = HubSource("celeba", "flwrlabs/celeba", "image", "Smiling")
CELEBA_CLIENT = "celeb_id"
CELEBA_DEFAULT_SIZE = 64


# ----------------------------------------------------------------------------- shared helpers


def _pooled_arrays(
    splits: dict[str, Any], source: HubSource, label_column: str, origin: str, extra: tuple[str, ...] = ()
) -> tuple[list[bytes | str], np.ndarray, Any, dict[str, list[Any]], dict[str, int]]:
    """The splits concatenated in order: image sources, raw labels, the label feature, the
    ``extra`` columns as Python lists, and each split's size."""
    first = next(iter(splits.values()))
    require_columns(first.column_names, [source.image_column, label_column, *extra], origin)
    tables = [split.with_format("arrow") for split in splits.values()]
    images = [item for table in tables for item in image_sources(table[source.image_column], source.image_column)]
    labels = np.concatenate([table[label_column].to_numpy(zero_copy_only=False) for table in tables])
    columns = {name: [v for table in tables for v in table[name].to_pylist()] for name in extra}
    return images, labels, first.features[label_column], columns, {n: len(s) for n, s in splits.items()}


def _described(sizes: dict[str, int]) -> str:
    return ", ".join(f"{name}: {size}" for name, size in sizes.items())


def domain_dataset(
    inputs: torch.Tensor, labels: np.ndarray, num_classes: int, domains: np.ndarray, source: str, info: dict[str, Any]
) -> TensorDataset:
    """A TensorDataset whose groups are the samples' domain names (see the module docstring)."""
    domains = np.asarray([str(d) for d in domains])
    if len(domains) and any(not d for d in domains):
        raise ConfigError(f"{source}: a sample has an empty domain name")
    return TensorDataset(
        inputs=inputs,
        labels=torch.from_numpy(np.asarray(labels, dtype=np.int64)),
        num_classes=num_classes,
        source=source,
        groups=domains,
        info={**info, "group_column": DOMAIN_GROUPS, "domains": sorted(set(domains.tolist()))},
    )


# ----------------------------------------------------------------------------- PACS


@register_dataset("pacs")
def pacs(data_dir: str | None = None, size: int | str = PACS_DEFAULT_SIZE) -> TensorDataset:
    """PACS (flwrlabs/pacs): 9,991 images, 7 classes, 4 domains (art_painting, cartoon, photo, sketch).

    Every image is resized to ``size`` (N or HxW, default 64)."""
    splits, origin = hub_splits(PACS, data_dir)
    images, labels, feature, columns, sizes = _pooled_arrays(
        splits, PACS, PACS.label_column, origin, (PACS_DOMAIN_COLUMN,)
    )
    labels = labels.astype(np.int64)
    num_classes, names = label_info(feature, labels, PACS.label_column)
    if any(d is None for d in columns[PACS_DOMAIN_COLUMN]):
        raise ConfigError(f"{origin}: column {PACS_DOMAIN_COLUMN!r} has missing values")
    info: dict[str, Any] = {"splits": sizes, "label_column": PACS.label_column}
    if names is not None:
        info["classes"] = names
    return domain_dataset(
        decode_images(images, _parse_size(size)),
        labels,
        num_classes,
        np.asarray(columns[PACS_DOMAIN_COLUMN]),
        f"{origin}, splits pooled ({_described(sizes)})",
        info,
    )


# ----------------------------------------------------------------------------- MNIST + USPS


def _digits_copy(domain: str, data_dir: str | None) -> str | None:
    """The local copy of one digits domain: ``data_dir/<domain>`` (None: the hub cache)."""
    if data_dir is None:
        return None
    root = Path(data_dir).expanduser().resolve()
    if not root.is_dir():
        raise ConfigError(
            f"dataset 'mnist_usps': data_dir {str(root)!r} is not a directory "
            f"(expected a folder holding {' and '.join(f'{d}/' for d in DIGITS_DOMAINS)}, one local copy each)"
        )
    return str(root / domain)


@register_dataset("mnist_usps")
def mnist_usps(data_dir: str | None = None, size: int | str = DIGITS_DEFAULT_SIZE) -> TensorDataset:
    """MNIST (ylecun/mnist) and USPS (flwrlabs/usps) as the two domains of one 10-digit task.

    Every image is resized to ``size`` (default 28); ``data_dir`` holds mnist/ and usps/ local copies."""
    shape = _parse_size(size)
    inputs, labels, domains, origins = [], [], [], []
    split_sizes: dict[str, dict[str, int]] = {}
    for domain, source in DIGITS_DOMAINS.items():
        splits, origin = hub_splits(source, _digits_copy(domain, data_dir))
        images, raw, feature, _, sizes = _pooled_arrays(splits, source, source.label_column, origin)
        raw = raw.astype(np.int64)
        num_classes, _ = label_info(feature, raw, source.label_column)
        if num_classes > 10:
            raise ConfigError(f"{origin}: label column has {num_classes} classes, digits have 10")
        inputs.append(decode_images(images, shape))
        labels.append(raw)
        domains += [domain] * len(raw)
        origins.append(f"{domain}: {origin} ({_described(sizes)})")
        split_sizes[domain] = sizes
    return domain_dataset(
        torch.cat(inputs),
        np.concatenate(labels),
        10,
        np.asarray(domains),
        "; ".join(origins),
        {"splits": split_sizes, "classes": [str(d) for d in range(10)]},
    )


# ----------------------------------------------------------------------------- image folders


def _domain_images(root: Path) -> tuple[list[str], list[str], list[Path], list[int], list[str]]:
    """Sorted domain and class names, and every image file with its class index and domain."""
    extensions = set(Image.registered_extensions())

    def folders(path: Path) -> list[str]:
        return sorted(entry.name for entry in path.iterdir() if entry.is_dir() and not entry.name.startswith("."))

    domains = folders(root)
    classes = sorted({name for domain in domains for name in folders(root / domain)})
    index = {name: k for k, name in enumerate(classes)}
    files: list[Path] = []
    labels: list[int] = []
    owners: list[str] = []
    for domain in domains:
        for name in folders(root / domain):
            found = sorted(
                file
                for file in (root / domain / name).rglob("*")
                if file.suffix.lower() in extensions and file.is_file()
            )
            files += found
            labels += [index[name]] * len(found)
            owners += [domain] * len(found)
    return domains, classes, files, labels, owners


# what Pillow raises for a file it cannot decode: unknown format or truncated (OSError), a header
# claiming more pixels than Image.MAX_IMAGE_PIXELS allows (DecompressionBombError), malformed data
# (SyntaxError, ValueError: e.g. a bad PNG chunk)
UNDECODABLE = (OSError, SyntaxError, ValueError, Image.DecompressionBombError)


def _decode_files(files: list[Path], size: tuple[int, int] | None) -> torch.Tensor:
    """``decode_images`` of the files; an image Pillow cannot decode is one ConfigError naming
    its file (found by decoding the files one by one, only once the batch failed)."""
    try:
        return decode_images([str(file) for file in files], size)
    except ConfigError:
        raise
    except UNDECODABLE:
        for file in files:
            try:
                _decode(str(file), size)
            except UNDECODABLE as problem:
                reason = " ".join(str(problem).split())[:200] or type(problem).__name__
                raise ConfigError(f"imagefolder_domains: cannot decode image {str(file)!r}: {reason}") from None
        raise


@register_dataset("imagefolder_domains")
def imagefolder_domains(
    path: str | None = None, data_dir: str | None = None, size: int | str | None = None
) -> TensorDataset:
    """Images in ``path/<domain>/<class>/...``: domains and classes sorted by folder name.

    ``size`` (N or HxW) resizes every image; without it all images must share one size.
    """
    root = _resolve_path("imagefolder_domains", path, data_dir)
    if not root.is_dir():
        raise ConfigError(f"imagefolder_domains path {str(root)!r} is not a directory")
    domains, classes, files, labels, owners = _domain_images(root)
    if not files:
        raise ConfigError(
            f"imagefolder_domains {str(root)!r} has no images in domain/class sub-folders "
            "(expected PATH/<domain>/<class name>/<image file>)"
        )
    return domain_dataset(
        _decode_files(files, _parse_size(size)),
        np.asarray(labels),
        len(classes),
        np.asarray(owners),
        f"image folder {root} ({len(files)} images, {len(domains)} domains, {len(classes)} classes)",
        {"classes": classes},
    )


imagefolder_domains.cache_key = _fingerprint_of("imagefolder_domains")


# ----------------------------------------------------------------------------- CINIC-10


@register_dataset("cinic10")
def cinic10(data_dir: str | None = None) -> TensorDataset:
    """CINIC-10 (flwrlabs/cinic10): 270,000 32×32 RGB images, the 10 CIFAR-10 classes."""
    splits, origin = hub_splits(CINIC10, data_dir)
    images, labels, feature, _, sizes = _pooled_arrays(splits, CINIC10, CINIC10.label_column, origin)
    labels = labels.astype(np.int64)
    num_classes, names = label_info(feature, labels, CINIC10.label_column)
    info: dict[str, Any] = {"splits": sizes, "label_column": CINIC10.label_column}
    if names is not None:
        info["classes"] = names
    return TensorDataset(
        inputs=decode_images(images),
        labels=torch.from_numpy(labels),
        num_classes=num_classes,
        source=f"{origin}, splits pooled ({_described(sizes)})",
        info=info,
    )


# ----------------------------------------------------------------------------- CelebA


@register_dataset("celeba")
def celeba(
    data_dir: str | None = None, attribute: str = CELEBA.label_column, size: int | str = CELEBA_DEFAULT_SIZE
) -> TensorDataset:
    """CelebA (flwrlabs/celeba): faces, celebrities as clients, binary label Smiling (as in LEAF).

    ``attribute`` picks another of the 40 boolean attributes as the label; images are resized to
    ``size`` (default 64)."""
    splits, origin = hub_splits(CELEBA, data_dir)
    first = next(iter(splits.values()))
    require_columns(first.column_names, [CELEBA.image_column, CELEBA_CLIENT], origin)
    attributes = [n for n in first.column_names if pa.types.is_boolean(first.data.schema.field(n).type)]
    if attribute not in attributes:
        raise ConfigError(
            f"celeba option attribute={attribute!r} is not one of its boolean attribute columns: "
            f"{', '.join(attributes) or 'none found'}"
        )
    images, raw, _, columns, sizes = _pooled_arrays(splits, CELEBA, attribute, origin, (CELEBA_CLIENT,))
    if any(v is None for v in columns[CELEBA_CLIENT]):
        raise ConfigError(f"{origin}: column {CELEBA_CLIENT!r} has missing values")
    return TensorDataset(
        inputs=decode_images(images, _parse_size(size)),
        labels=torch.from_numpy(raw.astype(np.int64)),
        num_classes=2,
        source=f"{origin}, splits pooled ({_described(sizes)})",
        groups=np.asarray([str(v) for v in columns[CELEBA_CLIENT]]),
        info={
            "splits": sizes,
            "label_column": attribute,
            "classes": [f"not {attribute}", attribute],
            "group_column": CELEBA_CLIENT,
        },
    )
