"""What an algorithm can do, declared as data on its classes, and the one place that reads it.

The engine never looks at which hooks a class overrides: each class states what its code does.

- ``Algorithm.capabilities`` (``Capabilities``): the server side — whether every client receives
  the global state, whether the update rule is the FedAvg average, whether ``round_diagnostics``
  reads the uploaded tensors, whether the personal model is the received one.
- ``ClientProgram.capabilities`` (``ProgramCapabilities``): the client side — whether the local
  update is the engine's batch loop and whether the upload is the shared model tensors.

Each run feature that needs some of them is served or refused by ``refusal`` (the reason is one
line, the same words the planning checks always printed):

========================  ======================================================================
feature                   needs
========================  ======================================================================
``averaged-upload``       ``--dp client``, model-poisoning ``--attack``, ``--robust-agg``: every
                          client receives the same model and uploads its model tensors, trained
                          by the batch loop, and the server averages them (FedAvg) — or the
                          class vouches for it (``averaged_upload=True``)
``dp-sample``             ``--dp sample``: the batch loop (where DP-SGD clips) and model uploads
``batch-loop``            ``--executor vmap``, ``--deadline-policy partial``: the batch loop
``streaming``             the FedAvg rule folded in upload by upload (``streaming_aggregate``'s
                          default): the FedAvg average and diagnostics that read no uploads
``shared-evaluation``     one evaluation pass for every client (``clients_share_one_model``):
                          the personal model is the received one and every client receives
                          the same model (a per-client ``broadcast``, e.g. FedCAC's, is not
                          the global model: each client is evaluated with its own)
========================  ======================================================================

**Safe defaults: capabilities are not inherited.** A capability is a promise about a class's
own code, and a subclass's new code can break it (a FedAvg subclass that overrides ``aggregate``
must not keep FedAvg's streaming average, which would bypass it). So a class whose own body
does not assign ``capabilities`` gets ``UNDECLARED`` (nothing: no DP, attacks, robust rules, vmap
or partial work, no streaming, one evaluation per client), and every refusal says so. A subclass
that keeps its parent's behaviour restates it in one line (``capabilities =
FedAvg.capabilities``). The rule, hook by hook: if you override

- ``broadcast``, declare ``same_broadcast=False``;
- ``aggregate`` or ``streaming_aggregate``, declare ``fedavg_aggregate=False``;
- ``round_diagnostics`` and it reads ``update.params`` / ``update.private``, declare
  ``diagnostics_without_uploads=False`` (one that logs other numbers keeps ``True``: it is
  called with the round's updates emptied of tensors when the round streams);
- ``personal_model``, declare ``received_personal_model=False``;
- ``ClientProgram.local_update``, declare ``batch_loop=False``; ``ClientProgram.upload``,
  declare ``model_upload=False``;

and ``averaged_upload=False`` when the upload is not a model update whatever the hooks are.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from pflbench.config.settings.base import AlgorithmFacts

FEATURES = ("averaged-upload", "dp-sample", "batch-loop", "streaming", "shared-evaluation")


@dataclass(frozen=True)
class Capabilities:
    """What an ``Algorithm`` class's server-side hooks do. Every field defaults to False (assume
    nothing); ``of_defaults()`` is what ``Algorithm``'s own hooks do (FedAvg)."""

    same_broadcast: bool = False  # broadcast: every client receives global_state
    fedavg_aggregate: bool = False  # aggregate (and streaming_aggregate): w ← Σ n_k·w_k / Σ n_k
    diagnostics_without_uploads: bool = False  # round_diagnostics reads no uploaded tensors
    received_personal_model: bool = False  # personal_model: what it would receive + private tensors
    # The upload is a model update averaged by the FedAvg rule: None reads it from the fields
    # above and the program's; False refuses --dp, model poisoning and robust rules; True vouches.
    averaged_upload: bool | None = None

    @classmethod
    def of_defaults(cls, **changes: Any) -> Capabilities:
        """The capabilities of ``Algorithm``'s default hooks, with ``changes``."""
        return dataclasses.replace(cls(True, True, True, True), **changes)


@dataclass(frozen=True)
class ProgramCapabilities:
    """What a ``ClientProgram`` class's hooks do. Every field defaults to False (assume nothing)."""

    batch_loop: bool = False  # local_update: the engine's batch loop (standard_local_update)
    model_upload: bool = False  # upload: a copy of the shared model tensors after training

    @classmethod
    def of_defaults(cls, **changes: Any) -> ProgramCapabilities:
        """The capabilities of ``ClientProgram``'s default hooks, with ``changes``."""
        return dataclasses.replace(cls(True, True), **changes)


# What a class gets when its own body declares nothing (``Algorithm.__init_subclass__``).
UNDECLARED = Capabilities()
PROGRAM_UNDECLARED = ProgramCapabilities()


def inherit_no_capabilities(cls: type, undeclared: Any) -> None:
    """``__init_subclass__``'s rule: a class whose own body assigns no ``capabilities`` gets
    ``undeclared`` (never its parent's). The old flag ``upload_is_averaged_update`` is refused
    (it would silently be ignored): ``Capabilities(averaged_upload=...)`` says it now."""
    if "upload_is_averaged_update" in vars(cls):
        raise TypeError(
            f"{cls.__name__}: upload_is_averaged_update is now declared as "
            "capabilities = Capabilities(..., averaged_upload=True/False) (engine.capabilities)"
        )
    if "capabilities" not in vars(cls):
        cls.capabilities = undeclared  # type: ignore[attr-defined]


