"""The bounded readers: JSON Lines and JSON arrays read in chunks, records beyond the
bound measured but never held, and the structure errors of an array."""

from __future__ import annotations

import io
import json
import random

import pytest

from sftdata.sources.json_array import ArrayError, ArrayReader
from sftdata.sources.lines import LineReader, TooLarge


class Reads(io.RawIOBase):
    """A stream that records the size of every read asked of it."""

    def __init__(self, data: bytes):
        self._f = io.BytesIO(data)
        self.asked: list[int] = []

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        self.asked.append(len(b))
        return self._f.readinto(b)


def expected_lines(data: bytes, max_bytes: int):
    """What LineReader must yield, from a whole-text split (the reference)."""
    out = []
    lines = data.split(b"\n")
    if lines[-1] == b"":
        lines.pop()
    for i, line in enumerate(lines):
        if line.strip():
            out.append((i, line if len(line) <= max_bytes else TooLarge(len(line))))
    return out, len(lines)


def test_line_reader_equals_a_whole_text_split_for_any_chunking():
    rng = random.Random(7)
    for _ in range(3000):
        parts = [bytes(rng.choice(b"ab \t\r") for _ in range(rng.choice([0, 0, 1, 3, 9, 17, 30])))
                 for _ in range(rng.randint(0, 12))]
        data = b"\n".join(parts) + (b"\n" if rng.random() < 0.5 else b"")
        max_bytes, chunk = rng.choice([1, 2, 4, 8, 100]), rng.choice([1, 2, 3, 5, 7, 64])
        reader = LineReader(io.BytesIO(data), max_bytes, chunk)
        want, count = expected_lines(data, max_bytes)
        assert list(reader) == want, (data, max_bytes, chunk)
        assert reader.lines == count


def test_a_line_beyond_the_bound_is_measured_not_kept():
    data = b'{"a": 1}\n' + b"x" * 10_000 + b"\n\n" + b"y" * 50 + b"\n" + b'{"b": 2}'
    reader = LineReader(Reads(data), 100, 64)
    assert list(reader) == [(0, b'{"a": 1}'), (1, TooLarge(10_000)), (3, b"y" * 50), (4, b'{"b": 2}')]
    assert reader.lines == 5


def test_lines_are_read_in_chunks_of_the_read_size():
    stream = Reads(b"\n".join([b'{"a": 1}'] * 50_000))
    assert len(list(LineReader(stream, 1 << 20, 4096))) == 50_000
    assert max(stream.asked) == 4096


@pytest.mark.parametrize("seed", range(4))
def test_array_reader_finds_every_item_of_any_array(seed):
    rng = random.Random(seed)
    scalars = [1, -2.5, True, None, 'a\\"b\\\\', 'x"y', "\\", '\\\\"', "", "q,]}[{", "é ✓ 𝄞"]

    def value(depth=0):
        r = rng.random()
        if depth > 3 or r < 0.3:
            return rng.choice(scalars)
        if r < 0.65:
            return [value(depth + 1) for _ in range(rng.randint(0, 3))]
        return {rng.choice(["k", '"', "\\", "]"]) + str(i): value(depth + 1) for i in range(rng.randint(0, 3))}

    for _ in range(400):
        items = [json.dumps(value(), indent=rng.choice([None, 1]), ensure_ascii=False).encode()
                 for _ in range(rng.randint(0, 6))]
        sep, end = rng.choice([b",", b" , ", b",\n  "]), rng.choice([b"]", b" ]\n", b"\n]  \n"])
        text = rng.choice([b"[", b"  [ "]) + sep.join(items) + end
        # an item's size is its bytes up to the comma (or ]) that ends it, whitespace included
        sizes = [len(x) + (len(sep) - len(sep.lstrip()) if i < len(items) - 1 else len(end) - len(end.lstrip()))
                 for i, x in enumerate(items)]
        max_bytes, chunk = rng.choice([1, 5, 20, 10**9]), rng.choice([1, 2, 3, 7, 64, 4096])
        reader = ArrayReader(io.BytesIO(text), max_bytes, chunk)
        assert list(reader) == [(i, x if n <= max_bytes else TooLarge(n)) for i, (x, n) in enumerate(zip(items, sizes))]
        assert reader.items == len(items)


def test_an_array_item_beyond_the_bound_is_read_past_in_chunks():
    big = b'{"messages": "' + b"\\\\" * 3_000_000 + b'\\"' + b"z" * 1_000 + b'"}'
    data = b'[{"a": 1}, ' + big + b', [2, "]"]]'
    stream = Reads(data)
    reader = ArrayReader(stream, 1 << 20, 65536)
    assert list(reader) == [(0, b'{"a": 1}'), (1, TooLarge(len(big))), (2, b'[2, "]"]')]
    assert max(stream.asked) == 65536


def test_deep_nesting_costs_a_counter_not_a_stack():
    deep = b"[" * 100_000 + b"]" * 100_000
    assert [(i, len(x)) for i, x in ArrayReader(io.BytesIO(b"[" + deep + b", 1]"), 1 << 20)] == \
        [(0, 200_000), (1, 1)]


@pytest.mark.parametrize("text, message", [
    (b"[1,2", "the array ends before its closing ] (inside item 1), at byte 4"),
    (b'["abc', "the array ends before its closing ] (inside item 0), at byte 5"),
    (b"[{]", "the array ends before its closing ] (inside item 0), at byte 3"),
    (b"[  ", "the array ends before its closing ] (after 0 items), at byte 3"),
    (b"[1,,2]", "an empty item (two commas, or a comma after [) where item 1 should be, at byte 3"),
    (b"[,1]", "an empty item (two commas, or a comma after [) where item 0 should be, at byte 1"),
    (b"[1,]", "a comma before the closing ] (after item 0), at byte 3"),
    (b"[1] x", "text after the closing ] of the array (1 items), at byte 4"),
    (b"[1][2]", "text after the closing ] of the array (1 items), at byte 3"),
    (b"[}]", "a } that closes nothing in item 0, at byte 1"),
    (b"{}", "the input does not start with [, at byte 0"),
])
def test_a_broken_array_structure_is_an_error_with_its_offset(text, message):
    with pytest.raises(ArrayError) as e:
        list(ArrayReader(io.BytesIO(text), 100, 2))
    assert str(e.value) == message


def test_what_is_inside_an_item_is_for_the_decoder():
    """The reader finds item boundaries; ``[1 2]`` is one (invalid) item, rejected later."""
    assert list(ArrayReader(io.BytesIO(b'[1 2, {"a": [}], 3]'), 100)) == [(0, b"1 2"), (1, b'{"a": [}]'), (2, b"3")]
