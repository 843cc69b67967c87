"""The thread policy: how many CPU threads a run's torch operations use.

A federated run is thousands of small operations (a client's minibatch through a small model).
Intra-op parallelism barely speeds those up, and when the cores are oversubscribed (a shared
node, a parallel sweep, other users) torch's worker threads spin and wait on each other at every
operation: a run that takes 2 s per round alone took 100 s next to a few busy processes. So a run
uses ``--threads 1`` unless told otherwise; 0 means torch's own default (all usable cores), for a
large model on a machine of its own. A parallel sweep (``--jobs N``) gives each run
``max(1, threads // N)`` threads (``threads_per_job``). The count changes a CPU run's numbers in
the last bits (torch's reductions split work by thread), so it is part of the run identity and
of the pretrained-backbone cache key (``config.identity.cpu_threads``).
"""

from __future__ import annotations

import os

DEFAULT_THREADS = 1


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity), else the machine's count."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def resolved_threads(threads: int) -> int:
    """The thread count ``--threads`` means: itself, or every usable core for 0."""
    return threads if threads > 0 else usable_cores()


def threads_per_job(threads: int, jobs: int) -> int:
    """Threads of each of ``jobs`` parallel runs sharing ``threads`` (0: every usable core)."""
    return max(1, resolved_threads(threads) // max(1, jobs))


def apply_threads(threads: int) -> int:
    """Set torch's intra-op (and, if still possible, inter-op) thread counts; returns the count.

    Inter-op threads can only be set before torch starts its inter-op pool (once per process);
    later calls keep the pool torch already made (it only serves ``torch.jit.fork``-style work)."""
    import torch

    count = resolved_threads(threads)
    if torch.get_num_threads() != count:
        torch.set_num_threads(count)
    try:
        torch.set_num_interop_threads(count)
    except RuntimeError:  # already set, or inter-op work has started in this process
        pass
    return count