def refusal(feature: str, algorithm: type, program: type | None = None) -> str | None:
    """Why ``algorithm`` (an ``Algorithm`` class) cannot serve ``feature`` (one of ``FEATURES``),
    or None. ``program``: the client program class that will train (default: its
    ``program_class``; the vmap executor passes the built one, which ``make_program`` may choose
    by hyperparameter)."""
    caps: Capabilities = algorithm.capabilities  # type: ignore[attr-defined]
    program = algorithm.program_class if program is None else program  # type: ignore[attr-defined]
    client: ProgramCapabilities = program.capabilities  # type: ignore[union-attr]
    name = algorithm.__name__
    undeclared = f"{name} declares no capabilities (Algorithm.capabilities), so none is assumed"
    if client is PROGRAM_UNDECLARED:
        undeclared = f"its client program {program.__name__} declares no capabilities (ClientProgram.capabilities)"
    if feature == "averaged-upload":
        if caps.averaged_upload is not None:
            return None if caps.averaged_upload else "its upload is not a model update averaged by the FedAvg rule"
        if caps is UNDECLARED or client is PROGRAM_UNDECLARED:
            return undeclared
        checks = [
            (caps.fedavg_aggregate, "its aggregation is not the FedAvg average (it overrides aggregate)"),
            (caps.same_broadcast, "clients receive different models (it overrides broadcast)"),
            (client.model_upload, "its clients upload more than their model tensors (it overrides upload)"),
            (
                client.batch_loop,
                "its clients' update is its own code (it overrides local_update), which may upload anything",
            ),
            (
                caps.diagnostics_without_uploads,
                "its round diagnostics read the raw uploads (it overrides round_diagnostics)",
            ),
        ]
        return next((why for ok, why in checks if not ok), None)
    if feature == "dp-sample":
        if caps.averaged_upload is False:
            return "its upload is not a model update"
        if client is PROGRAM_UNDECLARED:
            return undeclared
        if not client.batch_loop:
            return "its clients' update is its own code (it overrides local_update), outside the DP-SGD batch loop"
        if not client.model_upload:
            return "its clients upload more than their model tensors (it overrides upload)"
        return None
    if feature == "batch-loop":
        if client is PROGRAM_UNDECLARED:
            return (
                f"{name}'s client program {program.__name__} declares no capabilities "
                "(ClientProgram.capabilities), so it counts as a custom local training loop"
            )
        return (
            None
            if client.batch_loop
            else f"{name}'s client program overrides local_update (a custom local training loop)"
        )
    if feature == "streaming":
        if not caps.fedavg_aggregate:
            return "its aggregation is not the FedAvg average"
        return None if caps.diagnostics_without_uploads else "its round diagnostics read the whole list of uploads"
    if feature == "shared-evaluation":
        if not caps.received_personal_model:
            return "its personal model is not the received one"
        return None if caps.same_broadcast else "clients receive different models (it overrides broadcast)"
    raise ValueError(f"unknown capability feature {feature!r}; valid: {', '.join(FEATURES)}")


def algorithm_facts(algorithm: type) -> AlgorithmFacts:
    """What the setting groups' run checks read of ``algorithm`` (an ``Algorithm`` class):
    ``refusal`` of every feature, whether it has a global model, whether it uploads nothing."""
    return AlgorithmFacts(
        refusals={feature: refusal(feature, algorithm) for feature in FEATURES},
        has_global_model=bool(algorithm.has_global_model),  # type: ignore[attr-defined]
        uploads_nothing=bool(getattr(algorithm, "uploads_nothing", False)),
    )


def extra_state_refusal(algorithm: type, extra: list[str]) -> str | None:
    """Why ``algorithm``, which keeps per-client state outside the model (``extra``, names) and
    does not set ``personal_model_is_received``, cannot start, or None: it must declare its own
    ``personal_model`` (``received_personal_model=False``), else its pers_acc would silently be
    the received model's."""
    caps: Capabilities = algorithm.capabilities  # type: ignore[attr-defined]
    name, names = algorithm.__name__, ", ".join(extra[:3])
    if caps is UNDECLARED:
        return (
            f"{name} keeps per-client state outside the model ({names}) and declares no capabilities: if it "
            "does not override personal_model, its pers_acc would silently be the received model's. Override "
            "personal_model and declare capabilities = Capabilities(..., received_personal_model=False), or "
            "set personal_model_is_received = True if that is what its paper evaluates"
        )
    if caps.received_personal_model:
        return (
            f"{name} keeps per-client state outside the model ({names}) but does not override personal_model: "
            "its pers_acc would silently be the received model's. Override personal_model (and declare "
            "received_personal_model=False), or set personal_model_is_received = True if that is what its "
            "paper evaluates"
        )
    return None


__all__ = [
    "Capabilities",
    "ProgramCapabilities",
    "UNDECLARED",
    "PROGRAM_UNDECLARED",
    "FEATURES",
    "refusal",
    "algorithm_facts",
    "extra_state_refusal",
]
