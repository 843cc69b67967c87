"""Names a reader sees: algorithms' display names, readable metric labels, the setup caption."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import pandas as pd

from pflbench.config.identity import OMITTED_AT_DEFAULT
from pflbench.config.run_config import new_client_count
from pflbench.errors import ConfigError
from pflbench.plugin_sources import declared_display_name
from pflbench.store.reader import partition_sort_key

METRIC_NAMES = {
    "pers_acc": "Personalized accuracy",
    "pers_acc_weighted": "Personalized accuracy, weighted",
    "pers_acc_std": "Std of client accuracy",
    "pers_acc_worst10": "Worst-10% client accuracy",
    "pers_acc_ft": "Personalized accuracy, fine-tuned",
    "pers_acc_ft_weighted": "Personalized accuracy, fine-tuned, weighted",
    "global_acc": "Global accuracy",
    "val_pers_acc": "Validation personalized accuracy",
    "val_pers_acc_weighted": "Validation personalized accuracy, weighted",
    "val_pers_acc_std": "Std of validation client accuracy",
    "val_pers_acc_worst10": "Worst-10% validation client accuracy",
    "val_global_acc": "Validation global accuracy",
    "new_acc": "New-client accuracy",
    "new_acc_weighted": "New-client accuracy, weighted",
    "new_acc_std": "Std of new-client accuracy",
    "new_acc_worst10": "Worst-10% new-client accuracy",
    "new_acc_ft": "New-client accuracy, fine-tuned",
    "ood_acc": "Out-of-domain accuracy",
    "worst10": "Worst-10% client accuracy",
    "comm": "Communication",
    "time": "Wall time",
    "wall_time_s": "Wall time",
    "round_time_s_mean": "Time per round",
    "peak_mem_mb": "Peak memory",
    "train_loss": "Training loss",
    "final_train_loss": "Final training loss",
    "bytes_up_total": "Upload",
    "bytes_down_total": "Download",
    "rounds_to_target": "Rounds to target",
    "mb_to_target": "MB to target",
    "dp_epsilon": "Privacy ε",
    "sim_time_to_target": "Simulated time to target",
    "sim_time_total": "Simulated time",
    "clients_reported_mean": "Clients reporting per round",
    "asr": "Attack success rate",
}
LAST = "_last10"  # summary.json: the mean of the last 10% of evaluations


@dataclass(frozen=True)
class Quantity:
    """How a table column is shown: label, scale to display units, and which way is better
    (None: not known, so no best is marked and no rank is given)."""

    label: str
    scale: float
    higher_is_better: bool | None


def readable(name: str) -> str:
    """``pers_acc`` → ``Personalized accuracy``, ``x_last10`` → ``<x>, last 10%``; unknown keys
    lose their underscores."""
    if name in METRIC_NAMES:
        return METRIC_NAMES[name]
    if name.endswith(LAST) and name.removesuffix(LAST) in METRIC_NAMES:
        return f"{METRIC_NAMES[name.removesuffix(LAST)]}, last 10%"
    text = name.replace("_", " ").strip()
    return text[:1].upper() + text[1:]


def quantity(name: str) -> Quantity:
    """Accuracies in percent (higher is better, except their std); bytes and ``comm`` in MB, times
    in s, memory in MB, losses, the rounds/MB to a target and the privacy ε: lower is better. Any other key is
    shown as it is, with no direction (no bold, no rank)."""
    base = name.removesuffix(LAST)
    if base == "comm":
        return Quantity("Communication (MB)", 1 / 2**20, False)
    if base in ("time", "wall_time_s"):
        return Quantity("Wall time (s)", 1.0, False)
    if base in ("sim_time_to_target", "sim_time_total"):  # engine.availability's simulated seconds
        return Quantity(f"{readable(name)} (s)", 1.0, False)
    if base == "asr":  # --attack backdoor (engine.attacks): the attacker's success, lower is better
        return Quantity(f"{readable(name)} (%)", 100.0, False)
    if "acc" in base or base == "worst10":
        return Quantity(f"{readable(name)} (%)", 100.0, "std" not in base)
    if "bytes" in base:
        return Quantity(f"{readable(name)} (MB)", 1 / 2**20, False)
    if base.endswith("_time_s") or base.endswith("_time_s_mean"):
        return Quantity(f"{readable(name)} (s)", 1.0, False)
    if base.endswith("_mb"):
        return Quantity(f"{readable(name)} (MB)", 1.0, False)
    if "loss" in base or base in ("rounds_to_target", "mb_to_target", "dp_epsilon"):
        return Quantity(readable(name), 1.0, False)
    return Quantity(readable(name), 1.0, None)


def metric_role(name: str) -> str:
    """``validation`` (``val_*``), ``test`` (any other accuracy: measured on the test splits or on
    new clients) or ``other`` (loss, bytes, time, memory, diagnostics)."""
    base = name.removesuffix(LAST)
    if base.startswith("val_"):
        return "validation"
    return "test" if "acc" in base or base == "worst10" else "other"


def flat_setting(key: str) -> dict[str, Any]:
    """A run's ``config_key`` (its settings besides the grid axes) as one flat mapping."""
    setting = json.loads(key)
    return {**setting["run"], **setting["algo_hparams"]}


