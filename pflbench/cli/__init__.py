"""The ``pflbench`` command line.

- ``run.py``: ``run``; ``listing.py``: ``list``; ``partition.py``: ``partition``
- ``rerun.py``: ``rerun`` (a run again from its config.json)
- ``config_file.py``: ``--config FILE`` (TOML/YAML) for ``run`` and ``sweep``
- ``sweep.py``: ``sweep``; ``tune.py``: ``tune``; ``leaderboard.py``: ``leaderboard``
- ``pretrain.py``: ``pretrain``; ``reference.py``: ``reference`` (the reference leaderboards)
- ``options.py``: dataclass → click options; one ``Error:`` line and exit code 2 for bad input
- ``controls.py``: the options that steer a command (``--quiet``, ``--jobs``, ...), declared once
- ``help.py``: help that fits on a screen (titled sections; an algorithm's options for ``--algo``)
- plugin commands (e.g. FedSDG's ``gates``) come from the ``pflbench.commands`` entry points.

Nothing here imports torch at module level: ``pflbench --help`` and ``pflbench list`` stay fast.
"""

from __future__ import annotations

import gc
import sys
from importlib.metadata import entry_points

import click

from pflbench.cli.leaderboard import leaderboard_command
from pflbench.cli.listing import list_command
from pflbench.cli.options import PflbenchGroup
from pflbench.cli.partition import partition_command
from pflbench.cli.pretrain import pretrain_command
from pflbench.cli.reference import reference_command
from pflbench.cli.rerun import rerun_command
from pflbench.cli.run import run_command
from pflbench.cli.sweep import sweep_command
from pflbench.cli.tune import tune_command


@click.group(cls=PflbenchGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="pflbench")
def cli() -> None:
    """pflbench — personalized federated learning benchmarks."""


for command in (
    run_command,
    rerun_command,
    list_command,
    partition_command,
    sweep_command,
    tune_command,
    leaderboard_command,
    pretrain_command,
    reference_command,
):
    cli.add_command(command)


def add_plugin_commands(group: click.Group) -> None:
    """Commands contributed through the ``pflbench.commands`` entry-point group."""
    for entry_point in entry_points(group="pflbench.commands"):
        if entry_point.name in group.commands:
            continue
        try:
            group.add_command(entry_point.load(), entry_point.name)
        except Exception as error:  # a broken plugin must not break the other commands
            print(f"warning: could not load command plugin {entry_point.value!r}: {error}", file=sys.stderr)


add_plugin_commands(cli)


def main() -> None:
    try:
        cli()
    finally:
        # the interpreter's final garbage collections walk torch's (and Ray's) many objects: ~0.7 s
        # at every exit; frozen, they are left to the process's end (all results are written by now)
        gc.freeze()


if __name__ == "__main__":
    main()
