"""``--precision`` (util.precision) and the GPU-path habits of issue 25 item 4: fp32 stays the
numbers and folder names of runs made before the option; bf16 autocasts the forward passes and
losses (parameters stay fp32), runs end to end (FedAvg, a LoRA run, the vmap executor), is part of
the run identity and of the pretrained-backbone key; a bad value or a device without bf16 is one
ConfigError line; evaluation counts do not depend on the evaluation batch; the batch loop reads
nothing back to the host per batch."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from click.testing import CliRunner
from torch import nn

from pflbench import ClientProgram
from pflbench.cli import cli
from pflbench.config import run_config
from pflbench.config.identity import identity_settings
from pflbench.config.run_config import RunConfig
from pflbench.data.dataset import FederatedData, TensorDataset
from pflbench.engine.evaluation import evaluate_heads, head_split
from pflbench.engine.local import LocalTrainer
from pflbench.engine.types import ClientJob, EvalJob
from pflbench.errors import ConfigError
from pflbench.models.pretrain import backbone_key
from pflbench.registry import ALGORITHMS
from pflbench.runs.api import run_experiment
from pflbench.runs.prepare import plan_run, prepare
from pflbench.sweeps.reference import is_lora_only
from pflbench.testing import ALGORITHM_OVERRIDES, Harness
from pflbench.util import precision as precision_module
from pflbench.util.precision import autocast, check_precision, eval_batch

BASE = RunConfig(algo="fedavg", dataset="digits", model="mlp", num_clients=4, rounds=2)
LORA = {"lora_targets": "fc1,fc2", "backbone": "random"}  # LoRA on the mlp: no pretraining
# The folder of BASE as named before --precision existed (computed at commit 79c044a): an fp32
# run keeps it, so sweeps and `run` find the runs made before the option.
FOLDER_BEFORE_PRECISION = "fedavg__digits__a0.5__s0__1f7c59f2"


def last_round(config: RunConfig, algo_options: dict[str, Any] | None = None) -> tuple[dict[str, Any], Path]:
    summary = run_experiment(config, algo_options)
    run_dir = Path(summary["run_dir"])
    lines = (run_dir / "rounds.jsonl").read_text().splitlines()
    return json.loads(lines[-1]), run_dir


# ----------------------------------------------------------------------------- the helpers


def test_autocast_is_nothing_for_fp32_and_bf16_autocast_otherwise() -> None:
    with autocast("cpu", "fp32"):
        assert not torch.is_autocast_enabled("cpu")
    with autocast(torch.device("cpu"), "bf16"):
        assert torch.is_autocast_enabled("cpu")
        assert torch.get_autocast_dtype("cpu") == torch.bfloat16
    with pytest.raises(ValueError, match="fp16"):
        autocast("cpu", "fp16")


def test_the_config_and_the_helper_offer_the_same_precisions() -> None:
    assert run_config.PRECISIONS == precision_module.PRECISIONS == ("fp32", "bf16")
    with pytest.raises(ConfigError, match=r"--precision 'fp16' is not one of: fp32, bf16"):
        check_precision("fp16", torch.device("cpu"))


def test_the_evaluation_batch_is_large_on_an_accelerator_only() -> None:
    assert eval_batch("cpu", 256) == 256 and eval_batch(torch.device("cpu"), 1024) == 1024
    assert eval_batch("cuda", 256) == precision_module.ACCELERATOR_EVAL_BATCH == 4096
    assert eval_batch("cuda:1", 8192) == 8192  # never smaller than the caller's


def test_a_bf16_forward_is_the_bf16_product_returned_in_fp32() -> None:
    """y = (x_bf16 · W_bf16ᵀ + b_bf16) as float32: autocast, with the parameters left float32."""
    torch.manual_seed(0)
    model = nn.Linear(5, 3)
    data = type("Data", (), {"device": torch.device("cpu")})()
    job = ClientJob(0, 1, 0, {}, {})
    x = torch.randn(4, 5)
    trainer = LocalTrainer(model, data, job, 4, "bf16")  # type: ignore[arg-type]
    output = trainer.forward(trainer.params, x)
    by_hand = F.linear(x.bfloat16(), model.weight.bfloat16(), model.bias.bfloat16()).float()
    assert output.dtype == torch.float32 and torch.equal(output, by_hand)
    assert model.weight.dtype == torch.float32  # autocast, not a cast of the model
    functional = trainer.forward({n: p.detach().clone() for n, p in trainer.params.items()}, x)
    assert torch.equal(functional, by_hand)  # the functional_call path too
    with trainer.autocast():  # inside the batch loop's autocast: the model's own (bf16) output
        inside = trainer.forward(trainer.params, x)
    assert inside.dtype == torch.bfloat16 and torch.equal(inside.float(), by_hand)
    fp32 = LocalTrainer(model, data, job, 4).forward(dict(model.named_parameters()), x)
    assert torch.equal(fp32, model(x)) and not torch.equal(fp32, by_hand)


def test_bf16_is_refused_in_one_line_on_a_device_without_it(monkeypatch: pytest.MonkeyPatch) -> None:
    check_precision("bf16", torch.device("cpu"))  # CPUs run bf16 autocast (emulated where no bf16 units)
    check_precision("fp32", torch.device("cuda"))  # fp32 asks nothing of the device
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla V100-SXM2-16GB")
    with pytest.raises(ConfigError) as error:
        check_precision("bf16", torch.device("cuda:0"))
    message = str(error.value)
    assert "\n" not in message and "--precision bf16" in message and "Tesla V100" in message
    assert message.endswith("use --precision fp32")


def test_a_bad_precision_is_one_line_naming_the_valid_ones(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"--precision 'fp16' is not one of: fp32, bf16"):
        plan_run(dataclasses.replace(BASE, precision="fp16"))
    out = tmp_path / "out"
    argv = ["run", "--model", "mlp", "--num-clients", "3", "--rounds", "1", "--precision", "fp16", "--out", str(out)]
    result = CliRunner().invoke(cli, argv)
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert "fp16" in lines[0] and "fp32" in lines[0] and "bf16" in lines[0]
    assert not out.exists()


# ----------------------------------------------------------------------------- identity and numbers


def test_fp32_keeps_the_folder_and_never_enters_autocast(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = dataclasses.replace(BASE, out=str(tmp_path))
    plan = plan_run(config)
    assert plan.run_dir.name == FOLDER_BEFORE_PRECISION
    assert "precision" not in identity_settings(plan.config, plan.algorithm_class, plan.hparams)
    explicit = plan_run(dataclasses.replace(config, precision="fp32"))
    assert explicit.run_dir == plan.run_dir

    def no_autocast(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("an fp32 run entered torch.autocast")

    monkeypatch.setattr(torch, "autocast", no_autocast)  # the fp32 path is the code path before the option
    record, run_dir = last_round(config)
    assert run_dir.name == FOLDER_BEFORE_PRECISION and record["round"] == 2


@pytest.mark.parametrize(
    "name, settings, algo_options",
    [
        ("fedavg", {}, {}),
        ("fedavg_lora", {"lora_rank": 4, "optimizer": "adam", "lr": 0.003, **LORA}, {}),
        ("fedsdg", {"algo": "fedsdg", "lr": 0.003, **LORA}, {}),
    ],
)
def test_bf16_runs_end_to_end_close_to_fp32(name: str, settings: dict, algo_options: dict, tmp_path: Path) -> None:
    config = dataclasses.replace(BASE, out=str(tmp_path), **settings)
    fp32, fp32_dir = last_round(config, algo_options)
    bf16, bf16_dir = last_round(dataclasses.replace(config, precision="bf16"), algo_options)
    assert bf16_dir != fp32_dir  # its own folder: bf16 is part of the identity
    saved = json.loads((bf16_dir / "config.json").read_text())
    assert saved["precision"] == "bf16" or saved.get("config", {}).get("precision") == "bf16"
    plan = plan_run(dataclasses.replace(config, precision="bf16"))
    assert identity_settings(plan.config, plan.algorithm_class, plan.hparams)["precision"] == "bf16"
    assert bf16["train_loss"] != fp32["train_loss"]  # autocast did run
    assert abs(bf16["train_loss"] - fp32["train_loss"]) < 0.05 * fp32["train_loss"]
    assert abs(bf16["pers_acc"] - fp32["pers_acc"]) < 0.05, (bf16["pers_acc"], fp32["pers_acc"])


def test_bf16_under_the_vmap_executor_is_close_to_sequential(tmp_path: Path) -> None:
    config = dataclasses.replace(BASE, out=str(tmp_path), rounds=1, batch_size=16, precision="bf16")
    sequential, _ = last_round(config)
    vectorized, _ = last_round(dataclasses.replace(config, executor="vmap"))
    fp32, _ = last_round(dataclasses.replace(config, precision="fp32"))
    # vmap in fp32 matches sequential fp32 to ~1e-7 (relative; test_vmap_executor): a larger gap
    # shows that the vmap loss ran under autocast (measured: ~1e-4)
    assert abs(vectorized["train_loss"] - fp32["train_loss"]) > 1e-5 * fp32["train_loss"]
    assert abs(vectorized["train_loss"] - sequential["train_loss"]) < 1e-2 * sequential["train_loss"]
    assert abs(vectorized["pers_acc"] - sequential["pers_acc"]) < 0.05


def test_bf16_is_part_of_the_backbone_key_and_fp32_keeps_the_old_key() -> None:
    dataset = TensorDataset(torch.zeros(10, 4), torch.zeros(10, dtype=torch.long), 2, "zeros")
    public = np.arange(4)
    config = RunConfig(model="mlp", public_frac=0.2)
    fp32 = backbone_key(config, dataset, public, torch.device("cpu"))
    bf16 = backbone_key(dataclasses.replace(config, precision="bf16"), dataset, public, torch.device("cpu"))
    assert "precision" not in fp32 and bf16 == {**fp32, "precision": "bf16"}


# ----------------------------------------------------------------------------- evaluation batch


def test_evaluation_counts_do_not_depend_on_the_batch(tmp_path: Path) -> None:
    harness = Harness(prepare(dataclasses.replace(BASE, algo="fedper", out=str(tmp_path), rounds=1)))
    harness.run()
    executor, data = harness.executor, harness.data
    harness.load_global_model()
    everyone = torch.cat(data.test_indices)
    counts = {batch: int(executor._count_correct(everyone, batch=batch).sum()) for batch in (1, 7, 256, 4096)}
    assert len(set(counts.values())) == 1 and counts[4096] > 0, counts
    states = [harness.algorithm.personal_model(k) for k in range(data.num_clients)]
    split = head_split(harness.model, states)
    assert split is not None
    per_batch = [evaluate_heads(harness.model, executor.tensors, data, split, batch=b) for b in (3, 256, 4096)]
    assert all(np.array_equal(per_batch[0], counts_of_batch) for counts_of_batch in per_batch[1:]), per_batch


def test_evaluation_batch_on_a_gpu_is_the_large_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """``_count_correct`` asks ``eval_batch`` with the data's device (here a stand-in)."""
    seen: list[tuple[str, int]] = []

    def spy(device: Any, cpu_batch: int) -> int:
        seen.append((str(device), cpu_batch))
        return 4096

    from pflbench.engine import executor as executor_module

    monkeypatch.setattr(executor_module, "eval_batch", spy)
    dataset = TensorDataset(torch.randn(50, 4), torch.randint(0, 2, (50,)), 2, "random")
    data = FederatedData(dataset, [np.arange(40)], [np.arange(40, 50)], torch.device("cpu"))
    model = nn.Linear(4, 2)
    hits = executor_module.SequentialExecutor(model, data)._count_correct(data.test_indices[0])
    assert seen == [("cpu", 256)] and len(hits) == 10


