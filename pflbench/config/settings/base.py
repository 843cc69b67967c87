"""What a setting group is: a frozen dataclass that owns a part of ``RunConfig``.

A group declares its options (``option``: name, type, default and help, the one place each is
written), checks its values (``validate``) and what a run can serve of them once the algorithm,
the number of clients, the data or the built upload is known (``check_run``), says what it
contributes to a run's identity (``identity``) and which of its settings a given run does not
read (``inert``). ``RunConfig`` takes each field's declaration from its group (``declared``),
and validation, the run's checks, identity and the refusal of inert options are loops over the
groups (``config.settings.GROUPS``).
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from pflbench.errors import ConfigError

G = TypeVar("G", bound="SettingGroup")
Check = tuple[bool, str]  # (the value is valid, the ConfigError line when it is not)


def option(default: Any, help: str, **metadata: Any) -> Any:
    """A dataclass field with a default and the help text the CLI shows."""
    if isinstance(default, (list, dict)):
        raise TypeError("use a tuple for sequence defaults")
    return field(default=default, metadata={"help": help, **metadata})


def finite(value: Any) -> bool:
    """A real number (not a bool's stand-in for one) that is neither inf nor nan."""
    return isinstance(value, (int, float)) and math.isfinite(value)


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def refuse_first(checks: list[Check]) -> None:
    """ConfigError with the message of the first failed check."""
    for ok, message in checks:
        if not ok:
            raise ConfigError(message)


def check_choice(name: str, value: Any, valid: tuple[str, ...]) -> None:
    if value not in valid:
        raise ConfigError(f"{flag(name)} {value!r} is not one of: {', '.join(valid)}")


@dataclass(frozen=True)
class RunReads:
    """What a group needs to know of a resolved run besides its own settings: the whole config
    (for settings one group's reading depends on, e.g. ``--backbone`` on ``--public-frac``), the
    algorithm class and its hyperparameters, and the LoRA rank the algorithm builds (None: none)."""

    config: Any
    algorithm: Any
    hyperparameters: Any
    lora_rank: int | None

    @property
    def uses_lora(self) -> bool:
        return self.lora_rank is not None

    @property
    def uses_head_layers(self) -> bool:
        """Whether the run has a private head (fedper, fedrep, ... and every LoRA run)."""
        return bool(getattr(self.algorithm, "uses_head_layers", False)) or self.uses_lora


@dataclass(frozen=True)
class AlgorithmFacts:
    """What the checks read of the algorithm class (known at planning): why it cannot serve
    each run feature that needs a capability (``engine.capabilities.refusal``, by feature name;
    None: served), whether it has a global model and whether it uploads nothing (Local)."""

    refusals: Mapping[str, str | None]
    has_global_model: bool
    uploads_nothing: bool


@dataclass(frozen=True)
class ClientCounts:
    """K_train (the clients that train) and M (the clients sampled per round), once K is known."""

    num_training: int
    sampled_per_round: int


@dataclass(frozen=True)
class DataFacts:
    """What the checks read of the loaded dataset (its name: ``--dataset``)."""

    name: str
    is_image: bool
    input_shape: tuple[int, ...]
    num_classes: int


@dataclass(frozen=True)
class UploadFacts:
    """What the checks read of the built algorithm's upload: whether it uploads anything, the
    uploaded tensors that are not trained (buffers: BatchNorm's running statistics) and the
    BatchNorm layers of its model."""

    uploads: bool
    buffers: tuple[str, ...]
    batch_norms: tuple[str, ...]


@dataclass(frozen=True)
class RunFacts:
    """What a run's checks read besides its settings (``SettingGroup.check_run``). A run learns
    each part once, at a stage of its preparation (``runs.prepare``): the algorithm when it is
    planned, the client counts when K is known (planned or fitted), the data when it is loaded,
    the upload when the algorithm is built. Each check reads one part and runs when that part
    is given, so it runs once."""

    algorithm: AlgorithmFacts | None = None
    clients: ClientCounts | None = None
    data: DataFacts | None = None
    upload: UploadFacts | None = None


class SettingGroup:
    """Base of the setting groups (each a frozen dataclass whose fields are ``RunConfig``'s).

    ``omitted_at_default``: settings a run's identity leaves out while they are at their
    default (added after runs were recorded, so those runs keep their folders)."""

    title: ClassVar[str] = ""
    # the ``--help`` section that lists its options (``cli.help``): its title, unless it shares
    # one with related groups (attacks and robust aggregation, ...)
    section: ClassVar[str] = ""
    omitted_at_default: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def of(cls: type[G], config: Any) -> G:
        """This group's settings of ``config`` (any object with the fields as attributes)."""
        return cls(**{f.name: getattr(config, f.name) for f in dataclasses.fields(cls)})  # type: ignore[arg-type]

    @classmethod
    def field_of(cls, name: str) -> dataclasses.Field[Any]:
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            if f.name == name:
                return f
        raise KeyError(f"{cls.__name__} declares no setting {name!r}")

    @classmethod
    def default(cls, name: str) -> Any:
        """The declared default of ``name`` (for the engine-side views that restate it)."""
        return cls.field_of(name).default

    def validate(self, config: Any) -> None:
        """ConfigError naming the first bad value (``config``: the whole, resolved run config,
        for the checks that span groups)."""

    def check_run(self, config: Any, run: RunFacts) -> None:
        """ConfigError naming the first value this run cannot serve, for the checks that need
        what only the run knows (``run``: the algorithm, K, the data, the built upload; each
        part checked when it is given, ``RunFacts``)."""

    def identity(self, run: RunReads) -> dict[str, Any]:
        """The settings of this group the run reads: its share of the run identity."""
        return {}

    def inert(self, run: RunReads) -> dict[str, str]:
        """The settings of this group the run does not read, each with why."""
        return {}


def declared() -> Any:
    """The default of a ``RunConfig`` field: the declaration of its group (``composed_of``)."""
    return _DECLARED


_DECLARED = object()


def composed_of(*groups: type[SettingGroup]) -> Callable[[type], type]:
    """Class decorator (under ``@dataclass``): give each field of the class its group's
    declaration (default, help, choices; ``metadata["group"]``: the group's title) and check
    that every field belongs to exactly one group, with the same type, and that every group's
    setting is a field."""

    def compose(cls: type) -> type:
        owners: dict[str, tuple[type[SettingGroup], dataclasses.Field[Any]]] = {}
        for group in groups:
            for f in dataclasses.fields(group):  # type: ignore[arg-type]
                if f.name in owners:
                    raise TypeError(f"{f.name} is declared by {owners[f.name][0].__name__} and {group.__name__}")
                owners[f.name] = (group, f)
        annotations = inspect.get_annotations(cls)  # the class's own (strings: postponed evaluation)
        missing = sorted(set(owners) - set(annotations))
        if missing:
            raise TypeError(f"{cls.__name__} lacks the group settings {', '.join(missing)}")
        for name, annotation in annotations.items():
            if name not in owners:
                raise TypeError(f"{cls.__name__}.{name} belongs to no setting group")
            group, f = owners[name]
            if annotation != f.type:
                raise TypeError(f"{cls.__name__}.{name}: {annotation} but {group.__name__} declares {f.type}")
            if cls.__dict__.get(name) is not _DECLARED:
                raise TypeError(f"{cls.__name__}.{name}: take its default from {group.__name__} (= declared())")
            setattr(cls, name, field(default=f.default, metadata={**f.metadata, "group": group.title}))
        return cls

    return compose
