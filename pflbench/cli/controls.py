"""The options that steer a command rather than configure a run, declared once.

A ``CommandOption`` is never a run setting: it is no ``RunConfig`` field, no hyperparameter, no
``--set`` axis and no part of a run's identity. ``run``, ``sweep`` and ``tune`` take the controls
they need by name (``controls("quiet", "force", ...)``); the commands tell them from settings by
their class (``command_option_names``), not by hand-kept lists, and help lists them by ``section``.
"""

from __future__ import annotations

from typing import Any

import click

CONTROL = "Control"  # the help section of the controls (and of --config, --help-all)


class CommandOption(click.Option):
    """An option of the command itself (its output, its processes, its grid), shown in help under
    ``section``."""

    def __init__(self, *args: Any, section: str = CONTROL, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.section = section


def command_option_names(command: click.Command) -> set[str]:
    """The names of ``command``'s own options (every ``CommandOption``): not settings of a run."""
    return {p.name for p in command.params if isinstance(p, CommandOption) and p.name}


FULL_HELP = "pflbench.full_help"  # ctx.meta key: --help-all asked for every option in full


def _help_all(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    ctx.meta[FULL_HELP] = True
    click.echo(ctx.get_help(), color=ctx.color)
    ctx.exit()


# name → (flags, click.Option keywords); ``help`` may be reworded per command (``controls``)
CONTROLS: dict[str, tuple[list[str], dict[str, Any]]] = {
    "quiet": (["--quiet", "-q"], {"is_flag": True, "help": "No progress bar."}),
    "force": (
        ["--force"],
        {
            "is_flag": True,
            "help": "Redo a run that already finished in --out (the earlier result is replaced only when "
            "the new run completes).",
        },
    ),
    "resume": (
        ["--resume"],
        {
            "is_flag": True,
            "help": "Continue an unfinished run of the same settings from its last checkpoint (see "
            "--checkpoint-every); without one, start it anew.",
        },
    ),
    "dry_run": (
        ["--dry-run"],
        {"is_flag": True, "help": "List the grid's runs (and which are finished) without running anything."},
    ),
    "jobs": (
        ["--jobs", "-j"],
        {
            "type": click.IntRange(min=1),
            "default": 1,
            "show_default": True,
            "help": "Runs at once, each in its own process with max(1, threads // jobs) threads (--threads "
            "0: every usable core). Same metrics as --jobs 1 at equal threads per run.",
        },
    ),
    "ray": (
        ["--ray"],
        {
            "is_flag": True,
            "help": "Run whole runs in parallel as Ray tasks (a local Ray instance with this machine's CPUs, "
            "or the cluster of --ray-address, which implies --ray); results are written here as by a "
            "local sweep. pip install 'pflbench[ray]'.",
        },
    ),
    "cpus_per_run": (
        ["--cpus-per-run"],
        {
            "type": float,
            "default": 1.0,
            "show_default": True,
            "help": "CPUs each run task declares to Ray (and its torch threads).",
        },
    ),
    "gpus_per_run": (
        ["--gpus-per-run"],
        {
            "type": float,
            "default": 0.0,
            "show_default": True,
            "help": "GPUs each run task declares to Ray (fractions share a GPU).",
        },
    ),
    "plugin": (
        ["--plugin"],
        {
            "multiple": True,
            "type": str,
            "help": "Python file that registers an algorithm/dataset/model (repeatable).",
        },
    ),
    "help_all": (
        ["--help-all"],
        {
            "is_flag": True,
            "expose_value": False,
            "is_eager": True,
            "callback": _help_all,
            "help": "Show every option in full, every algorithm's own options too, and exit.",
        },
    ),
}


def controls(*names: str, **helps: str) -> list[click.Option]:
    """The control options ``names`` (keys of ``CONTROLS``), in that order, each a new object;
    ``helps`` rewords one for its command (``quiet="Print only the final summary."``)."""
    made: list[click.Option] = []
    for name in names:
        flags, keywords = CONTROLS[name]
        made.append(CommandOption(list(flags), **{**keywords, **({"help": helps[name]} if name in helps else {})}))
    return made
