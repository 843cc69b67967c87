"""The plugin contract: ``Algorithm`` (server side) and ``ClientProgram`` (client side).

An ``Algorithm`` lives in the driver. It decides what travels (``select_shared``), what client k
receives (``broadcast``), the update rule (``aggregate``) and what a client's evaluation model is
(``personal_model`` / ``global_model``). Class-level hooks run before any state exists: the run
defaults it needs (``run_defaults``), how it transforms the model (``configure_model``, e.g. LoRA)
and which settings it refuses (``check_config``).

A ``ClientProgram`` is the only code that crosses the executor seam: a picklable object with no
reference to the server. From what the server sent and the client's private state it assembles
the model state (``assemble``), names its training phases and loss terms, describes its optimizer
as data and says what it uploads and keeps.

Both declare what their code does as data (``capabilities``, ``engine.capabilities``): the
engine reads the declaration, never which hooks a class overrides, to decide --dp, --attack,
--robust-agg, --executor vmap, --deadline-policy partial, streaming aggregation and shared
evaluation. Capabilities are not inherited: a class that overrides a hook states its own (see
``engine.capabilities`` for the rule "if you override X, declare Y").
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

import torch
import torch.nn.functional as F
from torch import nn

from pflbench.config import lora
from pflbench.config.space import Dimension, around
from pflbench.engine.capabilities import (
    PROGRAM_UNDECLARED,
    UNDECLARED,
    Capabilities,
    ProgramCapabilities,
    extra_state_refusal,
    inherit_no_capabilities,
    refusal,
)
from pflbench.engine.fingerprint import fingerprint
from pflbench.engine.local import LocalResult, LocalTrainer, standard_local_update
from pflbench.engine.state import ClientStateStore
from pflbench.engine.streaming import StreamingWeightedAverage
from pflbench.engine.types import (
    ClientUpdate,
    Forward,
    LocalPhase,
    NoHyperparameters,
    OptimizerSpec,
    ParamGroup,
    ParamLayout,
    Tensors,
    clone_tensors,
    sample_weights,
    weighted_average,
)
from pflbench.errors import ConfigError
from pflbench.models.lora import apply_lora, parse_targets

if TYPE_CHECKING:
    from pflbench.config.groups import LocalSpec
    from pflbench.config.run_config import RunConfig

H = TypeVar("H")


class ClientProgram(Generic[H]):
    """Client-side hooks. One instance serves every client; a client's state comes with its job.

    The hooks by concern (override what your method changes):

    - client training: ``assemble`` (the model state from what was received and kept),
      ``local_phases`` (which parameters train for how many epochs), ``loss_terms`` (the loss,
      pure in the parameters), ``optimizer`` (as data), ``local_update`` (the whole update:
      override only when it is not a loss minimised over batches: declare ``batch_loop=False``);
    - what travels and stays: ``upload`` (declare ``model_upload=False`` when you override it),
      ``private_state`` (what the client keeps until its next round);
    - declared capabilities: ``capabilities`` (``ProgramCapabilities``; not inherited: a
      subclass that declares nothing is assumed to have its own local update and upload).
    """

    capabilities: ClassVar[ProgramCapabilities] = ProgramCapabilities.of_defaults()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        inherit_no_capabilities(cls, PROGRAM_UNDECLARED)

    def __init__(self, layout: ParamLayout, hparams: H, local: LocalSpec) -> None:
        self.layout, self.hparams, self.local = layout, hparams, local
        self.loss_weights: dict[str, float] = {}  # loss = Σ weight·term (default weight 1)

    @property
    def max_grad_norm(self) -> float | None:
        return self.local.max_grad_norm or None

    def assemble(self, received: Tensors, private: Tensors) -> Tensors:
        """The model state of this client: what it received, then its private tensors."""
        return {**received, **private}

    def local_phases(self, client_id: int) -> list[LocalPhase]:
        """Default: ``--local-epochs`` epochs over every trainable parameter."""
        return [LocalPhase(self.local.epochs, frozenset(self.layout.trainable))]

    def loss_terms(
        self, forward: Forward, params: Tensors, inputs: torch.Tensor, targets: torch.Tensor, received: Tensors
    ) -> dict[str, torch.Tensor]:
        """Named loss terms, pure in ``params``; Σ ``loss_weights[name]``·term is minimised and
        each term is logged. ``received`` is what the server sent."""
        return {"task": F.cross_entropy(forward(params, inputs), targets)}

    def local_update(self, trainer: LocalTrainer) -> LocalResult:
        """The client's local training on ``trainer`` (the model loaded with ``assemble``'s state).

        Default: the engine's batch loop over ``local_phases`` (``standard_local_update``). Override
        only when the update is not a loss minimised over batches; executors that cannot host a
        custom update (vectorized) refuse it with a clear error."""
        return standard_local_update(self, trainer)

    def optimizer(self) -> OptimizerSpec:
        """The local optimizer as data (default: ``--optimizer`` with ``--lr`` etc.)."""
        local = self.local
        return OptimizerSpec(
            kind=local.optimizer,
            lr=local.lr,
            momentum=local.momentum,
            weight_decay=local.weight_decay,
            max_grad_norm=self.max_grad_norm,
        )

    def upload(self, state: Tensors, received: Tensors) -> Tensors:
        """Default: a copy of the shared tensors after local training."""
        return {name: state[name].detach().clone() for name in self.layout.shared}

    def private_state(self, state: Tensors, job_private: Tensors) -> Tensors:
        """What the client keeps until its next round (default: its private model tensors).

        ``job_private`` is the state it started the round with (extra, non-model state lives
        there: an algorithm with such state overrides this)."""
        return {name: state[name].detach().clone() for name in self.layout.private}


class FineTuneProgram(ClientProgram[NoHyperparameters]):
    """``epochs`` epochs of the standard batch loop (cross-entropy, the run's local optimizer) over
    ``names`` (default: every trainable parameter), then the whole model state is uploaded.

    It uses only the default ``local_update``, so every executor that runs plain local training
    can run it."""

    capabilities = ProgramCapabilities.of_defaults(model_upload=False)  # it uploads every received tensor

    def __init__(
        self, trainable: tuple[str, ...], local: LocalSpec, epochs: int, names: frozenset[str] | None = None
    ) -> None:
        layout = ParamLayout(trainable=tuple(trainable), shared=(), private=())
        super().__init__(layout, NoHyperparameters(), local)
        self.epochs = epochs
        self.names = frozenset(trainable) if names is None else frozenset(names)

    def local_phases(self, client_id: int) -> list[LocalPhase]:
        return [LocalPhase(self.epochs, self.names)]

    def upload(self, state: Tensors, received: Tensors) -> Tensors:
        """The tuned model: every tensor the job received (the full evaluation state)."""
        return {name: state[name].detach().clone() for name in received}

    def private_state(self, state: Tensors, job_private: Tensors) -> Tensors:
        return {}


# What ``Algorithm.__init__`` sets and the engine saves (global_state, store) or never changes.
ENGINE_ATTRIBUTES = frozenset(
    {"config", "hparams", "model", "num_train", "layout", "global_state", "initial_state", "store", "program"}
)


class Algorithm(Generic[H]):
    """Server-side hooks. Subclass per algorithm, set ``program_class`` and register it.

    The override points by concern (CONTRIBUTING's hook table lists each):

    - set-up, before any state (class level): ``hyperparameters``, ``program_class``,
      ``run_defaults``, ``defaults_by_family``, ``check_config``, ``inert_hyperparameters``,
      ``search_space``, ``lora_rank``, ``configure_model``, ``uses_head_layers``;
    - declared capabilities: ``capabilities`` (``Capabilities``; not inherited, see
      ``engine.capabilities``), ``uploads_nothing``, ``has_global_model``,
      ``personal_model_is_received``;
    - client training (what the clients get): ``select_shared``, ``param_groups``,
      ``extra_private_state``, ``make_program``, ``broadcast``;
    - server aggregation: ``aggregate``, ``streaming_aggregate``;
    - evaluation: ``personal_model``, ``global_model``, ``clients_share_one_model``,
      ``personalization_program``;
    - new clients (``--new-clients``): ``new_client_model``, ``new_client_program``,
      ``new_client_epochs``;
    - checkpointing: ``checkpoint_attributes``, ``transient_attributes``, ``checkpoint_state``,
      ``restore_state``;
    - diagnostics and records: ``round_diagnostics``, ``final_report``, ``run_info``;
    - listing: ``display_name``, ``paper``, ``method_family``.
    """

    hyperparameters: ClassVar[type] = NoHyperparameters
    program_class: ClassVar[type[ClientProgram]] = ClientProgram
    has_global_model: ClassVar[bool] = True  # False: global_acc is reported as null
    display_name: ClassVar[str | None] = None  # e.g. "FedAvg" (tables); default: the name
    paper: ClassVar[str] = ""  # the citation `pflbench list` shows
    # The survey's family (``report.families.METHOD_FAMILIES`` key, e.g. "clustering"): `pflbench
    # list` groups by it. A literal in the registered class's own body (read without importing).
    method_family: ClassVar[str] = ""
    # True: clients upload nothing (Local), so there is no update to aggregate robustly, poison or
    # make private; read before the run is built (a sweep refuses such a grid cell up front).
    uploads_nothing: ClassVar[bool] = False
    uses_head_layers: ClassVar[bool] = False  # reads --head-layers (part of the run identity)
    # Per-client state that is not part of the model (control variates, a second model, ...)
    # must say whether the personal model is still the received/global one. See personal_model.
    personal_model_is_received: ClassVar[bool] = False
    # Attributes that change across rounds besides global_state and the store (tensors or
    # JSON-able values): saved in checkpoints so a resumed run continues exactly.
    checkpoint_attributes: ClassVar[tuple[str, ...]] = ()
    # Attributes that change across rounds but never affect a later round (diagnostics, caches
    # rebuilt every round). Any other attribute that changes and is not in checkpoint_attributes
    # is undeclared state: checkpoints stop (``undeclared_state``), so a resume cannot differ.
    transient_attributes: ClassVar[tuple[str, ...]] = ()
    # Where this algorithm was measured to need other defaults than its model family's
    # (``config.defaults.DEFAULTS_BY_FAMILY``): family → {setting: value}. Applied at the family
    # defaults' rank (below ``run_defaults`` and a sweep's shared defaults), recorded in config.json.
    defaults_by_family: ClassVar[dict[str, dict[str, Any]]] = {}
    # What the hooks do, declared (``engine.capabilities``): it admits --dp, model poisoning and
    # robust rules (an upload that is a model update averaged by the FedAvg rule), streaming
    # aggregation and one evaluation pass for all clients. Not inherited: a subclass whose body
    # does not assign it gets ``UNDECLARED`` (nothing), so a FedAvg subclass that overrides
    # aggregate never silently keeps FedAvg's streamed average. Restate the parent's in one line
    # (``capabilities = FedAvg.capabilities``) when your overrides keep it true.
    capabilities: ClassVar[Capabilities] = Capabilities.of_defaults()
    # The partition's true group of each client (partition.json ``client_domains``: feature-shift or
    # multi-domain scenarios), set by the run's preparation before the first round; None without
    # groups. Read-only: e.g. IFCA scores its cluster assignment against it.
    client_domains: list[str] | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        inherit_no_capabilities(cls, UNDECLARED)

    # ---- set-up (class level, before any state exists) -----------------------------------
    @classmethod
    def lora_rank(cls, config: RunConfig, hparams: H) -> int | None:
        """Rank the LoRA layers are built with (None: no LoRA); default ``--lora-rank``."""
        return config.lora_rank

    @classmethod
    def run_defaults(cls, config: RunConfig, hparams: H) -> dict[str, Any]:
        """Values for the settings the user left unset (``None``). LoRA runs need a small ViT,
        a public fraction to pretrain it on, and Adam (``config.lora.RUN_DEFAULTS``)."""
        return dict(lora.RUN_DEFAULTS) if lora.is_lora_run(cls, config, hparams) else {}

    @classmethod
    def check_config(cls, config: RunConfig, hparams: H) -> None:
        """Refuse settings this algorithm would ignore or cannot honour (raise ConfigError)."""

    @classmethod
    def inert_hyperparameters(cls, config: RunConfig, hparams: H) -> dict[str, str]:
        """The hyperparameters these settings do not read (name → why), e.g. an option of a variant
        not chosen. Given explicitly (command line or --config) they are refused; a sweep refuses
        them only when no run of its grid reads them (``cli.options.refuse_inert_options``)."""
        return {}

    @classmethod
    def search_space(cls, config: RunConfig, hparams: H) -> dict[str, Dimension]:
        """The default space of ``pflbench tune`` (``config`` resolved): the local learning rate,
        log-uniform from a tenth to ten times its resolved default. An algorithm adds the
        hyperparameters its paper tunes (``{**super().search_space(config, hparams), ...}``)."""
        if config.lr is None:
            raise RuntimeError("search_space needs a resolved config (config.resolve)")
        return {"lr": around(config.lr)}

    @classmethod
    def configure_model(cls, model: nn.Module, config: RunConfig, hparams: H) -> dict[str, Any]:
        """Transform the freshly built model (after its initial weights); returns a record.

        Default: LoRA on ``--lora-targets`` when ``lora_rank`` is set, the head (``--head-layers``)
        left trainable."""
        rank = lora.lora_rank(cls, config, hparams)
        if rank is None:
            return {}
        adapted = apply_lora(
            model, rank, config.lora_alpha, parse_targets(config.lora_targets), head_layers=config.head_layers
        )
        return {"lora": {"rank": rank, "alpha": config.lora_alpha, "adapted_layers": adapted}}

    # ---- state ---------------------------------------------------------------------------
    def __init__(self, config: RunConfig, hparams: H, model: nn.Module, num_train: list[int]) -> None:
        self.config, self.hparams = config, hparams
        self.model = model  # the initial model, read for its structure only (never the transport)
        self.num_train = num_train
        trainable = [n for n, p in model.named_parameters() if p.requires_grad]
        float_buffers = [n for n, b in model.named_buffers() if b.is_floating_point()]
        tensors = {**dict(model.named_parameters()), **dict(model.named_buffers())}
        names = trainable + float_buffers
        shared = self.select_shared(list(names))
        private = [n for n in names if n not in set(shared)]
        self.layout = ParamLayout(tuple(trainable), tuple(shared), tuple(private), self.param_groups())
        self.global_state = {n: tensors[n].detach().clone() for n in shared}
        self.initial_state = clone_tensors(tensors)  # before extra_private_state, which may read it
        extra = self.extra_private_state()
        self.store = ClientStateStore({**{n: tensors[n].detach().clone() for n in private}, **extra})
        if extra and not self.personal_model_is_received:  # its pers_acc must not silently be the received model's
            why = extra_state_refusal(type(self), sorted(extra))
            if why is not None:
                raise ConfigError(why)
        self.program = self.make_program()

    def make_program(self) -> ClientProgram:
        return self.program_class(self.layout, self.hparams, self.config.local_spec)

    # ---- hooks ---------------------------------------------------------------------------
    def select_shared(self, names: list[str]) -> list[str]:
        """Which state tensors are shared (the rest stay private on each client)."""
        return names

    def param_groups(self) -> dict[str, tuple[str, ...]]:
        """Named subsets of the state the client program needs (``layout.groups``)."""
        return {}

    def extra_private_state(self) -> Tensors:
        """Initial per-client tensors that are not model state (e.g. control variates)."""
        return {}

    def broadcast(self, client_id: int) -> Tensors:
        """What client ``client_id`` receives this round (counted in bytes_down)."""
        return self.global_state

    def aggregate(self, updates: list[ClientUpdate]) -> None:
        """FedAvg: w ← Σ_k n_k·w_k / Σ_k n_k over the uploaded tensors."""
        if not updates or not updates[0].params:
            return
        average = weighted_average([u.params for u in updates], sample_weights(updates))
        torch._foreach_copy_([self.global_state[n] for n in average], list(average.values()))

    def streaming_aggregate(self, num_samples: list[int]) -> StreamingWeightedAverage | None:
        """The round's aggregation as a stream (``add(update)`` per client, then ``finish()``),
        so the round loop need not hold every upload; ``num_samples``: the sampled clients'.

        Default: the FedAvg rule streamed when the class declares it (``capabilities``:
        ``fedavg_aggregate`` and ``diagnostics_without_uploads``); else None, and ``aggregate``
        gets the round's list. An algorithm with its own rule may stream it by overriding this."""
        if refusal("streaming", type(self)) is not None:
            return None
        return StreamingWeightedAverage(self.global_state, sum(num_samples))

    def round_diagnostics(self, updates: list[ClientUpdate]) -> dict[str, Any]:
        """Extra rounds.jsonl entries after the round's aggregation. When the round streamed
        (``streaming_aggregate``) the updates carry no tensors (``params``/``private`` empty);
        one that reads them declares ``diagnostics_without_uploads=False``."""
        return {}

    def final_report(self) -> tuple[dict[str, Any], dict[str, list[Any]]]:
        """After the last round: extra summary.json entries and extra clients.csv columns."""
        return {}, {}

    def run_info(self) -> dict[str, Any]:
        """Settings the algorithm resolved at start (recorded in config.json)."""
        return {}

    def clients_share_one_model(self) -> bool:
        """True when every client's evaluation model is the global one (one pass evaluates all)."""
        return not self.layout.private and self.personal_model_is_received_default()

    def personal_model_is_received_default(self) -> bool:
        """Whether the class declares that ``personal_model`` is the default (received + private)."""
        return refusal("shared-evaluation", type(self)) is None

    def personalization_program(self) -> ClientProgram | None:
        """A client program that turns ``personal_model(k)`` into the model client k is evaluated
        with, using its train split (e.g. FedBABU's fine-tuning, Per-FedAvg's one-step
        adaptation): the engine runs it through the executor on a job whose ``received`` is the
        personal model (``private`` empty) and evaluates what it uploads (see
        ``engine.personalize``). Default None: ``personal_model(k)`` is evaluated as it is."""
        return None

    # ---- new clients (--new-clients): never trained, served after training ----------------
    def new_client_model(self, client_id: int) -> Tensors:
        """What a new client ``client_id`` (held out of training) starts from: what it would
        receive with the initial private state (FedAvg: the global model; FedPer: the trained body
        with a fresh head; FlexLoRA: the global update at its rank)."""
        return self.model_state(self.program.assemble(self.broadcast(client_id), self.store.initial))

    def new_client_epochs(self) -> int:
        """Epochs of the default new-client adaptation (a fresh private part): ``--local-epochs``."""
        return self.config.local_epochs

    def new_client_program(self) -> ClientProgram | None:
        """How a new client adapts ``new_client_model(k)`` on its own train split before it is
        tested (run through the executor like ``personalization_program``; what it uploads is
        evaluated, ``new_acc``). Default: the algorithm's own test-time personalization if it has
        one (FedBABU, Per-FedAvg); else, when clients keep private model tensors (a head, a body,
        BatchNorm layers), a fresh private part trained for ``new_client_epochs`` epochs with the
        shared part frozen (cross-entropy, the run's local optimizer); else None: the new client
        is evaluated with ``new_client_model(k)`` as it is (global-model methods)."""
        adaptation = self.personalization_program()
        if adaptation is not None:
            return adaptation
        private = frozenset(self.layout.private) & frozenset(self.layout.trainable)
        if not private:
            return None
        return FineTuneProgram(self.layout.trainable, self.config.local_spec, self.new_client_epochs(), private)

    def personal_model(self, client_id: int) -> Tensors:
        """Client ``client_id``'s evaluation model: what it would receive + its private state."""
        return self.model_state(self.program.assemble(self.broadcast(client_id), self.store.get(client_id)))

    def global_model(self) -> Tensors:
        """The server's global model (evaluated on every client's test split)."""
        return self.model_state(self.program.assemble(self.global_state, self.store.initial))

    # ---- checkpoints ---------------------------------------------------------------------
    def checkpoint_state(self) -> tuple[Tensors, dict[str, Any]]:
        """The server state that changes across rounds: tensors and JSON-able metadata.

        Default: ``global_state``, every stored client's private tensors and the attributes named
        in ``checkpoint_attributes``. Override (with ``restore_state``) for other state, e.g. a
        random stream the algorithm draws from across rounds."""
        tensors = {f"global/{n}": t for n, t in self.global_state.items()}
        for k in self.store.clients():
            tensors.update({f"store/{k}/{n}": t for n, t in self.store.get(k).items()})
        attributes: dict[str, Any] = {}
        for name in self.checkpoint_attributes:
            if hasattr(self, name):
                value = getattr(self, name)
                if isinstance(value, torch.Tensor):
                    tensors[f"attr/{name}"] = value
                elif isinstance(value, dict) and value and all(isinstance(v, torch.Tensor) for v in value.values()):
                    tensors.update({f"attrdict/{name}/{key}": v for key, v in value.items()})
                else:
                    attributes[name] = value
        return tensors, {"store_clients": self.store.clients(), "attributes": attributes}

    def state_fingerprint(self) -> dict[str, str]:
        """A digest of every attribute a checkpoint would not save (neither engine-managed nor
        declared in ``checkpoint_attributes`` / ``transient_attributes``)."""
        skip = {*ENGINE_ATTRIBUTES, *self.checkpoint_attributes, *self.transient_attributes}
        return {name: fingerprint(value) for name, value in vars(self).items() if name not in skip}

    def undeclared_state(self, before: dict[str, str]) -> list[str]:
        """Attributes that appeared or changed since ``before`` (a ``state_fingerprint``) and
        that no checkpoint saves: a run resumed from a checkpoint would lose them."""
        now = self.state_fingerprint()
        return sorted(name for name, digest in now.items() if before.get(name) != digest)

    @torch.no_grad()
    def restore_state(self, tensors: Tensors, meta: dict[str, Any]) -> None:
        """Put back what ``checkpoint_state`` saved (tensors loaded on the CPU)."""
        for name, tensor in self.global_state.items():
            tensor.copy_(tensors[f"global/{name}"])
        device = next(iter(self.initial_state.values())).device if self.initial_state else None
        states: dict[int, Tensors] = {int(k): {} for k in meta["store_clients"]}
        for key, tensor in tensors.items():
            kind, _, rest = key.partition("/")
            if kind == "store":
                k, _, name = rest.partition("/")
                states[int(k)][name] = tensor.to(device)
            elif kind == "attr":
                setattr(self, rest, tensor.to(device))
            elif kind == "attrdict":  # the dict may be created lazily (in aggregate), not in __init__
                attribute, _, key = rest.partition("/")
                if getattr(self, attribute, None) is None:
                    setattr(self, attribute, {})
                getattr(self, attribute)[key] = tensor.to(device)
        for client, state in states.items():
            self.store.put(client, state)
        for name, value in meta["attributes"].items():
            setattr(self, name, value)

    def model_state(self, state: Tensors) -> Tensors:
        """``state`` without entries that are not model tensors (extra private state)."""
        return {n: t for n, t in state.items() if n in self.initial_state}


__all__ = [
    "Algorithm",
    "Capabilities",
    "ClientProgram",
    "FineTuneProgram",
    "ProgramCapabilities",
    "ParamGroup",
    "OptimizerSpec",
    "ClientStateStore",
]
