"""``pflbench pretrain``: the offline backbone of LoRA runs, built and cached ahead of time."""

from __future__ import annotations

from typing import Any

import click

from pflbench.cli.options import dataclass_options
from pflbench.config.run_config import RunConfig
from pflbench.errors import ConfigError

PRETRAIN_FIELDS = (
    "dataset",
    "dataset_option",
    "data_dir",
    "model",
    "model_option",
    "public_frac",
    "pretrain_epochs",
    "pretrain_lr",
    "seed",
    "device",
    "precision",  # a bf16 run looks up a backbone pretrained under bf16 (models.pretrain.backbone_key)
)


@click.command("pretrain")
def pretrain_command(**values: Any) -> None:
    """Pretrain a backbone on a public fraction of the data (given to no client) and cache it.

    Runs with the same dataset, model, model options, --public-frac, --seed and pretraining
    settings find it in the cache: LoRA runs by default, any run with --backbone public.
    """
    from pflbench.config.run_config import validate, with_base_defaults
    from pflbench.data.dataset import load_dataset
    from pflbench.data.partitioners import public_split
    from pflbench.models.pretrain import pretrain_backbone
    from pflbench.runs.prepare import resolve_device
    from pflbench.util.precision import check_precision

    config = RunConfig(**values)
    config = with_base_defaults(config)
    validate(config)
    if config.public_frac <= 0:
        raise ConfigError("--public-frac must be > 0: the backbone is trained on that public fraction")
    dataset = load_dataset(config.dataset, config.dataset_options())
    _, public = public_split(dataset.labels.numpy(), config.public_frac, config.seed)
    device = resolve_device(config.device)
    check_precision(config.precision, device)
    backbone = pretrain_backbone(config, dataset, public, device)
    click.echo(
        f"{'found cached' if backbone.from_cache else 'pretrained'} {config.model} on "
        f"{len(public)} public samples of {config.dataset} ({backbone.num_train} train / "
        f"{backbone.num_val} held back): held-back accuracy {backbone.val_accuracy:.4f}"
    )
    written = backbone.content is None
    click.echo(
        f"weights: {backbone.path}" if written else f"weights: not written ({backbone.path} could not be written)"
    )


def _pretrain_options() -> list[click.Option]:
    """The pretraining fields of RunConfig, defaulting to what a LoRA run uses."""
    from pflbench.config.lora import RUN_DEFAULTS

    options = dataclass_options(RunConfig, PRETRAIN_FIELDS)
    for option in options:
        if option.name in RUN_DEFAULTS:
            option.default, option.show_default = RUN_DEFAULTS[option.name], True
    return options


pretrain_command.params[:0] = _pretrain_options()
