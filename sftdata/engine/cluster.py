"""Connecting to Ray: an address given, ``RAY_ADDRESS``, or a local cluster started here.

Ray is an optional extra (``pip install 'sftdata[ray]'``): it is imported only when
``--engine ray`` is asked for, and its absence is a one-line error naming the extra.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from ..errors import ConfigError, UsageError

ENGINES = ("local", "ray")
NICENESS_ENV = "RAY_worker_niceness"


@dataclass(frozen=True)
class RayCluster:
    """A connected cluster: the ``ray`` module and the CPUs it offers."""

    ray: object
    cpus: int
    address: str | None


def import_ray():
    try:
        import ray  # optional: the `ray` extra
    except ImportError:
        raise UsageError("--engine ray needs Ray: pip install 'sftdata[ray]'") from None
    return ray


def check_engine(engine: str) -> str:
    if engine not in ENGINES:
        raise UsageError(f"--engine must be one of {', '.join(ENGINES)}, not {engine!r}")
    return engine


def connect(address: str | None = None) -> RayCluster:
    """The cluster at ``address`` (else ``RAY_ADDRESS``, else a local one started now);
    a cluster this process is already connected to is used as it is."""
    ray = import_ray()
    if not ray.is_initialized():
        address = address or os.environ.get("RAY_ADDRESS") or None
        if address is None:  # a local cluster for this run: its workers are this run, not background work
            os.environ.setdefault(NICENESS_ENV, "0")  # Ray starts workers at nice 15; local workers run at 0
        try:
            ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False,
                     include_dashboard=False, configure_logging=False)
        except ConnectionError as e:
            raise ConfigError(f"cannot reach the Ray cluster at {address}: {e}. Start it (`ray start --head`), "
                              f"or drop --ray-address and unset RAY_ADDRESS for a local cluster") from None
    cpus = int(ray.cluster_resources().get("CPU", 1))
    return RayCluster(ray, max(1, cpus), address)
