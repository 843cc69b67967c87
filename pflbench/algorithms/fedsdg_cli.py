"""FedSDG's own command, ``pflbench gates RUN_DIR``, contributed through the ``pflbench.commands``
entry point (the core names no plugin). Importing this module does not import torch."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from pflbench.errors import ConfigError
from pflbench.store.layout import SUMMARY_FILE
from pflbench.store.reader import load_json

if TYPE_CHECKING:
    import numpy as np


def plot_gate_heatmap(
    gates: Sequence[Sequence[float]] | np.ndarray,
    path: str | Path,
    block_labels: Sequence[str] | None = None,
    title: str = "",
) -> Path:
    """Client × block heatmap of gate values m ∈ [0, 1] (FedSDG), saved as PNG/PDF by suffix."""
    import numpy as np  # here: every pflbench command loads this module at start
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    matrix = np.asarray(gates, dtype=float)
    if matrix.ndim != 2 or matrix.size == 0:
        raise ConfigError(f"gate values must be a non-empty clients × blocks matrix, got shape {matrix.shape}")
    path = Path(path)
    path = path if path.suffix else path.with_suffix(".png")
    path.parent.mkdir(parents=True, exist_ok=True)
    num_clients, num_blocks = matrix.shape
    figure = Figure(figsize=(max(4.0, 0.6 * num_blocks + 2), min(24.0, max(3.0, 0.22 * num_clients + 1.5))))
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    image = axes.imshow(matrix, aspect="auto", cmap="viridis", vmin=0.0, vmax=1.0, interpolation="nearest")
    axes.set_xlabel("block")
    axes.set_ylabel("client")
    axes.set_xticks(
        range(num_blocks),
        block_labels or [str(i) for i in range(num_blocks)],
        rotation=45 if block_labels else 0,
        fontsize=8,
    )
    step = max(1, num_clients // 40)
    axes.set_yticks(range(0, num_clients, step))
    figure.colorbar(image, ax=axes, label="gate m = sigmoid(a)")
    axes.set_title(title or "FedSDG gates per client and block")
    figure.tight_layout()
    figure.savefig(path, dpi=150)
    return path


GATE_FRACTIONS = ("gate_frac_below_0.1", "gate_frac_above_0.9", "gate_frac_0.4_to_0.6")


def read_gate_summary(run_dir: Path) -> dict[str, Any]:
    """The gate values of a FedSDG run's ``summary.json``, every key checked: ``gates`` a
    non-empty clients × blocks matrix of numbers in [0, 1], the three fractions numbers in
    [0, 1], ``gates_clients_trained`` an integer, ``gate_blocks`` (optional) one name per block.
    A received or damaged file is one ConfigError line naming the file and the key."""
    path = Path(run_dir) / SUMMARY_FILE
    no_gates = f"{run_dir} has no gate values (a finished fedsdg run folder has them in summary.json)"
    if not path.exists():
        raise ConfigError(no_gates)
    try:
        summary = load_json(path)
    except ValueError as error:
        raise ConfigError(f"cannot read {path}: {error}") from None
    if not isinstance(summary, dict) or "gates" not in summary:
        raise ConfigError(no_gates)
    gates = summary["gates"]
    width = len(gates[0]) if isinstance(gates, list) and gates and isinstance(gates[0], list) else 0
    if not (width and all(isinstance(row, list) and len(row) == width for row in gates)):
        raise ConfigError(f"{path}: 'gates' must be a non-empty clients × blocks list of lists of equal length")
    if not all(_fraction(m) for row in gates for m in row):
        raise ConfigError(f"{path}: 'gates' must hold gate values m in [0, 1]")
    for key in GATE_FRACTIONS:
        if not _fraction(summary.get(key)):
            raise ConfigError(f"{path}: {key!r} must be a fraction in [0, 1], got {json.dumps(summary.get(key))[:50]}")
    trained = summary.get("gates_clients_trained")
    if type(trained) is not int or trained < 0:
        raise ConfigError(f"{path}: 'gates_clients_trained' must be an integer ≥ 0, got {json.dumps(trained)[:50]}")
    blocks = summary.get("gate_blocks", [])
    if not (isinstance(blocks, list) and all(isinstance(b, str) for b in blocks) and len(blocks) in (0, width)):
        raise ConfigError(f"{path}: 'gate_blocks' must list one block name per gate column ({width})")
    return summary


def _fraction(value: Any) -> bool:
    return type(value) in (int, float) and 0.0 <= value <= 1.0


@click.command("gates")
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False))
@click.option("--plot", type=click.Path(dir_okay=False), help="Save the client × block heatmap (PNG/PDF).")
def gates_command(run_dir: str, plot: str | None) -> None:
    """Print (and plot) the per-client gate values of a FedSDG run."""

    summary = read_gate_summary(Path(run_dir))
    gates = summary["gates"]
    click.echo(
        f"gates < 0.1: {summary['gate_frac_below_0.1']:.1%}   > 0.9: {summary['gate_frac_above_0.9']:.1%}"
        f"   in [0.4, 0.6]: {summary['gate_frac_0.4_to_0.6']:.1%}   (clients trained: "
        f"{summary['gates_clients_trained']})"
    )
    for client, row in enumerate(gates):
        click.echo(f"{client:>4}  " + " ".join(f"{m:.2f}" for m in row))
    if plot:
        labels = [name.removesuffix(".gate") for name in summary.get("gate_blocks", [])] or None
        click.echo(f"plot: {plot_gate_heatmap(gates, plot, labels)}")
