"""Ray, the optional extra: importing it, joining or starting a cluster, shipping plugin code.

``pip install "pflbench[ray]"``. Without Ray every other part of pflbench works; ``--executor ray``
and ``sweep --ray`` end in one ``Error:`` line saying how to install it (``require_ray``).

``connect(address, num_cpus)``: ``address`` ``auto`` or ``HOST:PORT`` joins a running cluster
(``ray start --head`` / ``ray start --address=HOST:PORT``); without it a local Ray instance starts
with ``num_cpus`` CPUs (default: this machine's). A process that already called ``ray.init``
(tests, notebooks) keeps its instance.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
from types import ModuleType
from typing import Any

from pflbench.errors import ConfigError

INSTALL_HINT = 'Ray is not installed; install the extra: pip install "pflbench[ray]"'
# a local instance without the task-event and metrics reporting that only Ray's dashboard reads:
# runs ran ~5% faster with every core busy (2 cores, two runs at once, measured twice)
QUIET_SYSTEM_CONFIG = {
    "task_events_report_interval_ms": 0,
    "metrics_report_interval_ms": 100_000_000,
    "enable_metrics_collection": False,
}
TOKEN_NOTICE_LOGGER = "ray._private.authentication.authentication_token_setup"
PLUGIN_PREFIX = "pflbench_plugin_"  # module names of --plugin files (registry.load_plugin_file)


def require_ray() -> ModuleType:
    """The ``ray`` module, or a ConfigError (one ``Error:`` line in the CLI) saying how to get it."""
    try:
        import ray
    except ImportError as error:
        raise ConfigError(INSTALL_HINT) from error
    return ray


def connect(address: str | None = None, num_cpus: int | None = None) -> ModuleType:
    """Join the cluster at ``address`` (``auto`` or ``HOST:PORT``), or start a local instance."""
    ray = require_ray()
    if ray.is_initialized():
        return ray
    options: dict[str, Any] = {"include_dashboard": False, "logging_level": "warning", "log_to_driver": False}
    if address:
        check_reachable(address)
        try:
            ray.init(address=address, **options)
        except (ConnectionError, RuntimeError, ValueError) as error:
            raise ConfigError(
                f"--ray-address {address}: could not join a Ray cluster there ({error}); "
                "is one running (`ray start --head`)? With token authentication set "
                "RAY_AUTH_MODE=token and the cluster's token (~/.ray/auth_token)"
            ) from error
    else:
        # a new local instance turns token authentication on (RAY_AUTH_MODE unset) and says so in
        # a WARNING line at every start: not shown (the instance is this process's own)
        notice = logging.getLogger(TOKEN_NOTICE_LOGGER)
        level = notice.level
        notice.setLevel(logging.ERROR)
        try:
            ray.init(num_cpus=num_cpus or os.cpu_count() or 1, _system_config=QUIET_SYSTEM_CONFIG, **options)
        finally:
            notice.setLevel(level)
    return ray


CONNECT_TIMEOUT_S = 10.0  # ray.init waits minutes for a HOST:PORT where no cluster listens


def check_reachable(address: str, timeout: float = CONNECT_TIMEOUT_S) -> None:
    """ConfigError unless ``address`` is ``auto`` (or ``ray://…``, Ray Client) or a HOST:PORT
    that accepts a TCP connection within ``timeout`` seconds: fail fast instead of hanging."""
    if address == "auto" or "://" in address:
        return
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"--ray-address {address!r} is not auto or HOST:PORT (e.g. 10.0.0.1:6379)")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as error:
        raise ConfigError(
            f"--ray-address {address}: nothing answers there within {timeout:g} s "
            f"({error.strerror or error}); is a Ray head running (`ray start --head`)?"
        ) from None


def cluster_cpus(ray: ModuleType) -> int:
    return max(1, int(ray.cluster_resources().get("CPU", 1)))


def cluster_gpus(ray: ModuleType) -> int:
    return int(ray.cluster_resources().get("GPU", 0))


def ship_plugins_by_value(ray: ModuleType, *objects: Any) -> None:
    """Plugin classes (``--plugin FILE``) live in modules the workers cannot import: pickle the
    modules of ``objects``' classes by value instead of by reference."""
    for obj in objects:
        for cls in type(obj).__mro__:
            module = sys.modules.get(cls.__module__)
            if module is not None and cls.__module__.startswith(PLUGIN_PREFIX):
                ray.cloudpickle.register_pickle_by_value(module)
        if hasattr(obj, "modules"):  # an nn.Module: its submodules' classes too
            for sub in obj.modules():
                name = type(sub).__module__
                if name.startswith(PLUGIN_PREFIX) and name in sys.modules:
                    ray.cloudpickle.register_pickle_by_value(sys.modules[name])
