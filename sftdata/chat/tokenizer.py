"""The chat tokenizer: a tiktoken encoding plus the chat markers as special tokens.

What ``--tokenizer`` names is opened in ``tokenize/open.py`` (``open_encoding``): a model's
own tokenizer comes back as it is, a tiktoken encoding gets the markers here.

Markers are appended after the base encoding's highest id, in the order of
``MARKERS``: first the six span markers (``CHAT_MARKERS``), then ``<|EOS|>`` when the
base encoding has no end-of-text token of its own (``<|endoftext|>`` = 100257 in
cl100k_base), then the markers added later (``ADDED_MARKERS``: reasoning, untrained
assistant turns), so the ids of the first six and of EOS never move. A dataset's
``tokenizer_state.json`` records which markers it has: one written before the added
markers existed has the six only, and is rebuilt with the six only.

A marker id is never an id the base encoding or its model uses. A bare ranks file does
not say which ids its model keeps for itself (Llama 3's ``tokenizer.model`` holds ranks
0..127999, and the model's own special tokens are 128000..128255), so the files a model
ships beside it are read for them (``declared_ids``): ``tokenizer_config.json``
(``added_tokens_decoder``), ``tokenizer.json`` (``added_tokens``) and Meta's
``params.json`` (``vocab_size``), in the ranks file's folder or the one above it, and a
well-known ranks file (Llama 3's) is recognised by its sha256 alone. When
such ids sit where the markers would go, the markers move past them; a layout whose
markers still meet a used id (an older dataset's recorded state) is refused, naming
the ids.

    >>> tok = load_tokenizer()                     # bundled cl100k_base, no network
    >>> tok.special_tokens["<|ASSISTANT|>"], tok.special_tokens["<|THINK|>"], tok.eos_id, tok.vocab_size
    (100279, 100283, 100257, 100286)

Message text is always encoded with ``encode_ordinary``: marker strings typed by a
user stay ordinary text. Marker ids are inserted only by the renderer.

Ranks files (the bundled cl100k_base and ``.tiktoken`` files) are parsed and hashed once:
then they come from the user's cache (``sftdata.util.cache``), keyed by the file's sha256.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..errors import DatasetError, TokenizerError, TokenizerFailure
from ..tokenize import STATE_FORMAT
from ..tokenize.hf import HFTokenizer
from ..tokenize.joined import JoinedEncoder
from ..tokenize.open import (
    TIKTOKEN_STATE_VERSION,
    TiktokenEncoding,
    encoding_from_state,
    open_encoding,
    open_tiktoken,
    recorded_spec,
)
from ..tokenize.space_runs import CL100K_PATTERNS, LONG_TEXT, encode_cutting_runs, overflowed
from ..tokenize.special_ids import id_ranges, marker_collisions, marker_start
from .markers import ADDED_MARKERS, CHAT_MARKERS, EOS, MARKERS, MarkerIds


class ChatTokenizer:
    """A tiktoken encoding with the chat markers: an opened ``TiktokenEncoding``
    (``tokenize.open``) and the markers placed after its ids. Build it with
    ``load_tokenizer`` or ``open_tokenizer``.

    ``declared``: ids the model uses beyond the ranks and base special tokens, with their
    names where known (from ``declared_ids``); ``declared_source`` the file saying so."""

    def __init__(self, encoding: TiktokenEncoding, *, markers: Sequence[str] = MARKERS):
        markers = tuple(markers)
        if markers[:len(CHAT_MARKERS)] != CHAT_MARKERS or not set(markers[len(CHAT_MARKERS):]) <= set(ADDED_MARKERS):
            raise TokenizerError(f"chat markers {markers} must be {CHAT_MARKERS} followed by some of {ADDED_MARKERS}")
        self.markers = markers
        name, path, pat_str = encoding.name, encoding.path, encoding.pat_str
        mergeable_ranks, base_special_tokens = encoding.mergeable_ranks, encoding.base_special_tokens
        self.name = name
        self.source = encoding.source
        self.path = path
        self.pat_str = pat_str
        self.base_special_tokens = dict(base_special_tokens)
        self.ranks_sha256 = encoding.ranks_sha256
        self.declared = dict(encoding.declared)
        self.declared_source = encoding.declared_source
        rank_ids = set(mergeable_ranks.values())
        if len(rank_ids) != len(mergeable_ranks):
            raise TokenizerError(f"the ranks of {path or name} give the same id to several tokens "
                                 f"({len(mergeable_ranks) - len(rank_ids):,} repeats); it is not a valid encoding")
        base_max = max([*rank_ids, *base_special_tokens.values()])
        eot = base_special_tokens.get("<|endoftext|>")
        start = marker_start(base_max, len(CHAT_MARKERS) + (eot is None), self.declared)
        special = {m: start + i for i, m in enumerate(CHAT_MARKERS)}
        if eot is None:
            eot = start + len(CHAT_MARKERS)
            special[EOS] = eot
        added = [m for m in ADDED_MARKERS if m in markers]  # after the first six and EOS: their ids never move
        if added:
            start = marker_start(max(special.values()), len(added), self.declared)
            special.update({m: start + i for i, m in enumerate(added)})
        base_ids = rank_ids | set(base_special_tokens.values()) | set(self.declared)
        clash = marker_collisions(special, base_ids.__contains__)  # EOS is in ``special`` only when not the base's
        if clash:  # by construction never; kept as the guard of the rule
            raise TokenizerError(f"the chat marker ids {id_ranges(clash)} would collide with ids the tokenizer "
                                 f"{path or name} uses itself")
        self.base_vocab_size = base_max + 1
        self.special_tokens: dict[str, int] = {**special, EOS: eot}
        self.ids = MarkerIds.from_special_tokens(self.special_tokens)
        self.eos_id = eot
        self.vocab_size = max(self.special_tokens.values()) + 1
        encoding_special = dict(base_special_tokens)
        encoding_special.update({m: i for m, i in special.items() if m != EOS or "<|endoftext|>" not in base_special_tokens})
        self._encoding_args = {"name": f"sftdata:{name}", "pat_str": pat_str, "mergeable_ranks": mergeable_ranks,
                               "special_tokens": encoding_special}
        self._max_rank = max(rank_ids)
        self._id_to_marker = {i: m for m, i in self.special_tokens.items()}

    @functools.cached_property
    def _enc(self):
        """tiktoken's Encoding, built on first use (0.1 s for cl100k): what only needs the
        tokenizer's state (``state()``, a build key, an up-to-date check) never builds it."""
        import tiktoken

        return tiktoken.Encoding(**self._encoding_args)

    @functools.cached_property
    def joined(self) -> JoinedEncoder | None:
        """A chunk of rendered text in one call of the core (None: encode text by text)."""
        return JoinedEncoder.build(self._enc, self.special_tokens.values(), self._max_rank)

    def uses_base_id(self, token_id: int) -> bool:
        """True when the base encoding or its model uses ``token_id`` (a rank, a base
        special token, or an id declared beside a ranks file)."""
        t = int(token_id)
        if t in self.declared or t in self.base_special_tokens.values():
            return True
        if t in self._id_to_marker:
            return False
        try:
            self._enc.decode_single_token_bytes(t)  # a rank
        except KeyError:
            return False
        return True

    # -- encoding -----------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        """Encode message text as ordinary text (special strings are not special)."""
        return self._enc.encode_ordinary(text) if len(text) < LONG_TEXT else self.encode_long(text)

    def encode_batch(self, texts: Sequence[str], num_threads: int = 1) -> list[list[int]]:
        """Encode many texts as ordinary text. With one thread, call the BPE core directly
        (tiktoken's batch API pays a thread-pool hop per text even then)."""
        if num_threads > 1:
            if any(len(t) >= LONG_TEXT for t in texts):
                return [self.encode(t) for t in texts]
            return self._enc.encode_ordinary_batch(list(texts), num_threads=num_threads)
        core = self._enc._core_bpe.encode_ordinary
        out = []
        for t in texts:
            try:
                out.append(core(t) if len(t) < LONG_TEXT else self.encode_long(t))
            except UnicodeEncodeError:  # lone surrogates: tiktoken's own fix-up path
                out.append(self._enc.encode_ordinary(t))
        return out

    def encode_long(self, text: str) -> list[int]:
        """A long text's ids, through tiktoken's buffer API (a failure of its split regex
        there is an error; ``encode_ordinary`` panics). A run of whitespace too long for that
        regex (a million spaces) is cut out where no token can change (``space_runs``,
        cl100k_base's pattern); with another pattern the text is a ``TokenizerFailure``
        (its record is rejected as ``tokenizer_error``)."""
        core = self._enc._core_bpe
        try:
            return np.frombuffer(core.encode_to_tiktoken_buffer(text, set()), dtype=np.uint32).tolist()
        except UnicodeEncodeError:  # lone surrogates, replaced as tiktoken's encode_ordinary does
            return self.encode_long(text.encode("utf-16", "surrogatepass").decode("utf-16", "replace"))
        except ValueError as e:
            if not overflowed(e):
                raise
        if self.pat_str in CL100K_PATTERNS:
            return encode_cutting_runs(text, self._enc.encode_ordinary, core.encode_single_piece)
        raise TokenizerFailure(f"tiktoken's split regex ran out of backtracking stack on a text of {len(text):,} "
                               f"characters with {self.path or self.name} (a run of whitespace too long for it)")

    # -- decoding -----------------------------------------------------------------
    def token_text(self, token_id: int) -> str:
        """One token's text; markers (and EOS) as their marker strings."""
        marker = self._id_to_marker.get(int(token_id))
        if marker is not None:
            return marker
        if not 0 <= int(token_id) < self.vocab_size:
            return f"<|invalid:{int(token_id)}|>"
        return self._enc.decode_single_token_bytes(int(token_id)).decode("utf-8", errors="replace")

    def decode(self, ids: Sequence[int]) -> str:
        """Decode ids; marker ids become their marker strings, bytes split across
        tokens are joined before UTF-8 decoding."""
        out: list[str] = []
        run: list[int] = []
        for t in ids:
            t = int(t)
            if t in self._id_to_marker or not 0 <= t < self.vocab_size:
                if run:
                    out.append(self._enc.decode(run, errors="replace"))
                    run = []
                out.append(self.token_text(t))
            else:
                run.append(t)
        if run:
            out.append(self._enc.decode(run, errors="replace"))
        return "".join(out)

    # -- persistence --------------------------------------------------------------
    def state(self) -> dict:
        """What ``tokenizer_state.json`` holds: enough to rebuild and check this tokenizer."""
        return {
            "format": STATE_FORMAT,
            "version": TIKTOKEN_STATE_VERSION,
            "name": self.name,
            "source": self.source,
            "path": self.path,
            "ranks_sha256": self.ranks_sha256,
            "pat_str": self.pat_str,
            "base_special_tokens": self.base_special_tokens,
            "special_tokens": self.special_tokens,
            "eos_id": self.eos_id,
            "vocab_size": self.vocab_size,
        }

    def summary(self) -> dict:
        return {"name": self.name, "source": self.source, "ranks_sha256": self.ranks_sha256,
                "vocab_size": self.vocab_size, "eos_id": self.eos_id}

    def __getstate__(self):
        return {"spec": self.path or self.name, "markers": self.markers}

    def __setstate__(self, state):
        other = load_tokenizer(state["spec"], markers=state.get("markers", MARKERS))
        self.__dict__.update(other.__dict__)


