"""Where and how the clients' computation runs: the device, the arithmetic, the executor and
the CPU threads. The device kind, bf16, vmap and a CPU thread count other than 1 change the
numbers (in the last bits), so they are part of the run identity; Ray gives sequential's numbers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pflbench.config.settings.base import RunReads, SettingGroup, check_choice, option, refuse_first
from pflbench.util.threads import resolved_threads

MAX_THREADS = 1024  # torch's thread pool crashes far above any machine's cores (100000: a segfault)
PRECISIONS = ("fp32", "bf16")  # --precision (util.precision)
SAME_NUMBERS_AS_SEQUENTIAL = ("sequential", "ray")  # executors left out of the identity


@dataclass(frozen=True)
class ExecutionSettings(SettingGroup):
    title = "Execution"
    omitted_at_default = ("executor", "threads", "precision")

    device: str = option("cpu", "Torch device: cpu, cuda, cuda:1, ...")
    precision: str = option(
        "fp32",
        "Arithmetic of the model's forward passes and losses (local training, evaluation, "
        "pretraining): fp32, or bf16 autocast (parameters, gradients and optimizer state stay "
        "fp32; faster on GPUs with bf16 units; a device without bf16 is refused). bf16 is part "
        "of the run identity.",
        choices=PRECISIONS,
    )
    executor: str = option(
        "sequential",
        "How clients train: sequential (one after another); vmap "
        "(together, vectorized with torch.func; same numbers to floating-point "
        "tolerance); ray (on Ray actors in parallel, same numbers).",
        choices=("sequential", "vmap", "ray"),
    )
    ray_address: str | None = option(None, "Ray cluster to join (auto or HOST:PORT); unset: a local Ray instance.")
    ray_workers: int | None = option(None, "Ray actors training clients [default: cluster CPUs, ≤ clients/round].")
    threads: int = option(
        1,
        "CPU threads of torch's operations; 0 = every usable core. 1 suits the "
        "small models of FL benchmarks and never collapses on a busy or shared machine "
        "(many threads spin-wait on each other there). On the CPU the count changes the "
        "numbers in the last bits, so a count other than 1 is part of the run identity.",
    )

    def spec(self, sampled_per_round: int) -> ExecutorSpec:
        return ExecutorSpec(
            kind=self.executor,
            device=self.device,
            sampled_per_round=sampled_per_round,
            ray_address=self.ray_address,
            ray_workers=self.ray_workers,
        )

    def validate(self, config: Any) -> None:
        check_choice("precision", self.precision, PRECISIONS)
        refuse_first(
            [
                (
                    0 <= self.threads <= MAX_THREADS,
                    f"--threads must be in [0, {MAX_THREADS}] (0 = every usable core), got {self.threads}",
                ),
            ]
        )

    def identity(self, run: RunReads) -> dict[str, Any]:
        read: dict[str, Any] = {"device": self.device.split(":")[0]}
        if self.executor not in SAME_NUMBERS_AS_SEQUENTIAL:
            read["executor"] = self.executor
        # --precision bf16 changes the numbers; fp32 is left out, so older runs keep their folders
        if self.precision != self.default("precision"):
            read["precision"] = self.precision
        threads = cpu_threads(self)
        if threads is not None and threads != self.default("threads"):
            read["threads"] = threads
        return read


@dataclass(frozen=True)
class ExecutorSpec:
    """What an executor may read when it is built (``engine.executor.make_executor``)."""

    kind: str
    device: str
    sampled_per_round: int
    ray_address: str | None
    ray_workers: int | None


def cpu_threads(config: Any) -> int | None:
    """The CPU thread count that shapes a run's numbers (None on an accelerator; ``config``: a
    ``RunConfig`` or ``ExecutionSettings``). torch's CPU reductions split their work by thread,
    so 1 and 2 threads give different numbers (measured for mlp, cnn, cnn_bn and the ViT of a
    LoRA run, issue 25): the count is part of the identity (left out at 1, so runs made before
    it counted keep their folders)."""
    return resolved_threads(config.threads) if config.device.split(":")[0] == "cpu" else None
