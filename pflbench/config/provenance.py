"""What code computed a run (``config.json`` → ``code``), and the code identity that tells a
finished result made by today's code from a stale one.

A run's folder name hashes its *settings* (``config.identity``); the code that computed it is
recorded beside them and compared, never keyed on: the same settings always land in the same
folder, so a result of changed code is replaced in place (through the run folders' claim and
publish protocol) instead of living on beside the new one, where a leaderboard would count both.

``code`` holds
- ``pflbench``: the version; ``git``: ``{"commit", "dirty"}`` when pflbench runs from a git
  checkout (else null);
- ``plugins``: for each plugin the run uses (``algorithm``, ``dataset``, ``partitioner``,
  ``model``) its name and the modules that define it — the registering module and those of the
  classes it builds on (a plugin subclassing ``pflbench.algorithms.fedavg.FedAvg`` lists both) —
  each with the sha256 of its file: a ``--plugin`` file by its absolute path, a built-in module by
  its path inside the package, a module of another distribution with that distribution's name and
  version; a timm model by timm's version;
- ``plugin_files``: every ``--plugin`` file the run was given (absolute path, sha256, and where
  the run folder keeps a copy of its source);
- ``identity``: ``code_identity`` of the version and the plugins' module hashes.

The git commit is recorded but is not part of the identity: a commit that changes nothing a run
uses (documentation, another algorithm) must not make every result stale. pflbench's core
(engine, data, models) is identified by its version; its built-in plugins by their files' hashes.
"""

from __future__ import annotations

import functools
import hashlib
import subprocess
import sys
from collections.abc import Mapping
from importlib.metadata import PackageNotFoundError, packages_distributions, version
from pathlib import Path
from typing import Any

from pflbench._version import __version__
from pflbench.config.run_config import RunConfig
from pflbench.registry import (
    ALGORITHMS,
    DATASETS,
    MODELS,
    PARTITIONERS,
    entry_point_distribution,
    plugin_file_of_module,
)
from pflbench.util.hashing import settings_hash

CODE_IDENTITY_LENGTH = 16
PACKAGE_DIR = Path(__file__).resolve().parents[1]  # .../pflbench
BUILTIN_PLUGIN_PACKAGES = ("pflbench.algorithms.", "pflbench.datasets.")
GIT_TIMEOUT_S = 2.0
LOCAL_KEYS = ("plugin_file", "file")  # where a source lies on this machine: not what it is


