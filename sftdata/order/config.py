"""The loader configuration: one dataclass, loaded from JSON (with ``inherits``) or XML.

JSON (the training script's config file; keys the loader does not know, such as model
sizes or the learning rate, are kept in ``extra`` for the training script)::

    {"inherits": "150M.json", "batch_size": 8, "block_size": 512, "epoch_seed": 42}

``inherits`` names a parent file, resolved relative to the file that names it (or, when
no such file exists there, relative to the current directory, as in older configs);
chains are followed and cycles are an error. Keys of the child override the parent.

XML: a ``<training>`` element (the root, or anywhere in the file) whose children are the
fields below; every tag must be known. XML is parsed by ``defusedxml``: a DOCTYPE (and
so any ENTITY) declaration is refused in every encoding, and no entity is ever
expanded::

    <training>
      <dataset_mode>sft_episode</dataset_mode>
      <batch_sampling_mode>epoch</batch_sampling_mode>
      <epoch_seed>1337</epoch_seed>
      <pad_token_id>100257</pad_token_id>
    </training>

Configs are read as hostile input: at most ``MAX_CONFIG_BYTES``, JSON nested at most
``MAX_DEPTH`` levels, integers of at most ``MAX_INT_DIGITS`` digits, finite numbers only
(no ``NaN`` / ``Infinity``). Every problem is a ``ConfigError`` naming the file.
"""

from __future__ import annotations

import codecs
import dataclasses
import difflib
import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .batches import DEFAULT_SEED, SAMPLING_MODES

DATASET_MODES = ("token_stream", "sft_episode")
TOKEN_DTYPES = ("uint16", "uint32")  # what a dataset's tokens.bin may hold, by name (store/format.py)
_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")
_NONE = ("", "none", "null")
MAX_CONFIG_BYTES = 16 << 20  # a config is a page of settings; this is far beyond any real one
MAX_DEPTH = 64  # JSON nesting levels
MAX_INT_DIGITS = 30
log = logging.getLogger("sftdata.loader")