def load_tokenizer(spec: str | None = None, *, markers: Sequence[str] = MARKERS) -> ChatTokenizer:
    """The chat tokenizer of a tiktoken encoding (``tokenize.open.open_tiktoken``: ``None``
    or ``"cl100k_base"``, the bundled copy; another tiktoken name; a ``.tiktoken`` ranks
    file, whose ``<|EOS|>`` gets its own id after the markers). ``markers``: every marker by
    default; a dataset's recorded state may hold fewer (``markers_of``)."""
    return ChatTokenizer(open_tiktoken(spec), markers=markers)


def markers_of(special_tokens) -> tuple[str, ...]:
    """The chat markers a recorded ``special_tokens`` holds: the first six, then those of
    the added markers present (none in a dataset written before they existed)."""
    have = special_tokens if isinstance(special_tokens, dict) else {}
    return CHAT_MARKERS + tuple(m for m in ADDED_MARKERS if m in have)


def open_tokenizer(spec: str | None = None, engine: str = "auto") -> ChatTokenizer | HFTokenizer:
    """What ``--tokenizer`` names (``tokenize.open.open_encoding``): a model's own tokenizer
    as it is, or a tiktoken encoding with sftdata's chat markers."""
    opened = open_encoding(spec, engine)
    return opened if isinstance(opened, HFTokenizer) else ChatTokenizer(opened)


