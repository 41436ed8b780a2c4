"""The types of the description files' fields that readers rely on, checked once where
the files are read (``reader``, ``serving_file``): a field of another type (a count that
is a string, a token id that is a list, ``stop_strings: true``) is a ``Problem`` naming
the file and the field, and the reader goes on without it, never an error deep inside a
command.

A schema is data: a dict of optional keys (``{"name": STR}``: when present, a string),
``Map(spec)`` (an object of any keys, each value ``spec``), ``List(spec)``, ``Opt(spec)``
(``spec`` or null) or a leaf (``COUNT``, ``INT``, ``ID``, ``STR``, ``BOOL``, ``NUMBER``,
``OBJECT``, ``ARRAY``). A missing key is never a problem here: older datasets
lack newer fields, and the checks that need a field say so.

>>> meta, problems = clean_fields({"splits": {"train": {"episodes": "3", "tokens": 9}}}, METADATA,
...                               "dataset_metadata.json", "fix")
>>> meta, [p.where for p in problems]
({'splits': {'train': {'tokens': 9}}}, ['splits.train.episodes'])
"""

from __future__ import annotations

from dataclasses import dataclass

from .format import Problem

ID_LIMIT = 2**32  # token ids are stored as uint16 or uint32
INT_LIMIT = 2**63  # what an int64 holds: larger values would wrap in numpy


@dataclass(frozen=True)
class Leaf:
    kind: str
    words: str  # what it must be, for a message: "a whole number >= 0"

    def ok(self, v) -> bool:
        is_int = isinstance(v, int) and not isinstance(v, bool)
        return {
            "count": is_int and 0 <= v < INT_LIMIT,
            "int": is_int and -INT_LIMIT <= v < INT_LIMIT,
            "id": is_int and 0 <= v < ID_LIMIT,
            "str": isinstance(v, str),
            "bool": isinstance(v, bool),
            "number": (is_int or isinstance(v, float)) and not isinstance(v, bool),
            "object": isinstance(v, dict),
            "array": isinstance(v, list),
        }[self.kind]


@dataclass(frozen=True)
class Map:
    value: object


@dataclass(frozen=True)
class List:
    item: object


@dataclass(frozen=True)
class Opt:
    spec: object


COUNT = Leaf("count", "a whole number >= 0")
INT = Leaf("int", "a whole number")
ID = Leaf("id", "a token id (a whole number from 0 to 2**32 - 1)")
STR = Leaf("str", "a string")
BOOL = Leaf("bool", "true or false")
NUMBER = Leaf("number", "a number")
OBJECT = Leaf("object", "a JSON object")
ARRAY = Leaf("array", "a JSON array")

# ---------------------------------------------------------------- dataset_metadata.json
FILE_RECORD = {"bytes": COUNT, "sha256": STR}
ITEM_COUNTS = {"episodes": COUNT, "tokens": COUNT, "trained_tokens": COUNT, "rows": COUNT, "segments": COUNT,
               "pairs": COUNT}
SHARD = {"name": STR, "files": Map(FILE_RECORD), "token_id_range": List(INT), "mask_value_range": List(NUMBER),
         **ITEM_COUNTS}
SPLIT = {"shards": List(SHARD), "row_len": COUNT, **ITEM_COUNTS}
SOURCE = {"path": STR, "bytes": Opt(COUNT), "sha256": Opt(STR), "records": Opt(COUNT), "first_record": Opt(COUNT)}
COUNTS = {"episodes": COUNT, "records_read": COUNT, "records_truncated": COUNT, "pairs_dropped": COUNT,
          "rejected": Map(COUNT), "repaired": Map(COUNT), "turns": Map(COUNT)}
PACKING = {"block_size": COUNT,  # row_len: ``format.packed_row_len`` "pad_token_id": Opt(ID), "pad_seq_id": INT, "strategy": STR,
           "overlong": STR, "seed": INT, "shard_tokens": COUNT, "segment_fields": List(STR)}
TOKENIZER_SUMMARY = {"eos_id": Opt(ID), "bos_id": Opt(ID), "vocab_size": COUNT, "name": Opt(STR),
                     "ranks_sha256": Opt(STR), "source": Opt(STR)}
METADATA = {
    "token_dtype": STR, "created_by": STR,  # format, format_version, kind: the reader's own checks
    "files": Map(FILE_RECORD), "splits": Map(SPLIT), "counts": COUNTS, "packing": PACKING,
    "options": OBJECT, "sources": List(SOURCE), "build": OBJECT,
    "tokenizer": TOKENIZER_SUMMARY, "tokenizer_identity": OBJECT, "warnings": ARRAY, "report": OBJECT,
    "source": {"path": STR, "kind": STR, "metadata_sha256": STR, "counts": COUNTS}, "pairs": Map(COUNT),
    "rows": Map(COUNT),
}