@dataclass
class LoaderConfig:
    """Everything the loader needs. ``None`` means "decide from the dataset":
    ``dataset_mode`` is auto-detected, ``batch_sampling_mode`` is ``epoch`` for
    ``sft_episode`` and ``random`` for ``token_stream``, ``pad_token_id`` is the
    tokenizer's EOS."""

    batch_size: int = 8
    block_size: int = 512
    dataset_mode: str | None = None
    batch_sampling_mode: str | None = None
    epoch_seed: int = DEFAULT_SEED
    epoch_shuffle: bool = True
    epoch_drop_last: bool = True
    pad_token_id: int | None = None
    episode_min_tokens: int = 2
    use_loss_mask: bool = False
    token_dtype: str | None = None  # only for flat datasets without metadata (default uint32)
    batch_tokens: int | None = None  # batches of up to this many tokens instead of batch_size rows (episodes)
    pad_to_multiple_of: int | None = None  # packed rows: each sequence padded to a multiple of N
    audit_dir: str | None = None
    extra: dict = field(default_factory=dict)  # keys for the training script, kept as given
    source: str | None = field(default=None, compare=False)  # where it was loaded from (messages)

    def __post_init__(self) -> None:
        self.validate()

    # -- validation ---------------------------------------------------------------------
    def validate(self) -> None:
        where = f" (in {self.source})" if self.source else ""
        for name in ("batch_size", "block_size", "episode_min_tokens"):
            v = getattr(self, name)
            if not _is_int(v) or v < 1:
                raise ConfigError(f"{name} must be an integer >= 1, got {v!r}{where}")
        if not _is_int(self.epoch_seed) or not 0 <= self.epoch_seed < 2**32:
            raise ConfigError(f"epoch_seed must be an integer in 0..{2**32 - 1}, got {self.epoch_seed!r}{where}")
        for name in ("batch_tokens", "pad_to_multiple_of"):
            v = getattr(self, name)
            if v is not None and (not _is_int(v) or v < 1):
                raise ConfigError(f"{name} must be null or an integer >= 1, got {v!r}{where}")
        if self.pad_token_id is not None and (not _is_int(self.pad_token_id) or self.pad_token_id < 0):
            raise ConfigError(f"pad_token_id must be null or an integer >= 0, got {self.pad_token_id!r}{where}")
        for name in ("epoch_shuffle", "epoch_drop_last", "use_loss_mask"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be true or false, got {getattr(self, name)!r}{where}")
        for name, choices in (("dataset_mode", DATASET_MODES), ("batch_sampling_mode", SAMPLING_MODES),
                              ("token_dtype", TOKEN_DTYPES)):
            v = getattr(self, name)
            if v is not None and v not in choices:
                raise ConfigError(f"{name} {v!r} is not valid{where}; choose one of: {', '.join(choices)}")
        if self.audit_dir is not None and not isinstance(self.audit_dir, str):
            raise ConfigError(f"audit_dir must be a folder path (string) or null, got {self.audit_dir!r}{where}")

    # -- construction ---------------------------------------------------------------------
    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls) if f.name not in ("extra", "source"))

    @classmethod
    def from_dict(cls, d: dict, source: str | None = None) -> LoaderConfig:
        """Known keys become fields (type-checked); other keys go to ``extra``."""
        if not isinstance(d, dict):
            raise ConfigError(f"a config must be a JSON object, got {type(d).__name__}"
                              + (f" (in {source})" if source else ""))
        known = set(cls.field_names())
        kw = {k: v for k, v in d.items() if k in known}
        extra = {k: v for k, v in d.items() if k not in known and k != "inherits"}
        for k in extra:  # a typo of a loader key would silently change nothing: say so
            close = difflib.get_close_matches(k, sorted(known), n=1, cutoff=0.8)
            if close:
                log.warning("config key %r is not a loader setting (kept for the training script); "
                            "did you mean %r?%s", k, close[0], f" (in {source})" if source else "")
        return cls(**kw, extra=extra, source=source)

    @classmethod
    def from_file(cls, path: str | Path, extra_keys: dict[str, type] | None = None, *,
                  other_tags: str = "error") -> LoaderConfig:
        """Load a ``.json`` (with ``inherits``) or ``.xml`` (``<training>``) config.

        ``extra_keys`` names the training script's own keys and their types
        (``{"learning_rate": float, ...}``): an XML tag among them is parsed with that
        type into ``extra``; any other unknown XML tag is an error naming it, unless
        ``other_tags="keep"`` (a reader that needs only the loader's keys, such as
        ``replay-order``, given a training script's file): then it goes to ``extra`` as
        text. JSON keys the loader does not know always go to ``extra``."""
        p = Path(path)
        if p.is_dir():
            raise ConfigError(f"config file {p} is a folder; give a .json or .xml config file")
        if not p.is_file():
            raise ConfigError(f"config file {p} does not exist")
        if p.suffix.lower() == ".xml" or _looks_like_xml(_read_config(p, 512)):
            return cls.from_dict(read_xml_training(p, extra_keys or {}, keep_other=other_tags == "keep"),
                                 source=str(p))
        return cls.from_dict(read_json_chain(p), source=str(p))

    def to_dict(self) -> dict:
        """Known fields plus ``extra`` keys, as one flat dict (JSON-able)."""
        d = {k: getattr(self, k) for k in self.field_names()}
        return {**self.extra, **d}

    def replace(self, **changes) -> LoaderConfig:
        return dataclasses.replace(self, **changes)


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


# ---------------------------------------------------------------------------- JSON
def read_json_chain(path: Path) -> dict:
    """The merged dict of ``path`` and its ``inherits`` ancestors (child keys win)."""
    chain: list[Path] = []
    layers: list[dict] = []
    cur = Path(path)
    while True:
        real = cur.resolve()
        if real in chain:
            cycle = " -> ".join(str(p) for p in chain[chain.index(real):] + [real])
            raise ConfigError(f"config inherits chain has a cycle: {cycle}; remove one of the 'inherits'")
        chain.append(real)
        d = _read_json(cur)
        layers.append(d)
        parent = d.get("inherits")
        if parent is None:
            break
        if not isinstance(parent, str) or not parent:
            raise ConfigError(f"{cur}: 'inherits' must be a path to another JSON config, got {parent!r}")
        cur = _resolve_parent(cur, parent)
    merged: dict = {}
    for d in reversed(layers):
        merged.update(d)
    merged.pop("inherits", None)
    return merged


