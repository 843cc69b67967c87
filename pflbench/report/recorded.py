"""Whether a run folder's ``config.json`` records each setting with its type.

The runner writes every ``RunConfig`` setting with its type; a received folder whose
``config.json`` says ``"alpha": "abc"`` or ``"rounds": 2.7`` was damaged or edited by hand. The
table is keyed by ``config.json``'s ``identity`` (the settings the run read), so such a value
would otherwise go unnoticed: the leaderboard skips the folder, naming the key
(``check_recorded_types``, passed to ``store.reader.load_runs`` as its ``check``). The rules are
the ones a config file's values obey (``config.value_types``; rerun checks the same).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pflbench.config.run_config import RunConfig, field_types
from pflbench.config.value_types import type_error
from pflbench.store.reader import flat_config


def check_recorded_types(config: dict[str, Any]) -> None:
    """ValueError naming the first ``RunConfig`` setting of ``config`` (a parsed config.json,
    grouped settings lifted) whose value does not have the setting's type."""
    flat = flat_config(config)
    hints = field_types(RunConfig)
    for f in dataclasses.fields(RunConfig):
        if f.name in flat:
            problem = type_error(flat[f.name], hints[f.name])
            if problem:
                raise ValueError(f"config.json: {f.name!r} {problem}")
