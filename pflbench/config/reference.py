"""A reference benchmark's scenario (``results/reference/<name>/scenario.toml``): the settings every
run shares and the protocol every algorithm gets, as data. Torch-free: ``pflbench reference``
runs it (``sweeps.reference``), ``pflbench leaderboard --reference`` checks runs against it
(``report.reference``).

The file has three parts::

    name = "fmnist-dir0.1"
    [run]        # RunConfig options shared by every run (dataset and alpha included)
    dataset = "fashion_mnist"
    alpha = 0.1
    ...
    [protocol]   # the same budget for every algorithm
    algos = "non-lora"        # every registered algorithm that trains no LoRA adapters, or a list
    seeds = [0, 1, 2]         # the default and the tuned setting, each over these seeds
    trials = 8                # pflbench tune trials per algorithm, on the first seed
    tune_rounds = 30          # rounds of a tuning trial (the final runs use run.rounds)
    objective = "val_pers_acc_last10"
    sampler = "tpe"
    sampler_seed = 0
    pruner = "median"
    target = "pers_acc=0.8"   # rounds and MB to this target in the tables
    default_trial = true      # each study's first trial is the algorithm's default setting
    [algo_options.fedavg]     # optional: what makes an algorithm the scenario's variant of it,
    lora_rank = 8             # in both of its rows (FedAvg+LoRA); run options or hyperparameters

The search space is each algorithm's own ``search_space`` (``config.space``): the learning rate
on a log range around its resolved default for every algorithm, plus the hyperparameters its
docstring says the paper tuned. One rule, the same trial count, selection on validation.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pflbench.config.run_config import RunConfig
from pflbench.errors import ConfigError
from pflbench.util.hashing import settings_hash

SCENARIO_FILE = "scenario.toml"
ALGOS_NON_LORA = "non-lora"
SETTINGS = ("default", "tuned")  # the two rows per algorithm
GRID_KEYS = ("dataset", "alpha")  # run settings that are sweep grid fields, not shared options
PROTOCOL_KEYS = (
    "algos",
    "exclude",
    "seeds",
    "trials",
    "tune_rounds",
    "objective",
    "sampler",
    "sampler_seed",
    "pruner",
    "target",
    "default_trial",
)
# The settings a run's identity (config.json → identity) must share with the reference's runs to
# be compared with them: the data, its split and partition, the model, the schedule. Learning
# rate, optimizer and hyperparameters are the algorithm's (tuned or default), so not among them.
SCENARIO_IDENTITY_KEYS = (
    "dataset",
    "dataset_options",
    "partition",
    "partition_file",
    "num_clients",
    "test_frac",
    "val_frac",
    "public_frac",
    "alpha",
    "shards_per_client",
    "min_size",
    "dirichlet_cut",
    "sizes",
    "size_param",
    "feature_shift",
    "shift_groups",
    "model",
    "model_options",
    "rounds",
    "frac",
    "eval_every",
    "batch_size",
    "local_epochs",
    "new_clients",
    "precision",
    "pretrained",
    "weights",
    "backbone",
    "pretrain_epochs",
    "pretrain_lr",
)


@dataclass(frozen=True)
class Protocol:
    """The budget and rules every algorithm of a scenario gets."""

    algos: tuple[str, ...] | str = ALGOS_NON_LORA
    exclude: tuple[str, ...] = ()
    seeds: tuple[int, ...] = (0, 1, 2)
    trials: int = 8
    tune_rounds: int | None = None  # None: the final runs' rounds
    objective: str = "val_pers_acc_last10"
    sampler: str = "tpe"
    sampler_seed: int = 0
    pruner: str = "median"
    target: str | None = None
    default_trial: bool = False  # the first trial of every study is the algorithm's default setting

    def to_json(self) -> dict[str, Any]:
        return {
            k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items() if k != "algos"
        } | {"algos": self.algos if isinstance(self.algos, str) else list(self.algos)}

    def budget(self) -> dict[str, Any]:
        """What makes two algorithms' numbers comparable: everything but the algorithm list."""
        return {k: v for k, v in self.to_json().items() if k not in ("algos", "exclude")}


@dataclass(frozen=True)
class Scenario:
    name: str
    run: dict[str, Any]  # RunConfig options, dataset and alpha included
    protocol: Protocol
    path: Path | None = None
    algo_options: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)

    @property
    def dataset(self) -> str:
        return str(self.run.get("dataset", RunConfig.dataset))

    @property
    def alpha(self) -> float:
        return float(self.run.get("alpha", RunConfig.alpha))

    def shared(self) -> dict[str, Any]:
        """The run options besides the grid fields (dataset, alpha)."""
        return {k: v for k, v in self.run.items() if k not in GRID_KEYS}

    def identity(self) -> str:
        """A hash of the scenario's settings and protocol (the algorithm list aside)."""
        return settings_hash(
            {"run": self.run, "protocol": self.protocol.budget(), "algo_options": self.algo_options}, 12
        )


def _tuple(value: Any, kind: type, key: str, empty: bool = False) -> tuple[Any, ...]:
    values = value if isinstance(value, list) else [value]
    if (not values and not empty) or not all(isinstance(v, kind) and not isinstance(v, bool) for v in values):
        raise ConfigError(f"[protocol] {key} must be a non-empty list of {kind.__name__}, got {value!r}")
    return tuple(values)


