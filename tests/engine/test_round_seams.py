"""The round loop's seams: the Executor protocol names every member the engine uses and every
executor has them; the evaluation seam picks one protocol per kind; traffic is a declared
record; the test-only kill hook lives in ``pflbench.testing``, not in the run path."""

from __future__ import annotations

import inspect
from pathlib import Path

import numpy as np

import pflbench
from pflbench.config.run_config import RunConfig
from pflbench.engine.evaluator import ClientProtocol, EvaluationSets, HeldOutProtocol, NewClientProtocol
from pflbench.engine.executor import Executor, SequentialExecutor
from pflbench.engine.federation import Traffic
from pflbench.engine.ray_executor import RayExecutor
from pflbench.engine.vmap import VmapExecutor
from pflbench.runs.prepare import prepare
from pflbench.testing import Harness


def test_every_executor_has_every_member_of_the_protocol() -> None:
    methods = [n for n, v in vars(Executor).items() if inspect.isfunction(v) and not n.startswith("_")]
    assert {"train", "train_iter", "evaluate", "evaluate_split", "check_algorithm", "close"} <= set(methods)
    for executor in (SequentialExecutor, VmapExecutor, RayExecutor):
        assert [n for n in methods if not callable(getattr(executor, n, None))] == [], executor
        assert isinstance(getattr(executor, "name", None), str)


def test_the_engine_reaches_no_executor_member_by_getattr() -> None:
    root = Path(pflbench.__file__).parent
    for path in [*root.glob("engine/*.py"), *root.glob("runs/*.py")]:
        text = path.read_text()
        assert 'getattr(self.executor, "' not in text and 'getattr(prepared.executor, "' not in text, path


def test_the_kill_switch_is_a_test_hook_only() -> None:
    root = Path(pflbench.__file__).parent
    found = [p for p in root.rglob("*.py") if "PFLBENCH_TEST_" in p.read_text() or "KillAfterRound" in p.read_text()]
    assert [p.relative_to(root).as_posix() for p in found] == ["testing.py"]


def test_the_evaluator_runs_one_protocol_per_measured_kind() -> None:
    config = RunConfig(algo="fedavg", model="mlp", num_clients=5, rounds=1, new_clients=0.2, out="unused")
    server = Harness(prepare(config))
    evaluator = server.federation.evaluator
    assert [type(p) for p in evaluator.protocols] == [ClientProtocol, NewClientProtocol]
    assert evaluator.finetuning is None
    assert server.federation.traffic == Traffic() and server.federation.traffic_total == Traffic()
    records: list[dict] = []
    server.run(records.append)
    (record,) = records
    assert record["bytes_up"] == server.federation.traffic.up == record["bytes_up_cum"] > 0
    assert record["bytes_down"] == server.federation.traffic.down == server.federation.traffic_total.down > 0


def test_evaluation_sets_drop_empty_splits() -> None:
    sets = EvaluationSets.given([3, 4], num_val=[0, 0], new_clients=[1], num_backdoor=[0, 0])
    assert sets.num_val is None and sets.num_backdoor is None and sets.new_clients == (1,)
    assert np.array_equal(sets.num_test, [3, 4])


def test_one_held_out_protocol_serves_the_held_out_domain_and_the_backdoor() -> None:
    class Counting:  # an executor stand-in: every sample counted correct
        def evaluate(self, program: object, jobs: list) -> list[np.ndarray]:
            return [np.array([sizes[k] for k in job.client_ids]) for job in jobs]

    class Global:
        has_global_model, program = True, None

        def global_model(self) -> dict:
            return {}

    sizes = {0: 5, 1: 7, 2: 9}
    ood = HeldOutProtocol(Global(), Counting(), "ood_acc", "ood", [0, 1], np.array([5, 5]), shared=True)  # type: ignore[arg-type]
    asr = HeldOutProtocol(Global(), Counting(), "asr", "backdoor", [1, 2], np.array([7, 9]))  # type: ignore[arg-type]
    assert ood.measure(1) == ({"ood_acc": 1.0}, {}) and asr.measure(1) == ({"asr": 1.0}, {})
