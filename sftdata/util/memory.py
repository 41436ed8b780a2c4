"""Sizes checked before allocating: a block size or batch size that cannot fit in memory
is a clear error with both figures, never a run the out-of-memory killer ends.

:func:`check_fits` is pure (the figures in, an error or nothing out); :func:`available_bytes`
asks the system what it can give now.
"""

from __future__ import annotations

import os

from ..errors import UsageError

SHARE = 0.8  # never plan to use more than this share of what is available


def available_bytes() -> int | None:
    """Memory the system can give now (Linux ``MemAvailable``; elsewhere the physical
    memory), or None when the system does not say."""
    try:
        with open("/proc/meminfo", "rb") as f:
            for line in f:
                if line.startswith(b"MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"):
        if abs(n) < 1024 or unit == "EiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return f"{n:,.1f} EiB"


def check_fits(need: int, what: str, fix: str, available: int | None = None) -> None:
    """Raise :class:`UsageError` when ``need`` bytes exceed ``SHARE`` of ``available``
    (default: :func:`available_bytes`), naming both figures, ``what`` needs them and
    ``fix``.

    For example 10 GiB for a batch on a machine with 8 GiB available gives
    ``a batch of 4 x 1,000,000,000 tokens needs about 10.0 GiB of memory, but this
    machine has 8.0 GiB available: lower batch_size``.
    """
    if available is None:
        available = available_bytes()
    if available is not None and need > SHARE * available:
        raise UsageError(f"{what} needs about {human(need)} of memory, but this machine has {human(available)} "
                         f"available: {fix}")
