"""How each built-in algorithm serves a new client (``--new-clients``), as its docstring says:
global-model methods the global model as it is, body/head methods a fresh private part trained
with the shared part frozen, the rest their paper's procedure or fine-tuning."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pflbench.config.run_config import RunConfig
from pflbench.engine import FineTuneProgram, personalize
from pflbench.registry import ALGORITHMS
from pflbench.runs.prepare import prepare
from pflbench.testing import ALGORITHM_OVERRIDES as OVERRIDES

# the built-ins (other tests may have registered plugins by the time these run)
BUILT_IN = sorted(n for n in ALGORITHMS.names() if ALGORITHMS.get(n).__module__.startswith("pflbench.algorithms."))
AS_IT_IS = {"fedavg", "fedprox", "moon", "feddyn", "scaffold", "fedala", "flexlora"}
AS_IT_IS |= {"fedavgm", "fedadam", "fedyogi", "fedadagrad", "fednova"}  # server optimizers, FedNova
AS_IT_IS |= {"fedgen", "fedkd"}  # the global model; FedKD: the mentee (a new client has no mentor)
AS_IT_IS |= {"floco"}  # the solution simplex's centre (no position of its own yet)
FRESH_PRIVATE_PART = {"fedper", "fedrep", "lgfedavg", "fedbn", "fedrod", "local"}
FRESH_PRIVATE_PART |= {"fedpac", "feddbe"}  # a fresh classifier / PRBM on the trained model
FRESH_PRIVATE_PART |= {"fedas"}  # a fresh head on the global body
FRESH_PRIVATE_PART |= {"fedcp"}  # a fresh personalized head (and its vector) on the global route
FRESH_PRIVATE_PART |= {"flute"}  # a fresh head on the global representation
GLOBAL_FINE_TUNED = {"apfl", "fedcac"}  # no local state yet: the global model trained for --local-epochs
OWN_PROGRAM = {
    "fedproto": "FedProtoNewClientProgram",
    "ditto": "DittoNewClientProgram",
    "pfedme": "PFedMeNewClientProgram",
    "fedsdg": "FedSDGNewClientProgram",
    "perfedavg": "OneStepAdaptation",
    "ifca": "IFCASelection",  # the lowest-loss cluster
    "fedfomo": "FedFomoNewClientProgram",  # one FedFomo update from random downloads
    "fedamp": "FedAMPNewClientProgram",  # FedAMP's objective towards the clients' mean
    "gpfl": "GPFLNewClientProgram",  # its conditional inputs, then a fresh head
    "fedmtl": "FedMTLNewClientProgram",  # a new task trained against the reported models
    "pfedhn": "PFedHNNewClientProgram",  # its embedding learned with the hypernetwork frozen
    "pflmoe": "PFLMoENewClientProgram",  # v fine-tuned from the global model, then the gate
    "pfedgraph": "PFedGraphNewClientProgram",  # its objective once from the share-weighted models
    "fedem": "FedEMNewClientProgram",  # π by EM with the components frozen
    "knnper": "DatastoreProgram",  # its own datastore under the global model
    "pefll": "PeFLLInferenceProgram",  # its model generated from its data's embedding (no training)
    "pfedfda": "PFedFDAAdaptProgram",  # its class statistics mixed with the global ones (no training)
}


def prepared(algo: str, out: Path, **options):
    settings = {"model": "mlp", "optimizer": "adam", "lr": 0.01, **OVERRIDES.get(algo, {})}
    config = RunConfig(
        algo=algo,
        dataset="digits",
        num_clients=4,
        new_clients=0.25,
        rounds=1,
        local_epochs=2,
        out=str(out),
        lora_targets="fc1,fc2",
        backbone="random",
        **settings,
    )
    return prepare(config, options)


def test_every_built_in_algorithm_is_in_the_table() -> None:
    listed = AS_IT_IS | FRESH_PRIVATE_PART | set(OWN_PROGRAM) | {"fedbabu"} | GLOBAL_FINE_TUNED
    assert listed == set(BUILT_IN) and len(BUILT_IN) >= 19


@pytest.mark.parametrize("algo", BUILT_IN)
def test_each_algorithm_serves_new_clients_as_documented(algo: str, tmp_path: Path) -> None:
    options = {"head_epochs": 3} if algo == "fedrep" else {"ft_epochs": 4} if algo == "fedbabu" else {}
    algorithm = prepared(algo, tmp_path, **options).algorithm
    program = algorithm.new_client_program()
    layout = algorithm.layout
    if algo in AS_IT_IS:
        assert program is None
    elif algo in FRESH_PRIVATE_PART:
        assert isinstance(program, FineTuneProgram)
        assert program.names == frozenset(layout.private) & frozenset(layout.trainable) and program.names
        assert program.epochs == (3 if algo == "fedrep" else 2)  # FedRep: its head epochs
        start = algorithm.new_client_model(0)
        for name in layout.private:  # the fresh private part is the initial one
            assert torch.equal(start[name], algorithm.store.initial[name]), name
    elif algo == "fedbabu":  # its own fine-tuning of every client, --ft-epochs
        assert isinstance(program, FineTuneProgram) and program.epochs == 4
    elif algo in GLOBAL_FINE_TUNED:  # the fallback: the global model fine-tuned for --local-epochs
        assert isinstance(program, FineTuneProgram) and program.names == frozenset(layout.trainable)
        assert program.epochs == 2
    else:
        assert type(program).__name__ == OWN_PROGRAM[algo]


def test_fedsdg_trains_a_new_clients_private_branch_and_gates_only(tmp_path: Path) -> None:
    run = prepared("fedsdg", tmp_path)
    algorithm, executor = run.algorithm, run.executor
    start = algorithm.new_client_model(3)
    gates = algorithm.layout.groups["gates"]
    assert all(float(start[n]) == 0.0 for n in gates)  # the initial gates (m = 0.5), not the global model's −∞
    (served,) = personalize(executor, algorithm.new_client_program(), [start], [3], [11], 1)
    private = set(algorithm.layout.private)
    assert all(torch.equal(served[n], start[n]) for n in start if n not in private)
    assert any(not torch.equal(served[n], start[n]) for n in gates)


def test_ditto_with_no_pull_is_plain_fine_tuning(tmp_path: Path) -> None:
    """λ = 0 leaves f(v) alone: Ditto's new-client program is then the fine-tuning of the global
    model for --personal-epochs; with λ > 0 the proximal term pulls v back towards w."""
    served = {}
    for lam in (0.0, 1000.0):
        run = prepared("ditto", tmp_path / str(lam), lam=lam, personal_epochs=3)
        algorithm, executor = run.algorithm, run.executor
        start = algorithm.new_client_model(1)
        (served[lam],) = personalize(executor, algorithm.new_client_program(), [start], [1], [5], 1)
        if lam == 0.0:
            tuned = FineTuneProgram(algorithm.layout.trainable, run.config.local_spec, 3)
            (expected,) = personalize(executor, tuned, [start], [1], [5], 1)
            assert all(torch.equal(served[lam][n], expected[n]) for n in expected)

    def distance(state) -> float:
        return sum(float((state[n] - start[n]).pow(2).sum()) for n in algorithm.layout.trainable)

    assert distance(served[1000.0]) < 0.1 * distance(served[0.0])
