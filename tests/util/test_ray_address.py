"""``--ray-address``: a HOST:PORT where nothing listens fails fast with one line (ray.init would
wait minutes), and a malformed address is named; probing needs no Ray."""

from __future__ import annotations

import socket
import time

import pytest

from pflbench.errors import ConfigError
from pflbench.util.ray_cluster import check_reachable


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_nothing_listening_fails_fast() -> None:
    started = time.perf_counter()
    with pytest.raises(ConfigError, match=r"--ray-address 127\.0\.0\.1:\d+: nothing answers there"):
        check_reachable(f"127.0.0.1:{free_port()}", timeout=2.0)
    assert time.perf_counter() - started < 3.0


@pytest.mark.parametrize("address", ["localhost", "host:port", "10.0.0.1:0", ":6379", "1.2.3.4:70000"])
def test_malformed_addresses_are_named(address: str) -> None:
    with pytest.raises(ConfigError, match="is not auto or HOST:PORT"):
        check_reachable(address)


def test_a_listening_port_and_auto_pass() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        check_reachable(f"127.0.0.1:{server.getsockname()[1]}", timeout=2.0)
    check_reachable("auto")
    check_reachable("ray://head:10001")