def _run_options(table: Any, where: str) -> dict[str, Any]:
    if not isinstance(table, dict):
        raise ConfigError(f"{where} must be a table of run options")
    fields = {f.name for f in dataclasses.fields(RunConfig)}
    options = {}
    for key, value in table.items():
        name = key.replace("-", "_")
        if name not in fields:
            raise ConfigError(f"{where}: {key!r} is not a run option (see pflbench run --help)")
        if name in ("algo", "seed", "out"):
            raise ConfigError(f"{where}: {key} is set by the reference command, not by the scenario")
        options[name] = tuple(value) if isinstance(value, list) else value
    return options


def parse_scenario(data: dict[str, Any], name: str, path: Path | None = None) -> Scenario:
    """A scenario from its TOML table (``name`` when the file does not say one)."""
    unknown = sorted(set(data) - {"name", "description", "run", "protocol", "algo_options"})
    if unknown:
        raise ConfigError(
            f"scenario {name}: unknown key {unknown[0]!r}; keys: name, description, run, protocol, algo_options"
        )
    name = str(data.get("name", name))
    run = _run_options(data.get("run", {}), f"scenario {name} [run]")
    table = data.get("protocol", {})
    if not isinstance(table, dict):
        raise ConfigError(f"scenario {name}: [protocol] must be a table")
    bad = sorted(set(table) - set(PROTOCOL_KEYS))
    if bad:
        raise ConfigError(f"scenario {name} [protocol]: unknown key {bad[0]!r}; keys: {', '.join(PROTOCOL_KEYS)}")
    values: dict[str, Any] = dict(table)
    algos = values.get("algos", ALGOS_NON_LORA)
    if isinstance(algos, str):
        if algos != ALGOS_NON_LORA:
            raise ConfigError(
                f"scenario {name} [protocol] algos: {algos!r}; give {ALGOS_NON_LORA!r} or a list of names"
            )
    else:
        values["algos"] = _tuple(algos, str, "algos")
    if "exclude" in values:
        values["exclude"] = _tuple(values["exclude"], str, "exclude", empty=True)
    if "seeds" in values:
        values["seeds"] = _tuple(values["seeds"], int, "seeds")
    for key in ("trials", "tune_rounds", "sampler_seed"):
        if key in values and (not isinstance(values[key], int) or isinstance(values[key], bool) or values[key] < 0):
            raise ConfigError(f"scenario {name} [protocol] {key} must be an integer ≥ 0, got {values[key]!r}")
    if values.get("trials", 1) < 1 or values.get("tune_rounds", 1) < 1:
        raise ConfigError(f"scenario {name} [protocol]: trials and tune_rounds must be ≥ 1")
    if "default_trial" in values and not isinstance(values["default_trial"], bool):
        raise ConfigError(
            f"scenario {name} [protocol] default_trial must be true or false, got {values['default_trial']!r}"
        )
    for key in ("objective", "sampler", "pruner", "target"):
        if key in values and not isinstance(values[key], str):
            raise ConfigError(f"scenario {name} [protocol] {key} must be a string, got {values[key]!r}")
    variants = data.get("algo_options", {})
    if not isinstance(variants, dict) or not all(isinstance(v, dict) for v in variants.values()):
        raise ConfigError(f"scenario {name}: [algo_options.NAME] tables of options per algorithm")
    algo_options = {
        algo: {k.replace("-", "_"): tuple(v) if isinstance(v, list) else v for k, v in table.items()}
        for algo, table in variants.items()
    }
    return Scenario(name, run, Protocol(**values), path, algo_options)


def read_scenario(path: str | Path) -> Scenario:
    """The scenario of ``path``: a ``scenario.toml`` file or the folder holding one."""
    path = Path(path)
    file = path / SCENARIO_FILE if path.is_dir() else path
    if not file.is_file():
        raise ConfigError(f"{path} holds no {SCENARIO_FILE} (a reference scenario folder has one)")
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        try:
            import tomli as tomllib  # type: ignore[no-redef]
        except ModuleNotFoundError:
            raise ConfigError(f"reading {file} on Python 3.10 needs tomli (pip install tomli)") from None
    try:
        data = tomllib.loads(file.read_text())
    except (OSError, UnicodeDecodeError, RecursionError, tomllib.TOMLDecodeError) as error:
        raise ConfigError(f"cannot read scenario {file}: {error}") from None
    return parse_scenario(data, file.parent.name, file)


def scenario_folders(root: str | Path) -> list[Path]:
    """The scenario folders under ``root`` (each holds a scenario.toml), by name."""
    root = Path(root)
    if (root / SCENARIO_FILE).is_file():
        return [root]
    return sorted(p.parent for p in root.glob(f"*/{SCENARIO_FILE}"))


def scenario_settings(identity: dict[str, Any]) -> dict[str, Any]:
    """A run identity's share that a scenario fixes (``SCENARIO_IDENTITY_KEYS``; absent: None)."""
    return {key: identity.get(key) for key in SCENARIO_IDENTITY_KEYS}
