"""The replay library: vectorised CSV equals the csv module's."""

import csv
import io

import numpy as np
import pytest

from sftdata.replay import csv_bytes


def reference(columns) -> bytes:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    cols = []
    for c in columns:
        if isinstance(c, tuple):
            cols.append([c[1][i] for i in c[0]])
        else:
            cols.append(["" if v < 0 else v for v in np.asarray(c).tolist()])
    w.writerows(zip(*cols))
    return buf.getvalue().encode()


@pytest.mark.parametrize("seed", range(5))
def test_csv_bytes_equals_the_csv_module(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 300))
    big = rng.integers(-1, 2**40, n)
    small = rng.integers(-1, 12, n)
    zeros = np.zeros(n, dtype=np.int64)
    names = ["shard_00000", "s1", "a_much_longer_shard_name", "x"]
    text = (rng.integers(0, len(names), n), names)
    cols = [small, text, big, zeros, np.full(n, -1), rng.integers(0, 10**9, n)]
    assert csv_bytes(cols) == reference(cols)


def test_csv_bytes_edge_values():
    v = np.array([0, 9, 10, 99, 100, 2**31 - 1, 2**31, 2**62, -1])
    assert csv_bytes([v]).decode().split("\n")[:-1] == ["0", "9", "10", "99", "100", str(2**31 - 1), str(2**31),
                                                        str(2**62), ""]
    assert csv_bytes([np.empty(0, np.int64), (np.empty(0, np.int64), ["a"])]) == b""
