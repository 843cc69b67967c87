"""``--log wandb``: Weights & Biases, offline unless asked (``pip install 'pflbench[wandb]'``).

pflbench makes no network call unless asked: the run is written in W&B's offline mode to
``RUN_DIR/wandb/offline-run-<time>-<id>/`` (upload it later with ``wandb sync RUN_DIR/wandb/offline-run-*``;
read it locally with ``wandb leet inspect --summary --json RUN_DIR/wandb``). ``WANDB_MODE=online``
logs to the W&B server instead (``wandb login`` first); ``WANDB_MODE=disabled`` logs nothing.
The project is ``$WANDB_PROJECT`` (default ``pflbench``), the entity ``$WANDB_ENTITY`` (W&B's own
default otherwise), the run's display name the run folder's name.

Logged: the config (every ``RunConfig`` setting + ``algo_hparams``, nested) at start; every
finite number of each round record at step = round; the summary's numbers as the W&B run summary
(the runs table). Console capture, system metrics, git and code saving are off.

**Resume.** The W&B run id is kept in ``RUN_DIR/trackers.json``, and a resumed run initialises
the same id with ``resume="allow"``. Offline, the killed attempt's ``offline-run-*`` folder is
deleted and the new one replays the earlier rounds, so ``RUN_DIR/wandb`` holds one offline run
with every round once. Online, W&B continues the server's run at its next step and pflbench skips
the rounds it already holds. Under ``--portable`` the host name is not recorded and W&B's debug
logs (local paths) are deleted when the run ends.
"""

from __future__ import annotations

import os
import secrets
import shutil
import string
from pathlib import Path
from typing import Any

from pflbench.errors import ConfigError
from pflbench.runs.trackers import EXPERIMENT, TrackedRun, Tracker, numeric_items, register_tracker

WANDB_DIR = "wandb"  # RUN_DIR/wandb: what wandb.init(dir=RUN_DIR) writes
MODES = ("offline", "online", "disabled")


def new_run_id() -> str:
    """A W&B-style run id: 8 random lower-case letters and digits."""
    alphabet = string.ascii_lowercase + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(8))


def wandb_mode() -> str:
    """``$WANDB_MODE`` (offline, online or disabled), offline when unset."""
    mode = (os.environ.get("WANDB_MODE") or "offline").strip().lower()
    if mode not in MODES:
        raise ConfigError(f"WANDB_MODE={mode!r} is not a W&B mode for --log wandb; choose from {', '.join(MODES)}")
    return mode


def config_of(run: TrackedRun) -> dict[str, Any]:
    """The W&B config: the run's settings, its algorithm's hyperparameters under ``algo_hparams``."""
    import dataclasses

    def fields(value: Any) -> dict[str, Any]:
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return dataclasses.asdict(value)
        return dict(vars(value))

    config = fields(run.config)
    if run.hparams is not None:
        config["algo_hparams"] = fields(run.hparams)
    return dict(run.local(config))


@register_tracker("wandb")
class WandbTracker(Tracker):
    """Weights & Biases: offline run in RUN_DIR/wandb/ (wandb sync uploads it); WANDB_MODE=online logs live."""

    requires = ("wandb",)
    install = "pip install 'pflbench[wandb]'"

    @classmethod
    def check(cls) -> None:
        wandb_mode()

    def __init__(self, run: TrackedRun) -> None:
        super().__init__(run)
        self.mode: Any = wandb_mode()  # one of MODES
        self.wandb_run: Any = None
        self.first_step = 0  # rounds below it are already in the W&B run (an online resume)
        self.closed = False

    def _settings(self) -> Any:
        import wandb

        wanted: dict[str, Any] = {
            "silent": True,  # pflbench prints its own progress
            "console": "off",
            "disable_git": True,
            "disable_code": True,
            "save_code": False,
            "x_disable_stats": True,  # no system-metrics sampling thread
            "x_save_requirements": False,
        }
        if self.run.portable:
            wanted["host"] = "<local>"
            wanted["x_disable_meta"] = True
        known = getattr(wandb.Settings, "model_fields", None)
        if known is not None:  # settings this wandb version has (private ones come and go)
            wanted = {k: v for k, v in wanted.items() if k in known}
        return wandb.Settings(**wanted)

    def start(self) -> None:
        import wandb

        recorded = self.run.recall("wandb") if self.run.resumed else None
        run_id = recorded.get("id") if isinstance(recorded, dict) else None
        if not isinstance(run_id, str):
            run_id = new_run_id()
            self.run.remember("wandb", {"id": run_id})
        elif self.mode == "offline":  # the killed attempt's offline folder: replaced by a whole one
            for stale in (Path(self.run.folder) / WANDB_DIR).glob(f"offline-run-*-{run_id}"):
                shutil.rmtree(stale, ignore_errors=True)
        try:
            self.wandb_run = wandb.init(
                project=os.environ.get("WANDB_PROJECT") or EXPERIMENT,
                name=self.run.name,
                id=run_id,
                resume="allow",
                dir=str(self.run.folder),
                mode=self.mode,
                config=config_of(self.run),
                settings=self._settings(),
                reinit="create_new",  # never finish another W&B run of this process
            )
        except Exception as error:  # no login for online mode, a bad entity, ...
            first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise ConfigError(f"--log wandb: {first}") from error
        if self.mode == "online":
            self.first_step = int(getattr(self.wandb_run, "step", 0) or 0)

    def log_round(self, record: dict[str, Any]) -> None:
        step = int(record["round"])
        if step < self.first_step:  # W&B holds it already (and drops steps below its current one)
            return
        self.wandb_run.log(numeric_items(record, skip=("round",)), step=step)

    def finish(self, summary: dict[str, Any]) -> None:
        self.wandb_run.summary.update(numeric_items(summary))

    def close(self, failed: bool = False) -> None:
        if self.closed or self.wandb_run is None:
            self.closed = True
            return
        self.closed = True
        self.wandb_run.finish(exit_code=1 if failed else 0)
        if self.run.portable:
            remove_debug_logs(Path(self.run.folder) / WANDB_DIR)


def remove_debug_logs(folder: Path) -> None:
    """W&B's debug logs and links (local paths, the host's cache folder): not part of a shared run;
    ``wandb sync`` needs only the ``.wandb`` file and ``files/``."""
    for path in [*folder.glob("debug*.log"), folder / "latest-run", *folder.glob("*/logs")]:
        if path.is_symlink() or path.is_file():
            path.unlink()
        elif path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