# ---------------------------------------------------------------- tokenizer_state.json
TOKENIZER_STATE = {
    "special_tokens": Map(ID), "base_special_tokens": Map(ID), "added_tokens": OBJECT, "eos_id": Opt(ID),
    "bos_id": Opt(ID), "pad_id": Opt(ID), "vocab_size": COUNT, "name": Opt(STR), "path": Opt(STR),
    "pat_str": Opt(STR), "ranks_sha256": Opt(STR), "source": Opt(STR), "format": STR, "version": INT,
    "kind": Opt(STR), "mask_rule": OBJECT, "engine": OBJECT, "token_strings": Map(Opt(STR)),
}

# ---------------------------------------------------------------- serving.json
SERVING = {
    "format": STR, "version": INT, "stop_ids": List(ID), "stop_strings": List(STR), "pad_id": Opt(ID),
    "pad_string": Opt(STR), "pad_is_stop": BOOL, "add_special_tokens": BOOL, "chat_format": STR,
    "generation_prompt": Opt(STR),
    "bos": {"id": Opt(ID), "policy": STR, "string": Opt(STR)},
    "generation_config": {"bos_token_id": Opt(ID), "eos_token_id": Opt(ID), "pad_token_id": Opt(ID)},
    "tokenizer": {"kind": STR, "name": Opt(STR), "sha256": Opt(STR)}, "marker_rule": Opt(Map(STR)),
}


def _kind(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, int):
        return f"the number {v}" if abs(v) < 10**12 else "a number out of range"
    return {float: "a decimal number", str: "a string", list: "an array", dict: "an object"}.get(type(v), "junk")


def _wrong(spec, v) -> str | None:
    """What ``spec`` wants when ``v`` is not of its shape at this level, else None."""
    if isinstance(spec, Opt):
        return None if v is None else _wrong(spec.spec, v)
    if isinstance(spec, Leaf):
        return None if spec.ok(v) else spec.words
    if isinstance(spec, (dict, Map)):
        return None if isinstance(v, dict) else "a JSON object"
    return None if isinstance(v, list) else "a JSON array"


def _clean(value, spec, path: str, out: list[tuple[str, str, object]]):
    """``value`` without the parts that are not of ``spec``'s shape (a dict's key, a list's
    item removed), each recorded in ``out`` as (path, what it must be, the value)."""
    if isinstance(spec, Opt):
        return None if value is None else _clean(value, spec.spec, path, out)
    if isinstance(spec, dict):
        return {k: _clean(v, spec[k], _at(path, k), out) if k in spec else v for k, v in value.items()
                if k not in spec or _kept(v, spec[k], _at(path, k), out)}
    if isinstance(spec, Map):
        return {k: _clean(v, spec.value, _at(path, k), out) for k, v in value.items()
                if _kept(v, spec.value, _at(path, k), out)}
    if isinstance(spec, List):
        return [_clean(v, spec.item, f"{path}[{i}]", out) for i, v in enumerate(value)
                if _kept(v, spec.item, f"{path}[{i}]", out)]
    return value


def _kept(value, spec, path: str, out: list) -> bool:
    want = _wrong(spec, value)
    if want is not None:
        out.append((path, want, value))
    return want is None


def _at(path: str, key) -> str:
    key = str(key)
    if "." in key or not key:  # a file name as a key: files["serving.json"].bytes
        return f'{path}["{key}"]'
    return f"{path}.{key}" if path else key


def clean_fields(obj: dict, schema: dict, file: str, fix: str, check: str = "metadata",
                 named: int = 3) -> tuple[dict, list[Problem]]:
    """``obj`` (a parsed JSON object) without the fields that are not of the shape
    ``schema`` gives (so every reader sees them as absent, as in an older dataset), and
    one ``Problem`` for each of the first ``named`` of them, then one saying how many more."""
    found: list[tuple[str, str, object]] = []
    kept = _clean(obj, schema, "", found)
    out = [Problem(check, file, path, f"{path} is {_kind(v)}, not {want}: the file was damaged or edited", fix,
                   code="field_type") for path, want, v in found[:named]]
    if len(found) > named:
        out.append(Problem(check, file, "", f"{len(found) - named} more field(s) of the wrong type", fix,
                           code="field_type"))
    return kept, out