def varying_settings(settings: list[dict[str, Any]]) -> list[str]:
    """The names whose values differ between ``settings`` (flat mappings), sorted."""
    names = sorted(set().union(*settings))
    return [n for n in names if len({json.dumps(s.get(n), default=str) for s in settings}) > 1]


def setting_text(settings: dict[str, Any], name: str) -> str:
    """A run's value of ``name`` as a row label shows it; one its identity omits at the default
    is that default; no value is ``none``."""
    value = settings.get(name, OMITTED_AT_DEFAULT.get(name))
    return "none" if value is None else str(value)


def display_name(algo: str, renames: Mapping[str, str] | None = None) -> str:
    """``--rename`` first, then the algorithm class's ``display_name``, then the registered name."""
    if renames and algo in renames:
        return renames[algo]
    try:  # read from the algorithm's source where it says it: no torch for a table
        declared = declared_display_name(algo)
    except Exception:  # an unknown or unloadable algorithm still gets a name
        declared = None
    if isinstance(declared, str) and declared.strip():
        return declared
    return algo


def parse_renames(pairs: Iterable[str]) -> dict[str, str]:
    """``["fedavg=FedAvg (ours)"]`` → ``{"fedavg": "FedAvg (ours)"}``."""
    renames = {}
    for pair in pairs:
        old, sep, new = pair.partition("=")
        if not sep or not old.strip() or not new.strip():
            raise ConfigError(f"--rename {pair!r} is not OLD=NEW (e.g. fedavg=FedAvg)")
        renames[old.strip()] = new.strip()
    return renames


def _values(values: Iterable[object]) -> str:
    distinct = sorted(
        {"none" if v is None else f"{v:g}" if isinstance(v, float) else str(v) for v in values},
        key=lambda text: (len(text), text),
    )
    return "/".join(distinct)


def setup_text(frame: pd.DataFrame) -> str:
    """One sentence on the setup of the runs in ``frame``: dataset, partition and α, clients,
    sampled per round, rounds, local epochs, model (several values are joined by ``/``)."""
    runs = frame.drop_duplicates("run")
    settings = [json.loads(key)["run"] for key in runs["config_key"].unique()]
    if not settings:
        return ""

    def field(name: str) -> str:
        return _values(s.get(name) for s in settings)

    def held_out(s: dict[str, Any]) -> int:  # new clients never train, so M is drawn from the others
        fraction = s.get("new_clients") or 0
        try:
            return new_client_count(s["num_clients"], fraction) if isinstance(fraction, (int, float)) else 0
        except ConfigError:  # a damaged config.json: the setup line still reads
            return 0

    sampled = _values(
        max(1, round((s["num_clients"] - held_out(s)) * s["frac"]))
        if isinstance(s.get("num_clients"), int) and isinstance(s.get("frac"), (int, float))
        else None
        for s in settings
    )
    new = _values(held_out(s) if isinstance(s.get("num_clients"), int) else None for s in settings)
    labels = sorted(runs["partition"].unique(), key=partition_sort_key)
    if all(label.startswith("α=") and " " not in label for label in labels):  # Dirichlet label skew
        partition_text = f"dirichlet partition (α = {', '.join(label[2:] for label in labels)})"
    else:
        partition_text = f"partition {' / '.join(labels)}"
    epochs = field("local_epochs")
    model = _values(_model_text(s) for s in settings)
    threats = ""  # --attack / --robust-agg (engine.attacks, engine.robust): said whenever a run has one
    if any(s.get(name) not in (None, "none") for s in settings for name in ("attack", "robust_agg")):
        threats = f", attack {field('attack')} (attackers {field('attackers')}), aggregation {field('robust_agg')}"
    return (
        f"{', '.join(sorted(runs['dataset'].unique()))}, {partition_text}, "
        f"{field('num_clients')} clients{'' if new in ('0', '') else f' ({new} of them new, never trained)'}, "
        f"{sampled} sampled per round, {field('rounds')} rounds, "
        f"{epochs} local epoch{'' if epochs == '1' else 's'}, model {model}{threats}"
    )


def _model_text(settings: dict[str, Any]) -> str | None:
    """The model and its ``--model-option`` values (e.g. ``mlp (hidden=100)``): a model's width is
    part of the setup a reader compares."""
    model, options = settings.get("model"), settings.get("model_options") or settings.get("model_option")
    if isinstance(options, dict):  # the identity's form: {"hidden": 100}
        options = [f"{k}={v}" for k, v in sorted(options.items())]
    if model is None or not options or not isinstance(options, (list, tuple)):
        return model
    return f"{model} ({', '.join(map(str, options))})"
