"""``torch.func.grad`` without importing ``torch._dynamo``: the vmap executor's first round.

Every reverse-mode transform of ``torch.func`` (``grad``, ``vjp``) differentiates with
``torch._functorch.eager_transforms._autograd_grad``, which wraps its ``torch.autograd.grad`` call
in ``torch._dynamo.compiled_autograd._disable()``. That attribute access imports all of
``torch._dynamo``, paid once by the first ``vmap(grad(...))`` step of a process while nothing in
a run ever turns compiled autograd on: measured (torch 2.14, busy 2-core CPU, FedAvg on digits,
mlp, 10 clients, alternating) the vmap run's first round took 2.8–4.7 s with the import and
1.1–1.4 s without (round 2: 0.1 s; ~15 s was reported on a busier one). ``engine.optim``
replaces ``torch.optim`` for the same reason.

``autograd_without_dynamo()`` swaps that one function, for the duration of the ``with``, for a
copy that switches compiled autograd off through the C function the context manager itself calls
(``torch._C._dynamo.compiled_autograd.set_autograd_compiler``; no Python import) and restores it
after: the same ``torch.autograd.grad`` call with the same arguments, so the same bits. Once
``torch._dynamo`` is imported anyway (the user's ``torch.compile``), torch's own function runs;
where this torch lacks either piece, or its function has another signature, nothing is swapped
(the import is paid, nothing else).

Not avoided here: under ``vmap`` the cross-entropy's ``nll_loss`` runs torch's Python
decomposition, whose ``torch._check`` imports ``torch.fx.experimental.symbolic_shapes`` (sympy,
~1 s once); it is inside the program's loss, which this module does not change.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

try:
    from torch._functorch import eager_transforms as _eager
except ImportError:  # pragma: no cover - a torch without functorch's module layout
    _eager = None  # type: ignore[assignment]


def _compiler_switch() -> Callable[..., Any] | None:
    """``set_autograd_compiler`` of torch's C extension, or None where this torch has none."""
    compiled = getattr(getattr(torch._C, "_dynamo", None), "compiled_autograd", None)
    return getattr(compiled, "set_autograd_compiler", None)


def _autograd_grad(
    outputs: Sequence[torch.Tensor],
    inputs: Sequence[torch.Tensor],
    grad_outputs: Sequence[torch.Tensor] | None = None,
    retain_graph: bool = False,
    create_graph: bool = True,
) -> tuple[torch.Tensor, ...]:
    """torch's ``eager_transforms._autograd_grad`` (autograd.grad for outputs that may not
    depend on the inputs), with compiled autograd switched off by the C call instead of the
    Python context manager of ``torch._dynamo``."""
    switch = _compiler_switch()
    if "torch._dynamo" in sys.modules or switch is None:  # imported anyway: torch's own path
        return _ORIGINAL(outputs, inputs, grad_outputs, retain_graph, create_graph)  # type: ignore[misc]
    if grad_outputs is None:
        diff_outputs = tuple(out for out in outputs if out.requires_grad)
    else:
        result = tuple((out, go) for out, go in zip(outputs, grad_outputs) if out.requires_grad)
        diff_outputs, grad_outputs = zip(*result) if result else ((), ())  # type: ignore[assignment]
    if len(diff_outputs) == 0:
        return tuple(torch.zeros_like(inp) for inp in inputs)
    prior = switch(None, False)
    try:
        grad_inputs = torch.autograd.grad(
            diff_outputs,
            inputs,
            grad_outputs,
            retain_graph=retain_graph,
            create_graph=create_graph,
            allow_unused=True,
        )
    finally:
        switch(*prior)
    return tuple(torch.zeros_like(inp) if gi is None else gi for gi, inp in zip(grad_inputs, inputs))


_ORIGINAL = getattr(_eager, "_autograd_grad", None)
# the torch function this module copies, as of torch 2.14 (another signature: not swapped)
_COPIED = ("outputs", "inputs", "grad_outputs", "retain_graph", "create_graph")


def _swappable() -> bool:
    if _ORIGINAL is None or _compiler_switch() is None:
        return False
    return tuple(inspect.signature(_ORIGINAL).parameters) == _COPIED


@contextmanager
def autograd_without_dynamo() -> Iterator[None]:
    """While inside, ``torch.func.grad``/``vjp`` do not import ``torch._dynamo`` (same results)."""
    if not _SWAPPABLE:
        yield
        return
    previous = _eager._autograd_grad
    _eager._autograd_grad = _autograd_grad
    try:
        yield
    finally:
        _eager._autograd_grad = previous


_SWAPPABLE = _swappable()