# ----------------------------------------------------------------------------- host syncs


SYNCS = ("item", "tolist", "numpy", "__float__", "__int__", "__bool__", "__index__")


def count_host_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Each call of a Tensor method that reads a value back to the host (a device sync on a GPU)."""
    calls: list[str] = []
    for name in SYNCS:
        original = getattr(torch.Tensor, name)

        def wrapper(self: torch.Tensor, *args: Any, _original: Any = original, _name: str = name, **kwargs: Any) -> Any:
            calls.append(_name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, wrapper)
    return calls


@pytest.mark.parametrize(
    "settings",
    [{}, {"algo": "fedsdg", "lr": 0.003, **LORA}],
    ids=["fedavg", "fedsdg_lora"],
)
def test_the_batch_loop_reads_nothing_back_per_batch(
    settings: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One client's local update with 1 and with 4 epochs (4× the batches) reads the same number
    of values back to the host: none per batch (FedAvg, and FedSDG's LoRA, gates and penalties)."""
    reads = []
    for epochs in (1, 4):
        config = dataclasses.replace(
            BASE, out=str(tmp_path / str(epochs)), local_epochs=epochs, batch_size=8, **settings
        )
        harness = Harness(prepare(config))
        received = harness.broadcast(0)
        with monkeypatch.context() as patch:
            calls = count_host_reads(patch)
            harness.train_client(0, received)
        reads.append(len(calls))
    batches = -(-harness.data.num_train[0] // 8)
    assert batches >= 3 and reads[0] == reads[1], reads


def test_pretrain_bf16_builds_the_backbone_a_bf16_run_finds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``pflbench pretrain --precision bf16`` pretrains under autocast and caches under the bf16
    key: a bf16 LoRA run reuses it, an fp32 one does not."""
    monkeypatch.setenv("PFLBENCH_CACHE", str(tmp_path / "cache"))  # an empty backbone cache of its own
    model = ["--model", "mlp", "--model-option", "hidden=32"]
    argv = ["pretrain", *model, "--public-frac", "0.2", "--pretrain-epochs", "1", "--precision", "bf16"]
    result = CliRunner().invoke(cli, argv)
    assert result.exit_code == 0 and "pretrained mlp" in result.output, result.output
    config = dataclasses.replace(
        BASE,
        out=str(tmp_path),
        rounds=1,
        model_option=("hidden=32",),
        lora_rank=2,
        lora_targets="fc1,fc2",
        public_frac=0.2,
        pretrain_epochs=1,
    )
    bf16 = prepare(dataclasses.replace(config, precision="bf16"))
    fp32 = prepare(config)
    assert bf16.resolved["backbone"]["cache"] == "hit"
    assert fp32.resolved["backbone"]["cache"] == "created"


@pytest.mark.parametrize("algo", ["fedper", "fedcp"])
def test_bf16_head_split_evaluation_counts_every_clients_own_head(algo: str, tmp_path: Path) -> None:
    """The body once, then each client's head loaded in place: under bf16 each head must be read
    as loaded (autocast's weight cache once served the first client's head to all: FedCP's
    pers_acc fell to chance while client by client it was 0.51)."""
    config = dataclasses.replace(BASE, algo=algo, precision="bf16", rounds=3, out=str(tmp_path))
    harness = Harness(prepare(config))
    harness.federation.run()
    algorithm, executor = harness.algorithm, harness.executor
    clients = list(range(config.num_clients))
    states = [algorithm.personal_model(k) for k in clients]
    one_by_one = [int(executor.evaluate(algorithm.program, [EvalJob(states[k], (k,), "test")])[0][0]) for k in clients]
    together = executor.evaluate_split(algorithm.program, states, clients, "test")
    assert together is not None  # the head split holds for these models
    assert together.tolist() == one_by_one
    assert len(set(one_by_one)) > 1  # the clients' heads differ: a stale head would show


# Algorithms whose client program runs its own loop (overrides ``local_update``): their forwards
# must enter ``LocalTrainer.autocast()`` themselves (issue 25: six of them once ran fp32 under bf16).
CUSTOM_LOOPS = [
    name
    for name in ALGORITHMS.names()
    if ALGORITHMS.get(name).program_class.local_update is not ClientProgram.local_update
]


def test_custom_loops_are_found() -> None:
    assert {"fedas", "feddbe", "fedkd", "fedpac", "fedproto", "pflmoe"} <= set(CUSTOM_LOOPS)


@pytest.mark.parametrize("algo", CUSTOM_LOOPS)
def test_every_linear_forward_of_a_bf16_run_is_autocast(algo: str, tmp_path) -> None:
    """Local training (custom loops included), evaluation and new-client adaptation of a bf16 run:
    no linear layer runs outside autocast (a global forward hook watches every module)."""
    outside: list[str] = []

    def watch(module: nn.Module, args: Any, output: Any) -> None:
        if isinstance(module, nn.Linear) and not torch.is_autocast_enabled("cpu"):
            outside.append(type(module).__name__)

    settings = {"optimizer": "adam", "lr": 0.01, **ALGORITHM_OVERRIDES.get(algo, {})}
    lora_settings = LORA if is_lora_only(algo) else {}  # refused as inert where no LoRA trains
    config = dataclasses.replace(
        BASE, algo=algo, precision="bf16", new_clients=0.25, out=str(tmp_path), **lora_settings, **settings
    )
    handle = torch.nn.modules.module.register_module_forward_hook(watch)
    try:
        run_experiment(config)
    finally:
        handle.remove()
    assert not outside, f"{algo}: {len(outside)} linear forwards outside autocast"
