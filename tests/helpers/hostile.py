"""Hostile inputs made fast: gzip files that expand to gigabytes, written in milliseconds,
and a child process that reports its peak memory. Shared by tests/safety/test_adversarial.py
and benchmarks/bench_inputs.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import zlib
from pathlib import Path

from tests.helpers.paths import ROOT


def _times(mat: list[int], vec: int) -> int:
    s = i = 0
    while vec:
        if vec & 1:
            s ^= mat[i]
        vec >>= 1
        i += 1
    return s


def crc32_combine(crc1: int, crc2: int, len2: int) -> int:
    """zlib's crc32_combine: the CRC-32 of A + B from crc(A), crc(B) and len(B)."""
    if len2 <= 0:
        return crc1
    odd = [0xEDB88320] + [1 << n for n in range(31)]
    even = [_times(odd, odd[n]) for n in range(32)]
    odd = [_times(even, even[n]) for n in range(32)]
    while True:
        even = [_times(odd, odd[n]) for n in range(32)]
        if len2 & 1:
            crc1 = _times(even, crc1)
        len2 >>= 1
        if not len2:
            break
        odd = [_times(even, even[n]) for n in range(32)]
        if len2 & 1:
            crc1 = _times(odd, crc1)
        len2 >>= 1
        if not len2:
            break
    return crc1 ^ crc2


def crc32_repeated(block: bytes, count: int) -> int:
    """CRC-32 of ``block * count`` without building it."""
    result, power, size = 0, zlib.crc32(block), len(block)
    while count:
        if count & 1:
            result = crc32_combine(result, power, size)
        power = crc32_combine(power, power, size)
        size *= 2
        count >>= 1
    return result


def gzip_repeated(path: Path, prefix: bytes, block: bytes, count: int, suffix: bytes = b"") -> int:
    """Write a valid gzip file of ``prefix + block * count + suffix`` and return that size.

    Each block is deflated after a full flush (the compressor forgets its history), so
    every block compresses to the same bytes: they are compressed once and written
    ``count`` times. A 1 GiB run of one byte becomes about 1 MB of file, in milliseconds."""
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    head = c.compress(prefix) + c.flush(zlib.Z_FULL_FLUSH)
    one = c.compress(block) + c.flush(zlib.Z_FULL_FLUSH)
    again = c.compress(block) + c.flush(zlib.Z_FULL_FLUSH)
    if one != again:
        raise ValueError("the block does not deflate to the same bytes twice")
    tail = c.compress(suffix) + c.flush(zlib.Z_FINISH)
    crc = crc32_combine(crc32_combine(zlib.crc32(prefix), crc32_repeated(block, count), len(block) * count),
                        zlib.crc32(suffix), len(suffix))
    size = len(prefix) + len(block) * count + len(suffix)
    with open(path, "wb") as f:
        f.write(b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff")  # deflate, no name, no time
        f.write(head)
        chunk = one * 256
        for _ in range(count // 256):
            f.write(chunk)
        f.write(one * (count % 256))
        f.write(tail)
        f.write((crc & 0xFFFFFFFF).to_bytes(4, "little") + (size & 0xFFFFFFFF).to_bytes(4, "little"))
    return size


def record(i: int) -> bytes:
    return json.dumps({"messages": [{"role": "user", "content": f"question {i}"},
                                    {"role": "assistant", "content": f"answer {i}"}]}).encode()


# a child that runs the command and prints the peak resident memory of its own children (the
# command and its workers): RUSAGE_CHILDREN of the test process would also count earlier children
_MEASURE = """
import json, resource, subprocess, sys, time
t = time.perf_counter()
p = subprocess.run(sys.argv[1:], capture_output=True)
print(json.dumps({"code": p.returncode, "stdout": p.stdout.decode(errors="replace"),
                  "stderr": p.stderr.decode(errors="replace"), "seconds": time.perf_counter() - t,
                  "peak_kib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}))
"""


def run_measured(args: list[str], cwd: Path | None = None) -> dict:
    """``python -m sftdata ARGS`` in a child: exit code, stdout, stderr, seconds and
    ``peak_mib`` (the largest resident set of the command or any of its workers)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run([sys.executable, "-c", _MEASURE, sys.executable, "-m", "sftdata", *args],
                         capture_output=True, env=env, cwd=cwd, check=True)
    res = json.loads(out.stdout)
    res["peak_mib"] = res.pop("peak_kib") / 1024  # Linux reports KiB
    return res


def timed(fn, *args, **kw):
    t = time.perf_counter()
    out = fn(*args, **kw)
    return out, time.perf_counter() - t
