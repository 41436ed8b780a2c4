"""Connecting to Ray: an address given, ``RAY_ADDRESS``, or a local cluster started here.

Ray is an optional extra (``pip install 'sftdata[ray]'``): it is imported only when
``--engine ray`` is asked for, and its absence is a one-line error naming the extra.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
from dataclasses import dataclass

from ..errors import ConfigError, UsageError
from ..tasks import Engine, RayTasks
from ..tasks.ray_tasks import kept_raised

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


def ray_engine(address: str | None = None, **sizes: int | None) -> Engine:
    """pack's and verify's engine (``--engine ray``): their tasks (``pack.tasks``,
    ``verify.tasks``) as Ray tasks on the cluster at ``address`` (else ``RAY_ADDRESS``,
    else a local one), connected when a run starts; what the tasks send and how a stopped
    run ends are theirs and ``sftdata.tasks``'. ``sizes``: how much work one task takes
    (``tasks.Engine``): pack's ``shards_per_task`` (ranges of whole output shards) or
    ``rows_per_task`` (pieces of one; by default pieces where a split has fewer shards
    than ``TASKS_PER_CPU`` per CPU: ``pack.tasks.row_tasks``), verify's ``items_per_task``
    (a split of fewer shards than that is checked in parts of its shards' episodes or
    rows; the report is the same). Without Ray installed, a ``UsageError`` now, before
    anything is read or written."""
    import_ray()

    def start(stage_dir):
        cluster = connect(address)
        return RayTasks(cluster.ray, cpus=cluster.cpus, stage_dir=stage_dir)

    return Engine(start, sizes)


def check_engine(engine: str) -> str:
    if engine not in ENGINES:
        raise UsageError(f"--engine must be one of {', '.join(ENGINES)}, not {engine!r}")
    return engine


def connect(address: str | None = None) -> RayCluster:
    """The cluster at ``address`` (else ``RAY_ADDRESS``, else a local one started now);
    a cluster this process is already connected to is used as it is.

    An address is checked before Ray is asked (``check_address``): a malformed one, or a
    head nobody answers at, is one ``ConfigError`` naming the address, where it came from
    and the fix, at once (Ray itself would retry for minutes, printing its log lines, deaf
    to SIGTERM). Ray's own SIGTERM handler (it exits the process) is replaced by the one
    this process had, so SIGTERM stops a Ray run as it stops a local one."""
    ray = import_ray()
    if not ray.is_initialized():
        source = "--ray-address" if address else "RAY_ADDRESS"
        address = address or os.environ.get("RAY_ADDRESS") or None
        if address is None:  # a local cluster for this run: its workers are this run, not background work
            os.environ.setdefault(NICENESS_ENV, "0")  # Ray starts workers at nice 15; local workers run at 0
        else:
            check_address(address, source)
        on_term = signal.getsignal(signal.SIGTERM) if threading.current_thread() is threading.main_thread() else None
        try:
            # "local": a cluster of this run's own, even when another run's local cluster is up on this
            # machine (without it Ray joins the newest one, which ends when that run does)
            ray.init(address=address or "local", logging_level=logging.WARNING, log_to_driver=False,
                     include_dashboard=False, configure_logging=False)
        except ConnectionError as e:
            raise ConfigError(f"cannot reach the Ray cluster at {address} ({source}): {e}. {_FIX}") from None
        finally:
            if on_term is not None:
                signal.signal(signal.SIGTERM, kept_raised(on_term) if callable(on_term) else on_term)
    cpus = int(ray.cluster_resources().get("CPU", 1))
    return RayCluster(ray, max(1, cpus), address)


PROBE_S = 5.0  # how long the head of a cluster is given to accept a connection
_FIX = ("Start the cluster there (`ray start --head`), give its head's HOST:PORT (ray start prints it), or drop "
        "--ray-address and unset RAY_ADDRESS for a local cluster")


def check_address(address: str, source: str = "--ray-address") -> None:
    """``ConfigError`` (one line: the address, ``source``, the fix) unless ``address`` is
    ``auto``, ``local`` or ``[ray://]HOST:PORT`` whose head accepts a connection within
    ``PROBE_S`` seconds."""
    if address in ("auto", "local"):
        return
    rest = address[len("ray://"):] if address.startswith("ray://") else address
    host, sep, port = rest.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host  # [::1]:6379
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536 or "/" in host:
        raise ConfigError(f"{source} {address!r} is not a Ray address: give the HOST:PORT of the cluster's head "
                          f"(e.g. 10.0.0.5:6379), ray://HOST:PORT or auto, or drop --ray-address and unset "
                          f"RAY_ADDRESS for a local cluster")
    try:
        socket.create_connection((host, int(port)), timeout=PROBE_S).close()
    except OSError as e:
        why = "no answer" if isinstance(e, TimeoutError) else (e.strerror or str(e)).lower()
        raise ConfigError(f"cannot reach the Ray cluster at {address} ({source}): {why}. {_FIX}") from None
