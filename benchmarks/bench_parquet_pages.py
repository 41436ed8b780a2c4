#!/usr/bin/env python3
"""Benchmark: where pyarrow's resident pages come from when sftdata reads a Parquet file.

    python benchmarks/bench_parquet_pages.py FILE.parquet

Reads FILE with sftdata's Parquet reader in this process (Linux only) and counts the
resident pages of pyarrow's files (its C++ libraries and Python modules) at three moments:

1. pyarrow's C++ libraries loaded alone (``dlopen``, in the order they depend on each
   other): what the dynamic loader and the libraries' static initialisers touch;
2. then ``pyarrow._parquet`` imported (``pyarrow.lib``'s and ``_parquet``'s module set-up);
3. then FILE read to its end (the code run while decoding and converting rows).

Each page is placed by ``/proc/self/pagemap``: present or not, file-backed or anonymous
(a library's page written at load, e.g. relocated pointers, is a private anonymous copy),
and by the file's ELF section headers, so the table says which part of which library
each MiB is (``.text`` code, ``.rela.dyn`` relocation records, ``.data.rel.ro`` relocated
pointers, ``.dynstr`` / ``.dynsym`` symbol tables). These are the pages that
``bench_inputs.py`` counts as "pyarrow's files" in a Parquet run's peak.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import os
import re
import struct
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from sftdata.sources.parquet import ParquetReader, pyarrow_parquet  # noqa: E402

PAGE = 4096
SECTION = struct.Struct("<IIQQQQIIQQ")  # an ELF64 section header


def elf_sections(path: str) -> list[tuple[int, int, str]]:
    """(start, end, name) of the file ranges of an ELF64 file's sections."""
    with open(path, "rb") as f:
        head = f.read(64)
        shoff = struct.unpack_from("<Q", head, 0x28)[0]
        entsize, count, names_index = struct.unpack_from("<HHH", head, 0x3A)
        f.seek(shoff)
        raw = f.read(entsize * count)
        headers = [SECTION.unpack_from(raw, i * entsize) for i in range(count)]
        f.seek(headers[names_index][4])
        names = f.read(headers[names_index][5])
    out = []
    for name, kind, _flags, _addr, offset, size, *_ in headers:
        if kind != 8 and size:  # 8: NOBITS (.bss), not in the file
            out.append((offset, offset + size, names[name:names.index(b"\0", name)].decode()))
    return sorted(out)


def resident(match: str = "/pyarrow/") -> collections.Counter:
    """KiB resident per (file, file-backed|anonymous, section) for mappings whose path has ``match``."""
    counts: collections.Counter = collections.Counter()
    sections: dict[str, list] = {}
    with open("/proc/self/maps") as maps, open("/proc/self/pagemap", "rb") as pagemap:
        for line in maps:
            parts = line.split()
            if len(parts) < 6 or match not in parts[5]:
                continue
            path = parts[5]
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            offset = int(parts[2], 16)
            secs = sections.setdefault(path, elf_sections(path))
            pagemap.seek(lo // PAGE * 8)
            entries = pagemap.read((hi - lo) // PAGE * 8)
            for i in range((hi - lo) // PAGE):
                entry = struct.unpack_from("<Q", entries, i * 8)[0]
                if not entry >> 63 & 1:  # not present
                    continue
                at = offset + i * PAGE
                names = sorted({n for s, e, n in secs if s < at + PAGE and e > at}) or ["(headers)"]
                kind = "file" if entry >> 61 & 1 else "anon"
                counts[(os.path.basename(path), kind, "+".join(names) if len(names) <= 2 else "(several)")] += 4
    return counts


def libraries(pa_dir: Path) -> list[Path]:
    """pyarrow's C++ libraries that ``pyarrow.lib`` loads, dependencies first."""
    order = ["libarrow.so", "libarrow_compute.so", "libarrow_acero.so", "libparquet.so", "libarrow_dataset.so",
             "libarrow_substrait.so", "libarrow_python.so"]
    found = []
    for stem in order:
        hits = [p for p in pa_dir.glob(stem + ".*") if re.fullmatch(r"\.\d+", p.name[len(stem):])]  # its soname
        found += hits[:1]
    return found


def show(title: str, counts: collections.Counter, before: collections.Counter | None = None, top: int = 12):
    diff = collections.Counter(counts)
    if before is not None:
        diff.subtract(before)
    total = sum(diff.values())
    file_kib = sum(v for k, v in diff.items() if k[1] == "file")
    print(f"{title}: {total / 1024:.1f} MiB (file-backed {file_kib / 1024:.1f}, anonymous {(total - file_kib) / 1024:.1f})")
    per_lib = collections.Counter()
    for k, v in diff.items():
        per_lib[k[0]] += v
    print("   by file: " + ", ".join(f"{name} {v / 1024:.1f}" for name, v in per_lib.most_common() if v >= 100))
    for (name, kind, section), v in diff.most_common(top):
        if v >= 100:
            print(f"   {name:42s} {kind:4s} {section:22s} {v / 1024:6.2f} MiB")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("parquet", type=Path, help="a Parquet file sftdata can read")
    a = ap.parse_args()
    if not Path("/proc/self/pagemap").exists():
        sys.exit("needs Linux (/proc/self/pagemap)")
    import importlib.util

    pa_dir = Path(importlib.util.find_spec("pyarrow").submodule_search_locations[0])
    start = resident()
    for lib in libraries(pa_dir):
        ctypes.CDLL(str(lib), mode=os.RTLD_GLOBAL)
    loaded = resident()
    show("1. pyarrow's C++ libraries loaded (dlopen)", loaded, start)
    pyarrow_parquet(str(a.parquet))
    imported = resident()
    show("2. then pyarrow._parquet imported", imported, loaded, top=6)
    n = sum(1 for _ in ParquetReader(str(a.parquet), a.parquet.name, 64 << 20))
    read = resident()
    show(f"3. then {n:,} rows read", read, imported, top=8)
    show("all of pyarrow's files at the end", read, start, top=16)


if __name__ == "__main__":
    main()
