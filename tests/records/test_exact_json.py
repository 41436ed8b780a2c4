"""exact_json: orjson's speed and verdicts, with integers beyond 64 bits kept exact and refused where rendered."""

from __future__ import annotations

import orjson
import pytest

from sftdata.errors import RecordError
from sftdata.records.conversation import decode_json
from sftdata.records.exact_json import InexactJSON, check_exact, loads


def test_loads_keeps_long_integers_exact_and_everything_else_as_orjson():
    assert loads(b'{"a": 123456789012345678901, "b": [0.1, -2]}') == {"a": 123456789012345678901, "b": [0.1, -2]}
    assert loads('{"s": "1234567890123456789012 in a string", "n": 18446744073709551615}') == {
        "s": "1234567890123456789012 in a string", "n": 2**64 - 1}
    assert orjson.loads(b"123456789012345678901") == 1.2345678901234568e20  # what loads avoids
    with pytest.raises(orjson.JSONDecodeError):
        loads(b'{"a": NaN, "b": 12345678901234567890123}')  # orjson judges validity, not json
    # JSON text inside a record (str, any script) and the other byte types take the same check
    assert loads('{"日本": "é", "n": -123456789012345678901}') == {"日本": "é", "n": -123456789012345678901}
    assert loads('{"n": 1234567890123456789, "m": "١٢٣٤٥٦٧٨٩٠١٢٣٤٥٦٧٨٩٠"}')["n"] == 1234567890123456789
    for raw in (bytearray(b"[123456789012345678901]"), memoryview(b"[123456789012345678901]")):
        assert loads(raw) == [123456789012345678901]


def test_check_exact_names_the_first_integer_beyond_64_bits():
    check_exact({"a": [2**64 - 1, -2**63, 1.5, True, None, "x"]})
    with pytest.raises(InexactJSON, match=r"the integer 18446744073709551616 does not fit in 64 bits"):
        check_exact({"a": [1, {"b": 2**64}]})
    with pytest.raises(InexactJSON, match=r"the integer -9223372036854775809 does not fit"):
        check_exact([-2**63 - 1])


def test_too_deep_to_read_exactly_is_an_invalid_record():
    deep = "[" * 990 + "12345678901234567890123" + "]" * 990  # orjson accepts it, json recurses too deep
    with pytest.raises(RecordError, match="nested too deeply to read its long numbers exactly") as e:
        decode_json(deep.encode(), "f:line 1")
    assert e.value.reason == "invalid_json"
