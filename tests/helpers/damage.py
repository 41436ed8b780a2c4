"""Seeded damage to a dataset folder, for the fuzz test of every reader: one mutation at
a time of one file's bytes (flips, truncation, huge index values, a file removed) or of
one field of a JSON description file (wrong types, missing keys, huge or negative numbers,
nested junk). ``mutate(folder, rng)`` changes ``folder`` in place and returns what it did,
in words, for a failure message."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import orjson

JSON_FILES = ("dataset_metadata.json", "tokenizer_state.json", "serving.json")
BINARY_SUFFIXES = (".bin", ".idx")
# values a damaged or hand-edited JSON field may hold: every JSON type, the edges of the
# integers a reader might index with, and junk nested inside containers
JUNK = (None, True, False, 0, 1, -1, 2, 7, 2**31, 2**53 + 1, 2**63, 2**64 - 1, -(2**63), 10**30, 1.5, -0.0, 1e308,
        "", "x", "uint8", "int64", "float32", "<|EOS|>", "train", "../../etc", "\x00\x1b[31m", [], [None],
        [1, "a", {}], [[[]]], {}, {"a": None}, {"name": 5, "files": []}, {"bytes": {}, "sha256": 3},
        {"": {"": [2**64 - 1]}})
HUGE_INDEX = (2**63, 2**64 - 1, 2**62, 2**32, 2**31, 2**16, 1, 0)


def _paths(obj, prefix=()):
    """Every (key path) inside a JSON value, containers and leaves alike."""
    out = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.append((*prefix, k))
            out += _paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out.append((*prefix, i))
            out += _paths(v, (*prefix, i))
    return out


def _at(obj, path):
    for k in path:
        obj = obj[k]
    return obj


def _junk(rng):
    v = JUNK[int(rng.integers(len(JUNK)))]
    return orjson.loads(orjson.dumps(v)) if not isinstance(v, int) or abs(v) < 2**63 else v


def mutate_json(path: Path, rng) -> str:
    """Change one field of the JSON object in ``path``: replace its value with junk,
    delete it, or add a junk sibling; or, rarely, damage the whole file."""
    name = path.name
    how = int(rng.integers(20))
    if how == 0:
        path.write_bytes(path.read_bytes()[: int(rng.integers(path.stat().st_size))])
        return f"{name}: truncated"
    if how == 1:
        path.write_bytes(_dumps(_junk(rng)))
        return f"{name}: replaced by a bare JSON value"
    obj = orjson.loads(path.read_bytes())
    paths = _paths(obj)
    key = paths[int(rng.integers(len(paths)))]
    parent = _at(obj, key[:-1])
    op = int(rng.integers(4))
    if op == 0 and isinstance(parent, dict):
        del parent[key[-1]]
        what = f"{name}: removed {'.'.join(map(str, key))}"
    elif op == 1 and isinstance(parent, dict):
        parent["junk"] = _junk(rng)
        what = f"{name}: added junk beside {'.'.join(map(str, key))}"
    else:
        parent[key[-1]] = value = _junk(rng)
        what = f"{name}: {'.'.join(map(str, key))} = {value!r}"
    path.write_bytes(_dumps(obj))
    return what


def _dumps(obj) -> bytes:
    try:
        return orjson.dumps(obj)
    except TypeError:  # an int past 64 bits: JSON allows it, orjson does not write it
        return json.dumps(obj).encode()


def mutate_binary(path: Path, rng) -> str:
    """Damage one binary file: flip bytes, truncate, extend, set a uint64 (an index) or a
    token id to an edge value, or empty it."""
    data = bytearray(path.read_bytes())
    name = f"{path.parent.name}/{path.name}"
    how = int(rng.integers(7))
    if how == 0 and data:
        for _ in range(int(rng.integers(1, 4))):
            i = int(rng.integers(len(data)))
            data[i] ^= 1 << int(rng.integers(8))
        what = "bytes flipped"
    elif how == 1 and data:
        n = int(rng.integers(len(data)))
        data = data[:n]
        what = f"truncated to {n} bytes"
    elif how == 2:
        extra = rng.integers(0, 256, int(rng.integers(1, 40)), dtype=np.uint8).tobytes()
        data += extra
        what = f"{len(extra)} random bytes appended"
    elif how in (3, 4) and len(data) >= 8:
        i = int(rng.integers(len(data) // 8)) * 8
        v = HUGE_INDEX[int(rng.integers(len(HUGE_INDEX)))]
        data[i:i + 8] = int(v).to_bytes(8, "little")
        what = f"uint64 at byte {i} = {v}"
    elif how == 5 and len(data) >= 4:
        i = int(rng.integers(len(data) // 4)) * 4
        data[i:i + 4] = (0xFFFFFFFF if rng.integers(2) else 0x7FFFFFFF).to_bytes(4, "little")
        what = f"uint32 at byte {i} set huge"
    else:
        data = bytearray()
        what = "emptied"
    path.write_bytes(bytes(data))
    return f"{name}: {what}"


def mutate(folder: Path, rng) -> str:
    """One seeded mutation of one file of the dataset at ``folder`` (or a file removed)."""
    files = sorted(p for p in folder.rglob("*") if p.is_file() and (p.name in JSON_FILES or
                                                                    p.suffix in BINARY_SUFFIXES))
    path = files[int(rng.integers(len(files)))]
    if rng.integers(40) == 0:
        path.unlink()
        return f"{path.relative_to(folder)}: removed"
    if path.name in JSON_FILES:
        return mutate_json(path, rng)
    return mutate_binary(path, rng)
