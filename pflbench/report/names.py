"""Names a reader sees: algorithms' display names, readable metric labels, the setup caption."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import pandas as pd

from pflbench.errors import ConfigError
from pflbench.plugin_sources import declared_display_name
from pflbench.store.reader import partition_sort_key

METRIC_NAMES = {
    "pers_acc": "Personalized accuracy",
    "pers_acc_last10": "Personalized accuracy, last 10%",
    "global_acc": "Global accuracy",
    "pers_acc_worst10": "Worst-10% client accuracy",
    "pers_acc_std": "Std of client accuracy",
    "worst10": "Worst-10% client accuracy",
    "comm": "Communication",
    "time": "Wall time",
    "wall_time_s": "Wall time",
    "train_loss": "Training loss",
    "bytes_up_total": "Upload",
    "bytes_down_total": "Download",
}


@dataclass(frozen=True)
class Quantity:
    """How a table column is shown: label, scale to display units, and which way is better."""

    label: str
    scale: float
    higher_is_better: bool


def readable(name: str) -> str:
    """``pers_acc`` → ``Personalized accuracy``; unknown keys lose their underscores."""
    if name in METRIC_NAMES:
        return METRIC_NAMES[name]
    text = name.replace("_", " ").strip()
    return text[:1].upper() + text[1:]


def quantity(name: str) -> Quantity:
    """Accuracies in percent (higher is better, except spreads); bytes in MB, times in s (lower)."""
    if name == "comm":
        return Quantity("Communication (MB)", 1 / 2**20, False)
    if name in ("time", "wall_time_s"):
        return Quantity("Wall time (s)", 1.0, False)
    if "acc" in name or name == "worst10":
        return Quantity(f"{readable(name)} (%)", 100.0, "std" not in name)
    if "bytes" in name:
        return Quantity(f"{readable(name)} (MB)", 1 / 2**20, False)
    return Quantity(readable(name), 1.0, False)


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

    sampled = _values(
        max(1, round(s["num_clients"] * s["frac"]))
        if isinstance(s.get("num_clients"), int) and isinstance(s.get("frac"), (int, float))
        else None
        for s in settings
    )
    labels = sorted(runs["partition"].unique(), key=partition_sort_key)
    if all(label.startswith("α=") and " " not in label for label in labels):  # Dirichlet label skew
        partition_text = f"dirichlet partition (α = {', '.join(label[2:] for label in labels)})"
    else:
        partition_text = f"partition {' / '.join(labels)}"
    epochs = field("local_epochs")
    return (
        f"{', '.join(sorted(runs['dataset'].unique()))}, {partition_text}, "
        f"{field('num_clients')} clients, {sampled} sampled per round, {field('rounds')} rounds, "
        f"{epochs} local epoch{'' if epochs == '1' else 's'}, model {field('model')}"
    )