def _resolve_parent(child: Path, parent: str) -> Path:
    beside = child.parent / parent
    if beside.is_file():
        return beside
    here = Path(parent)
    if here.is_file():
        return here
    raise ConfigError(f"{child}: inherits {parent!r}, but neither {beside} (relative to the config) nor "
                      f"{here.resolve()} (relative to the current folder) exists")


def _read_config(p: Path, limit: int | None = None) -> bytes:
    """The bytes of a config file (the first ``limit`` of them), refusing huge files."""
    try:
        size = p.stat().st_size
        if size > MAX_CONFIG_BYTES:
            raise ConfigError(f"config file {p} is {size:,} bytes; a config holds settings, at most "
                              f"{MAX_CONFIG_BYTES:,} bytes: give the right file")
        with open(p, "rb") as f:
            return f.read(limit if limit is not None else MAX_CONFIG_BYTES + 1)
    except FileNotFoundError:
        raise ConfigError(f"config file {p} does not exist") from None
    except OSError as e:
        raise ConfigError(f"config file {p} cannot be read: {e.strerror or e}") from None


def _looks_like_xml(head: bytes) -> bool:
    for bom, codec in ((codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"),
                       (codecs.BOM_UTF8, "utf-8-sig"), (codecs.BOM_UTF16_LE, "utf-16"),
                       (codecs.BOM_UTF16_BE, "utf-16")):
        if head.startswith(bom):
            head = codecs.getincrementaldecoder(codec)("replace").decode(head).encode("utf-8", "replace")
            break
    return head.lstrip().startswith(b"<")


class _Refused(ValueError):
    """A value the JSON reader refuses (raised from its number hooks)."""


def _int(text: str) -> int:
    digits = len(text.lstrip("+-"))
    if digits > MAX_INT_DIGITS:
        raise _Refused(f"an integer of {digits:,} digits (at most {MAX_INT_DIGITS} are accepted)")
    return int(text)


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        shown = text if len(text) <= 40 else text[:37] + "..."
        what = "is not a number" if math.isnan(value) else "is infinite or beyond the range of a float"
        raise _Refused(f"{shown} {what}; give a finite number")
    return value


def _constant(name: str):
    raise _Refused(f"{name} is not a number JSON allows; give a finite number")


def _depth(value) -> int:
    """Nesting depth of a decoded JSON value (a scalar is 0), without recursion."""
    deepest = 0
    stack = [(value, 0)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, (dict, list)):
            deepest = max(deepest, d + 1)
            stack.extend((c, d + 1) for c in (v.values() if isinstance(v, dict) else v))
    return deepest


def _read_json(p: Path) -> dict:
    data = _read_config(p)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise ConfigError(f"config file {p} is not UTF-8 text (byte {e.start}); save it as UTF-8") from None
    try:
        d = json.loads(text, parse_int=_int, parse_float=_float, parse_constant=_constant)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{p}: line {e.lineno} column {e.colno}: invalid JSON ({e.msg})") from None
    except _Refused as e:
        raise ConfigError(f"{p}: {e}") from None
    except RecursionError:
        raise ConfigError(f"{p}: the JSON is nested deeper than {MAX_DEPTH} levels; a config is an object "
                          f"of settings") from None
    except ValueError as e:  # any other value the decoder cannot hold
        raise ConfigError(f"{p}: invalid JSON ({e})") from None
    if not isinstance(d, dict):
        raise ConfigError(f"{p}: a config must be a JSON object, got a {type(d).__name__}")
    if _depth(d) > MAX_DEPTH:
        raise ConfigError(f"{p}: the JSON is nested deeper than {MAX_DEPTH} levels; a config is an object "
                          f"of settings")
    return d


# ---------------------------------------------------------------------------- XML
def _parse_xml(p: Path, data: bytes):
    """The root element, parsed by defusedxml: no DTD, so no entity, in any encoding."""
    try:
        from defusedxml import DefusedXmlException
        from defusedxml.ElementTree import DefusedXMLParser, ParseError
    except ImportError:
        raise ConfigError(f"{p}: reading XML configs needs the defusedxml package (a dependency of sftdata): "
                          f"pip install defusedxml") from None
    parser = DefusedXMLParser(forbid_dtd=True, forbid_entities=True, forbid_external=True)
    try:
        parser.feed(data)
        return parser.close()
    except DefusedXmlException as e:
        line = getattr(getattr(parser, "parser", None), "CurrentLineNumber", None)
        at = f"line {line}: " if line else ""
        kind = "<!DOCTYPE ...>" if type(e).__name__ == "DTDForbidden" else "<!ENTITY ...>"
        raise ConfigError(f"{p}: {at}{kind} declarations are not allowed in config files (entities are never "
                          f"expanded); remove it") from None
    except ParseError as e:
        raise ConfigError(f"{p}: invalid XML ({e})") from None
    except (ValueError, LookupError) as e:  # e.g. an encoding expat does not know
        raise ConfigError(f"{p}: the XML cannot be read ({e}); save it as UTF-8") from None


def read_xml_training(p: Path, extra_keys: dict[str, type] | None = None, keep_other: bool = False) -> dict:
    """Typed values of the ``<training>`` element's children. Refuses DOCTYPE/ENTITY
    declarations (no entity expansion, no external references). Tags in ``extra_keys``
    (the training script's keys, name -> type) are accepted too; other tags are errors,
    or kept as text with ``keep_other``."""
    root = _parse_xml(p, _read_config(p))
    section = root if root.tag == "training" else root.find(".//training")
    if section is None:
        raise ConfigError(f"{p}: no <training> element; put the loader settings inside <training>...</training>")
    types = {f.name: str(f.type) for f in dataclasses.fields(LoaderConfig)}
    types.update({k: t.__name__ for k, t in (extra_keys or {}).items() if k not in types})
    known = [k for k in types if k not in ("extra", "source")]
    out: dict[str, Any] = {}
    for child in section:
        tag = child.tag
        if not isinstance(tag, str):  # comments / processing instructions
            continue
        if tag not in known and keep_other:  # another program's setting: text, for cfg.extra
            out[tag] = (child.text or "").strip()
            continue
        if tag not in known:
            close = difflib.get_close_matches(tag, known, n=1)
            hint = f" (did you mean <{close[0]}>?)" if close else ""
            raise ConfigError(f"{p}: unknown tag <{tag}> in <training>{hint}; known tags: "
                              f"{', '.join(known)}")
        if tag in out:
            raise ConfigError(f"{p}: <{tag}> is given twice in <training>")
        if len(child):
            raise ConfigError(f"{p}: <{tag}> must hold a plain value, not nested elements")
        out[tag] = _xml_value(p, tag, (child.text or "").strip(), types[tag])
    return out


def _xml_value(p: Path, tag: str, text: str, typ: str):
    optional = "None" in typ
    low = text.lower()
    if optional and low in _NONE:
        return None
    shown = text if len(text) <= 40 else text[:37] + "..."
    if typ.startswith("bool"):
        if low in _TRUE:
            return True
        if low in _FALSE:
            return False
        raise ConfigError(f"{p}: <{tag}>{shown}</{tag}> is not a boolean; use true or false")
    if typ.startswith("int"):
        if len(text) > MAX_INT_DIGITS + 1:
            raise ConfigError(f"{p}: <{tag}> holds {len(text):,} characters; an integer here has at most "
                              f"{MAX_INT_DIGITS} digits")
        try:
            return int(text, 10)
        except ValueError:
            raise ConfigError(f"{p}: <{tag}>{shown}</{tag}> is not an integer") from None
    if typ.startswith("float"):
        if len(text) > 400:  # no float needs more characters than this
            raise ConfigError(f"{p}: <{tag}> holds {len(text):,} characters, not a number")
        try:
            return _float(text)
        except _Refused as e:
            raise ConfigError(f"{p}: <{tag}>: {e}") from None
        except ValueError:
            raise ConfigError(f"{p}: <{tag}>{shown}</{tag}> is not a number") from None
    return text