def engine_record(tok: ChatTokenizer | HFTokenizer) -> dict:
    """Which engine encodes with ``tok`` and why (the prepare summary's ``tokenizer_engine``)."""
    if isinstance(tok, HFTokenizer):
        rec = tok.engine_choice.record()
        return {"engine": rec["engine"], "requested": rec["requested"], "reason": rec["reason"]}
    return {"engine": "tiktoken", "requested": "auto", "reason": f"{tok.name} is a tiktoken encoding"}


def tokenizer_from_state(state: dict, where: str = "tokenizer_state.json") -> ChatTokenizer | HFTokenizer:
    """Rebuild the tokenizer a dataset recorded (``tokenize.open.encoding_from_state``), with
    the markers it recorded, and check they are exactly those."""
    opened = encoding_from_state(state, where)
    if isinstance(opened, HFTokenizer):
        return opened
    spec = recorded_spec(state)
    recorded = state.get("special_tokens")
    tok = ChatTokenizer(opened, markers=markers_of(recorded) if isinstance(recorded, dict) else MARKERS)
    if isinstance(recorded, dict) and recorded != tok.special_tokens:
        base_eot = tok.base_special_tokens.get("<|endoftext|>")
        clash = marker_collisions({m: i for m, i in recorded.items() if isinstance(i, int)}, tok.uses_base_id,
                                  allowed=() if base_eot is None else (base_eot,))
        if clash:
            names = [n for n in (tok.declared.get(i) for i in clash) if n]
            named = ", ".join(names[:4]) + (", ..." if len(names) > 4 else "")
            said = "; ".join(x for x in (named, f"declared in {tok.declared_source}" if tok.declared_source else "")
                             if x)
            raise TokenizerError(
                f"{where}: the recorded chat marker ids {id_ranges(clash)} are ids the tokenizer {spec!r} uses "
                f"itself{f' ({said})' if said else ''}: the model would read the markers as its own tokens. "
                f"Re-prepare the dataset: the markers now go to {id_ranges(tok.special_tokens.values())}")
    if tok.pat_str != state.get("pat_str") or tok.special_tokens != recorded:
        raise TokenizerError(f"{where}: the rebuilt tokenizer's pattern or special token ids differ "
                             f"from the recorded ones; re-prepare the dataset with this sftdata")
    return tok


def recorded_tokenizer(root: str | Path, state: dict | None) -> ChatTokenizer | HFTokenizer:
    """The tokenizer the dataset at ``root`` recorded in ``state`` (its
    ``tokenizer_state.json``), rebuilt and checked to be exactly the one used."""
    where = Path(root) / "tokenizer_state.json"
    if state is None:
        raise DatasetError(f"{root} has no tokenizer_state.json; the tokenizer it was made with is unknown")
    return tokenizer_from_state(state, str(where))