def git_state() -> dict[str, Any] | None:
    """``{"commit", "dirty"}`` of the git checkout pflbench runs from (tracked files changed =
    dirty), else None: an installed pflbench, no git, a git that fails or takes too long."""
    checkout = PACKAGE_DIR.parent
    if not (checkout / ".git").exists():  # an install inside some other repository is not a checkout
        return None
    command = ["git", "--no-optional-locks", "status", "--porcelain=v2", "--branch", "--untracked-files=no"]
    try:
        done = subprocess.run(command, cwd=checkout, capture_output=True, text=True, timeout=GIT_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return None
    commit, dirty = None, False
    for line in done.stdout.splitlines():
        if line.startswith("# branch.oid "):
            commit = line.split()[-1]
        elif line and not line.startswith("#"):
            dirty = True
    if commit is None or not commit.isalnum():  # "(initial)": no commit yet
        return None
    return {"commit": commit, "dirty": dirty}


@functools.cache
def _file_sha256(path: str) -> str | None:
    """sha256 of a module's file, read once per process (the module is imported once, too)."""
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None


@functools.cache
def _distributions() -> Mapping[str, list[str]]:
    return packages_distributions()


def _distribution_of(module: str) -> tuple[str, str | None] | None:
    found = entry_point_distribution(module)
    if found is not None:
        return found
    names = _distributions().get(module.split(".")[0])
    if not names:
        return None
    try:
        return names[0], version(names[0])
    except PackageNotFoundError:
        return names[0], None


def module_source(module: str) -> dict[str, Any]:
    """What module ``module`` is: a ``--plugin`` file, a built-in module, or a module of a
    distribution (or of none), with the sha256 of its file."""
    plugin = plugin_file_of_module(module)
    if plugin is not None:
        return {"plugin_file": plugin.recorded_as, "sha256": plugin.sha256}
    file = getattr(sys.modules.get(module), "__file__", None)
    digest = _file_sha256(file) if file else None
    if module == "pflbench" or module.startswith("pflbench."):
        entry: dict[str, Any] = {"module": module}
        if file:
            try:
                entry["file"] = Path(file).resolve().relative_to(PACKAGE_DIR.parent).as_posix()
            except ValueError:
                pass
        return {**entry, "sha256": digest}
    entry = {"module": module}
    distribution = _distribution_of(module)
    if distribution is not None:
        entry.update(distribution=distribution[0], version=distribution[1])
    return {**entry, "sha256": digest}


def _builds_on(module: str, home: str) -> bool:
    """Whether a base class from ``module`` is part of a plugin defined in ``home``: another
    ``--plugin`` file, a built-in plugin module, or a module of the plugin's own package. The
    core (``pflbench.engine`` ...) is identified by the version; torch, typing, ... are not code
    of the plugin."""
    if plugin_file_of_module(module) is not None or module.startswith(BUILTIN_PLUGIN_PACKAGES):
        return True
    if module == "pflbench" or module.startswith("pflbench."):
        return False
    return module.split(".")[0] == home.split(".")[0]


def defining_modules(plugin: Any) -> list[str]:
    """The modules that define a registered plugin: its own, then (for a class, its client
    program and its hyperparameters) those of the classes it builds on."""
    home = plugin.__module__
    modules = [home]
    if isinstance(plugin, type):
        for cls in (plugin, getattr(plugin, "program_class", None), getattr(plugin, "hyperparameters", None)):
            for base in cls.__mro__ if isinstance(cls, type) else ():
                if base.__module__ not in modules and _builds_on(base.__module__, home):
                    modules.append(base.__module__)
    return modules


def run_plugins(config: RunConfig) -> dict[str, dict[str, Any]]:
    """Each plugin a (resolved) run uses, by role: its name and its modules (``module_source``)."""
    roles: dict[str, tuple[str, Any]] = {
        "algorithm": (config.algo, ALGORITHMS.get(config.algo)),
        "dataset": (config.dataset, DATASETS.get(config.dataset)),
    }
    if config.partition_file is None:  # a partition file is data, recorded in the settings
        roles["partitioner"] = (config.partition, PARTITIONERS.get(config.partition))
    plugins = {
        role: {"name": name, "sources": [module_source(m) for m in defining_modules(obj)]}
        for role, (name, obj) in roles.items()
    }
    if config.model is not None:
        if config.model in MODELS.items:
            model = MODELS.get(config.model)
            plugins["model"] = {"name": config.model, "sources": [module_source(m) for m in defining_modules(model)]}
        else:  # a timm model, built by timm's code
            try:
                timm_version: str | None = version("timm")
            except PackageNotFoundError:
                timm_version = None
            plugins["model"] = {"name": config.model, "sources": [{"distribution": "timm", "version": timm_version}]}
    return plugins


def code_identity(plugins: dict[str, dict[str, Any]], pflbench_version: str = __version__) -> str:
    """A hash of pflbench's version and what each plugin's modules are (content hashes,
    distribution versions), not where they lie: a plugin file moved unchanged is the same code."""
    parts = {
        role: {
            "name": plugin.get("name"),
            "sources": [{k: v for k, v in s.items() if k not in LOCAL_KEYS} for s in plugin.get("sources", [])],
        }
        for role, plugin in plugins.items()
    }
    return settings_hash({"pflbench": pflbench_version, "plugins": parts}, CODE_IDENTITY_LENGTH)


def current_code_identity(config: RunConfig) -> str:
    """The code identity a (resolved) run would record now."""
    return code_identity(run_plugins(config))


def code_record(config: RunConfig, plugin_files: list[dict[str, Any]]) -> dict[str, Any]:
    """``config.json``'s ``code`` block (see the module docstring)."""
    plugins = run_plugins(config)
    return {
        "identity": code_identity(plugins),
        "pflbench": __version__,
        "git": git_state(),
        "plugins": plugins,
        "plugin_files": plugin_files,
    }


def recorded_code_identity(config: dict[str, Any]) -> str | None:
    """The code identity a ``config.json`` records, None for a run recorded before code records."""
    code = config.get("code")
    identity = code.get("identity") if isinstance(code, dict) else None
    return identity if isinstance(identity, str) else None


def _source_name(source: dict[str, Any]) -> str:
    if "plugin_file" in source:
        return Path(str(source["plugin_file"])).name
    return str(source.get("file") or source.get("module") or source.get("distribution"))


def _short(digest: Any) -> str:
    return str(digest)[:8] if digest else "?"


def code_changes(old: dict[str, Any] | None, new: dict[str, Any]) -> list[str]:
    """What differs between two ``code`` blocks, one phrase each (``[]``: the same code).
    A plugin file is matched by its file name, a module by its name."""
    if not isinstance(old, dict) or "identity" not in old:
        return ["the run was recorded before pflbench recorded code"]
    if old.get("identity") == new.get("identity"):
        return []
    changes = []
    if old.get("pflbench") != new.get("pflbench"):
        changes.append(f"pflbench {old.get('pflbench')} → {new.get('pflbench')}")
    old_plugins, new_plugins = old.get("plugins") or {}, new.get("plugins") or {}
    for role in sorted(set(old_plugins) | set(new_plugins)):
        before, after = old_plugins.get(role) or {}, new_plugins.get(role) or {}
        label = f"{role} {after.get('name') or before.get('name')}"
        if not before or not after:
            changes.append(f"{label} {'added' if after else 'no longer used'}")
            continue
        if before.get("name") != after.get("name"):
            changes.append(f"{role}: {before.get('name')} → {after.get('name')}")
            continue
        sources_before = {_source_name(s): s for s in before.get("sources", [])}
        for name, source in ((_source_name(s), s) for s in after.get("sources", [])):
            earlier = sources_before.pop(name, None)
            if earlier is None:
                changes.append(f"{label}: {name} added")
            elif earlier.get("sha256") != source.get("sha256"):
                changes.append(
                    f"{label}: {name} changed (sha256 {_short(earlier.get('sha256'))} → {_short(source.get('sha256'))})"
                )
            elif earlier.get("version") != source.get("version"):
                changes.append(f"{label}: {name} {earlier.get('version')} → {source.get('version')}")
        changes += [f"{label}: {name} no longer used" for name in sources_before]
    return changes or ["code identity differs"]
