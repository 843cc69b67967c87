"""Each client's private tensors between rounds."""

from __future__ import annotations

from pflbench.engine.types import Tensors, tensor_bytes


class ClientStateStore:
    """Each client's private tensors, set on first write; unseen clients read the initial state.

    Memory is O(clients seen × private size); shared and frozen weights are never stored here.
    The store keeps the dicts it is given (executors return fresh tensors)."""

    def __init__(self, initial: Tensors) -> None:
        self.initial = initial
        self._states: dict[int, Tensors] = {}

    def get(self, client_id: int) -> Tensors:
        return self._states.get(client_id, self.initial)

    def put(self, client_id: int, state: Tensors) -> None:
        self._states[client_id] = state

    def __contains__(self, client_id: int) -> bool:
        return client_id in self._states

    def clients(self) -> list[int]:
        return sorted(self._states)

    def nbytes(self) -> int:
        return sum(tensor_bytes(state) for state in self._states.values())
