"""Figures for partitions and results (matplotlib, Agg canvas, imported lazily).

matplotlib is imported inside the functions so that ``import pflbench`` stays fast, and figures
are drawn on a private Agg canvas (no pyplot, no global backend switch).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from pflbench.errors import ConfigError
from pflbench.store.reader import partition_sort_key

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

_MAX_LEGEND_CLASSES = 20


def plot_label_distribution(
    label_histogram: Sequence[Sequence[int]] | np.ndarray,
    path: str | Path,
    title: str = "",
    client_domains: Sequence[str] | None = None,
) -> Path:
    """Stacked horizontal bars: samples per class (colours) for each client (rows).

    ``label_histogram`` is the K × C matrix of ``partition_stats(...)["label_histogram"]``.
    ``client_domains`` (partition.json's, one label per client): each row is labelled with its
    client's domain and a strip left of the bars marks the domains in colours of their own.
    The format follows the suffix of ``path`` (``.png``, ``.pdf``, ``.svg``; none → ``.png``).
    Returns the path written.
    """
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.colors import BoundaryNorm, ListedColormap
    from matplotlib.figure import Figure

    histogram = np.asarray(label_histogram)
    if histogram.ndim != 2 or histogram.shape[0] == 0 or histogram.shape[1] == 0:
        raise ConfigError(f"label histogram must be a non-empty clients × classes matrix, got shape {histogram.shape}")
    if (histogram < 0).any():
        raise ConfigError("label histogram has negative counts")
    num_clients, num_classes = histogram.shape
    path = Path(path)
    if not path.suffix:
        path = path.with_suffix(".png")

    if num_classes <= 10:
        colours = matplotlib.colormaps["tab10"].colors[:num_classes]
    elif num_classes <= 20:
        colours = matplotlib.colormaps["tab20"].colors[:num_classes]
    else:
        colours = matplotlib.colormaps["turbo"](np.linspace(0.05, 0.95, num_classes))

    bar_height = 0.8
    fig_height = min(max(3.0, 0.16 * num_clients + 1.6), 24.0)
    figure = Figure(figsize=(9.0, fig_height), dpi=150, layout="constrained")
    canvas = FigureCanvasAgg(figure)
    supported = canvas.get_supported_filetypes()
    fmt = path.suffix[1:].lower()
    if fmt not in supported:
        raise ConfigError(
            f"cannot write a plot as {path.suffix!r}; use one of {', '.join('.' + s for s in sorted(supported))}"
        )
    axes = figure.add_subplot()
    rows = np.arange(num_clients)
    left = np.zeros(num_clients)
    for c in range(num_classes):
        axes.barh(rows, histogram[:, c], left=left, height=bar_height, color=colours[c], label=str(c), linewidth=0)
        left += histogram[:, c]

    axes.set_ylim(num_clients - 0.5, -0.5)  # client 0 at the top
    step = max(1, int(np.ceil(num_clients / 40)))
    names = [str(k) for k in rows]
    if client_domains is not None:
        if len(client_domains) != num_clients:
            raise ConfigError(f"client_domains has {len(client_domains)} labels for {num_clients} clients")
        names = [f"{k}  {domain}" for k, domain in zip(rows, client_domains)]
        _domain_strip(axes, [str(d) for d in client_domains], float(left.max()))
    strip = 0.0 if client_domains is None else -0.064 * max(1.0, float(left.max()))
    axes.set_yticks(rows[::step], names[::step], fontsize=8 if num_clients <= 40 else 7)
    axes.set_ylabel("client" if client_domains is None else "client  domain")
    axes.set_xlabel("samples")
    axes.set_xlim(strip, max(1.0, float(left.max())) * 1.02)
    axes.grid(axis="x", alpha=0.3)
    axes.set_axisbelow(True)
    if title:
        axes.set_title(title)

    if num_classes <= _MAX_LEGEND_CLASSES:
        axes.legend(
            title="class",
            loc="upper left",
            bbox_to_anchor=(1.01, 1.0),
            fontsize=8,
            title_fontsize=9,
            frameon=False,
            ncols=1 if num_classes <= 12 or fig_height > 5 else 2,
        )
    else:
        from matplotlib.cm import ScalarMappable

        norm = BoundaryNorm(np.arange(num_classes + 1) - 0.5, num_classes)
        mappable = ScalarMappable(norm=norm, cmap=ListedColormap(colours))
        colorbar = figure.colorbar(mappable, ax=axes, fraction=0.04, pad=0.02)
        colorbar.set_label("class")
        tick_step = max(1, int(np.ceil(num_classes / 20)))
        colorbar.set_ticks(np.arange(0, num_classes, tick_step))

    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format=fmt, dpi=150)
    return path


def _domain_strip(axes: Any, client_domains: list[str], widest: float) -> None:
    """A strip of one colour per distinct domain left of the bars (x < 0)."""
    import matplotlib

    distinct = list(dict.fromkeys(client_domains))
    palette = matplotlib.colormaps["Set2" if len(distinct) <= 8 else "turbo"]
    shades = palette(np.linspace(0.0, 1.0, len(distinct))) if len(distinct) > 8 else palette.colors
    width = max(1.0, widest) * 0.04  # the strip spans x in [-0.06, -0.02]·widest (xlim from -0.064)
    for row, domain in enumerate(client_domains):
        axes.barh(row, width, left=-1.5 * width, height=0.8, color=shades[distinct.index(domain)], linewidth=0)
    axes.axvline(0, color="0.6", linewidth=0.5)


def plot_domain_examples(images: np.ndarray, labels: Sequence[str], path: str | Path, title: str = "") -> Path:
    """One example image per domain, side by side (``images`` uint8 [G, H, W, C], C 1 or 3):
    the same sample under each domain's feature shift, so that the shift itself is seen."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    images = np.asarray(images)
    if images.ndim != 4 or len(images) != len(labels) or len(images) == 0:
        raise ConfigError(f"domain examples must be [G, H, W, C] with one label each, got {images.shape}")
    path = Path(path)
    count = len(images)
    columns = min(count, 8)
    lines = -(-count // columns)
    figure = Figure(figsize=(1.6 * columns, 1.9 * lines + 0.4), dpi=150, layout="constrained")
    canvas = FigureCanvasAgg(figure)
    fmt = (path.suffix[1:] or "png").lower()
    if fmt not in canvas.get_supported_filetypes():
        raise ConfigError(f"cannot write a plot as {path.suffix!r}")
    for g in range(count):
        axes = figure.add_subplot(lines, columns, g + 1)
        picture = images[g]
        if picture.shape[-1] == 1:
            axes.imshow(picture[..., 0], cmap="gray", vmin=0, vmax=255, interpolation="nearest")
        else:
            axes.imshow(picture, interpolation="nearest")
        axes.set_title(str(labels[g]).replace(" ", "\n", 1), fontsize=6)
        axes.set_xticks([])
        axes.set_yticks([])
    if title:
        figure.suptitle(title, fontsize=9)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format=fmt, dpi=150)
    return path


def plot_curves(
    bands: pd.DataFrame,
    paths: Sequence[str | Path],
    x_label: str,
    y_label: str,
    title: str = "",
    integer_x: bool = False,
) -> list[Path]:
    """``curve_figure`` saved to every path (format by suffix: PNG, or PDF/SVG as vector)."""
    figure = curve_figure(bands, x_label, y_label, title, integer_x)
    written = []
    for path in map(Path, paths):
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            # tight: a long legend entry or title widens the image instead of being cut off
            figure.savefig(path, format=path.suffix[1:].lower() or "png", dpi=150, bbox_inches="tight")
        except OSError as error:
            raise ConfigError(f"cannot write {path}: {error.strerror or error}") from None
        written.append(path)
    return written


def _plain(text: str) -> str:
    """Text shown as is: a ``$`` would start matplotlib's math mode."""
    return text.replace("$", r"\$")


def curve_figure(bands: pd.DataFrame, x_label: str, y_label: str, title: str = "", integer_x: bool = False) -> Figure:
    """One panel per (dataset, partition): a line per table row (mean over seeds) and a ±std band.

    ``bands`` has the columns row, dataset, partition, x, mean, std of ``leaderboard.curve_bands``.
    ``integer_x``: ticks only at whole numbers (rounds).
    """
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator

    if bands.empty:
        raise ConfigError("no curves to plot")
    panels = sorted(
        set(zip(bands["dataset"], bands["partition"])), key=lambda panel: (panel[0], partition_sort_key(panel[1]))
    )
    rows = sorted(bands["row"].unique())
    palette = matplotlib.colormaps["tab10" if len(rows) <= 10 else "tab20"]
    colours = {row: palette(i % palette.N) for i, row in enumerate(rows)}
    # line style and marker vary too, so that curves lying on top of each other stay visible
    styles = {row: (("-", "--", "-.", ":")[i % 4], "osD^v<>p"[i % 8]) for i, row in enumerate(rows)}
    columns = min(3, len(panels))
    grid_rows = -(-len(panels) // columns)
    legend_columns = min(len(rows), 4)
    legend_rows = -(-len(rows) // legend_columns)
    # the legend below the panels gets its own height (43 algorithms: 11 lines), so the panels keep
    # theirs; many curves get taller panels; wide enough for the title and four legend columns
    panel_height = 3.4 if len(rows) <= 10 else 5.0
    height = panel_height * grid_rows + 0.5 + 0.25 * legend_rows
    figure = Figure(figsize=(max(4.6 * columns, 7.5), height), dpi=150, layout="constrained")
    FigureCanvasAgg(figure)
    axes_grid = figure.subplots(grid_rows, columns, squeeze=False)
    for axes, (dataset, partition) in zip(axes_grid.flat, panels):
        panel = bands[(bands["dataset"] == dataset) & (bands["partition"] == partition)]
        for row, curve in panel.groupby("row"):
            curve = curve.sort_values("x")
            x, mean, std = curve["x"].to_numpy(), curve["mean"].to_numpy(), curve["std"].fillna(0).to_numpy()
            axes.plot(
                x,
                mean,
                color=colours[row],
                label=_plain(row),
                linewidth=1.6,
                linestyle=styles[row][0],
                marker=styles[row][1] if len(x) <= 25 else None,
                markersize=3.5,
                markerfacecolor="none",
            )
            axes.fill_between(x, mean - std, mean + std, color=colours[row], alpha=0.18, linewidth=0)
        axes.set_title(_plain(f"{dataset}, {partition}"), fontsize=10)
        axes.set_xlabel(x_label)
        axes.set_ylabel(y_label)
        axes.grid(alpha=0.3)
        if integer_x:
            axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    for axes in list(axes_grid.flat)[len(panels) :]:
        axes.set_visible(False)
    handles = [
        Line2D(
            [],
            [],
            color=colours[row],
            linewidth=1.6,
            linestyle=styles[row][0],
            marker=styles[row][1],
            markerfacecolor="none",
        )
        for row in rows
    ]
    figure.legend(
        handles, [_plain(row) for row in rows], loc="outside lower center", ncols=legend_columns, frameon=False
    )
    if title:
        figure.suptitle(title)
    return figure
