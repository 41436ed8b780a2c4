"""Byte-level BPE ``tokenizer.json`` files (Llama 3, Qwen2/2.5/3, GPT-2 style) run on
tiktoken's BPE core: same ids, several times faster than the ``tokenizers`` library.

A ``tokenizer.json`` qualifies when its model is BPE without dropout, byte fallback,
continuing-subword prefix or end-of-word suffix; its pre-tokenizer is ONE Split regex
(behaviour Isolated; or a known chain of them, below) followed by ByteLevel (no prefix space, no regex of its own), or
ByteLevel alone with GPT-2's regex; its normalizer is none or NFC; and its added tokens
have no lstrip / rstrip / single_word and none is a prefix of another. Then:

* each vocabulary string maps back through GPT-2's byte alphabet to its bytes: those
  bytes and a rank are tiktoken's ``mergeable_ranks``, the Split regex its ``pat_str``,
  the added tokens its specials;
* the merges must be ordered as the tokens they make (all merges of a token together,
  tokens in order of first merge), every merge must join vocabulary tokens, and every
  multi-byte token must be made by a merge: then "merge the pair of lowest merge index"
  (the library) and "merge the pair whose joined bytes rank lowest" (tiktoken) pick the
  same pairs (a merge may name a token whose own merge comes later: it can only fire
  once that token exists, in both engines). Where the ids are not in merge order, tiktoken runs on merge-order ranks
  and one array lookup maps them to ids;
* with ``ignore_merges`` false (Qwen), a word that is itself a vocabulary token must
  encode to that token by merges (tiktoken returns it directly): checked for every token.

Several chained Split regexes (behaviour Isolated) run as one pattern only where sftdata
knows a single pattern that splits every text into the same pieces (``COMBINED_SPLITS``:
DeepSeek V3's three, shared by R1, V3.1, V3.2 and V4); the load-time self-check proves it
on the tokenizer itself, like any pattern, and any difference sends ``auto`` to the library.

What is refused says why (``FastPlan.reason``); the conversion and its checks are kept in
the user's cache (``sftdata.util.cache``) keyed by the file's sha256, and a cached table is
used only once it is the one the file gives now (``same_conversion``). ``bpe_self_check``
then compares both engines on a multilingual text set (its result kept beside the table).
"""

from __future__ import annotations

import itertools
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..util.cache import Entry, cached, write_entry
from .bpe_arrays import TO_LATIN1, byte_alphabet, merge_ids_fast, merge_order_fast, table_by_id, table_by_strings, vocab_in_id_order
from .ranks import arrays_to_ranks, ranks_to_arrays
from .space_runs import CUT_PATTERNS, cuttable, encode_cutting_runs, overflowed

GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
CACHE_KIND = "hf-bpe-2"  # 2: chained Split regexes can qualify (entries that refused them are not reused)

# DeepSeek V3's pre-tokenizer (R1, V3.1, V3.2, V4 and VL2 ship the same): three Split
# regexes, each applied to the pieces the one before left, then ByteLevel.
_CJK = "\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff"
DEEPSEEK_V3_SPLITS = (
    r"\p{N}{1,3}",
    f"[{_CJK}]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+"
    "[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
)
# The same pieces from one pattern. A digit run of up to three and a run of the CJK
# range come first, as the first two regexes isolate them; the third regex's
# alternatives follow with every class minus digits and that range (its pieces never
# hold them) and ``(?!\S)`` also true before them (a piece ends there); the last
# alternative is the text the third regex leaves unmatched (control and format
# characters not before a letter), which the library keeps as a piece and tiktoken
# would drop.
_NOT = f"\\p{{N}}{_CJK}"
_LM = f"[\\p{{L}}\\p{{M}}--[{_CJK}]]"
COMBINED_SPLITS: dict[tuple[str, ...], tuple[str, str]] = {
    DEEPSEEK_V3_SPLITS: ("DeepSeek V3's three Split regexes", (
        r"\p{N}{1,3}"
        f"|[{_CJK}]+"
        r"""|[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+"""
        f"|[^\\r\\n\\p{{L}}\\p{{P}}\\p{{S}}{_NOT}]?{_LM}+"
        f"| ?[\\p{{P}}\\p{{S}}--[{_CJK}]]+[\\r\\n]*"
        r"|\s*[\r\n]+"
        f"|\\s+(?![^\\s{_NOT}])"
        r"|\s+"
        f"|(?:[^\\p{{L}}\\p{{M}}\\p{{P}}\\p{{S}}\\s{_NOT}](?!{_LM}))+")),
}


@dataclass(frozen=True)
class FastPlan:
    """What a ``tokenizer.json`` needs to run on tiktoken's core, or why it cannot."""

    reason: str | None  # None: eligible
    pat_str: str = ""
    nfc: bool = False


def _is_nfc(normalizer) -> bool | None:
    """False for no normalizer, True for NFC (alone or as a one-item sequence), None otherwise."""
    if normalizer is None:
        return False
    if isinstance(normalizer, dict) and normalizer.get("type") == "NFC":
        return True
    if isinstance(normalizer, dict) and normalizer.get("type") == "Sequence":
        inner = normalizer.get("normalizers") or []
        if not inner:
            return False
        return True if len(inner) == 1 and _is_nfc(inner[0]) else None
    return None


def _pre_tokenizer_plan(pre) -> tuple[str | None, str]:
    """``(reason, pat_str)`` of a pre-tokenizer: one Split regex + ByteLevel, or ByteLevel alone."""
    steps = pre.get("pretokenizers", []) if isinstance(pre, dict) and pre.get("type") == "Sequence" else [pre]
    kinds = [s.get("type") if isinstance(s, dict) else None for s in steps]
    splits = [s for s in steps if isinstance(s, dict) and s.get("type") == "Split"]
    if len(splits) > 1:
        if kinds[-1:] != ["ByteLevel"] or any(k not in ("Split", "ByteLevel") for k in kinds[:-1]):
            return f"its pre-tokenizer is {' + '.join(str(k) for k in kinds)}, not Split regexes + ByteLevel", ""
        chain = tuple((s.get("pattern") or {}).get("Regex") for s in splits)
        if chain not in COMBINED_SPLITS:
            return (f"its pre-tokenizer chains {len(splits)} Split regexes, and tiktoken runs one: sftdata knows a "
                    f"single pattern for {', '.join(n for n, _ in COMBINED_SPLITS.values())} only"), ""
        for split in splits:
            if split.get("behavior") != "Isolated" or split.get("invert"):
                return f"its Split pre-tokenizer has behavior {split.get('behavior')!r}" \
                       f"{' inverted' if split.get('invert') else ''}, not Isolated", ""
        splits = [{**splits[0], "pattern": {"Regex": COMBINED_SPLITS[chain][1]}}]
        steps = [splits[0], steps[-1]]
    if kinds[-1:] != ["ByteLevel"] or any(k not in ("Split", "ByteLevel") for k in kinds) or len(steps) > 2:
        return f"its pre-tokenizer is {' + '.join(str(k) for k in kinds)}, not one Split regex + ByteLevel", ""
    level = steps[-1]
    if level.get("add_prefix_space"):
        return "its ByteLevel pre-tokenizer adds a prefix space", ""
    if not splits:
        if level.get("use_regex", True):
            return None, GPT2_PATTERN
        return "its ByteLevel pre-tokenizer splits nothing (no regex)", ""
    split = splits[0]
    if level.get("use_regex", True):
        return "its ByteLevel pre-tokenizer applies GPT-2's regex after the Split regex (two regexes)", ""
    pattern = split.get("pattern") or {}
    if "Regex" not in pattern:
        return "its Split pre-tokenizer splits on a plain string, not a regex", ""
    if split.get("behavior") != "Isolated" or split.get("invert"):
        return f"its Split pre-tokenizer has behavior {split.get('behavior')!r}" \
               f"{' inverted' if split.get('invert') else ''}, not Isolated", ""
    return None, pattern["Regex"]


def fast_plan(doc: dict) -> FastPlan:
    """Whether ``doc`` (a parsed tokenizer.json) can run on tiktoken's core, by its structure."""
    model = doc.get("model") or {}
    kind = model.get("type")
    if kind != "BPE":
        return FastPlan(f"its model is {kind}, not BPE")
    if model.get("byte_fallback"):
        return FastPlan("it is SentencePiece-style BPE with byte fallback (as Gemma's), not byte-level BPE")
    if model.get("dropout"):
        return FastPlan(f"it uses BPE dropout ({model['dropout']}): its ids are random")
    for key in ("continuing_subword_prefix", "end_of_word_suffix"):
        if model.get(key):
            return FastPlan(f"its BPE has a {key.replace('_', ' ')} ({model[key]!r})")
    nfc = _is_nfc(doc.get("normalizer"))
    if nfc is None:
        return FastPlan(f"its normalizer is {(doc.get('normalizer') or {}).get('type')}, not none or NFC")
    reason, pat = _pre_tokenizer_plan(doc.get("pre_tokenizer"))
    if reason:
        return FastPlan(reason)
    added = [t for t in doc.get("added_tokens") or [] if isinstance(t, dict)]
    for t in added:
        for flag in ("lstrip", "rstrip", "single_word"):
            if t.get(flag):
                return FastPlan(f"its added token {t.get('content')!r} sets {flag}")
    contents = sorted(str(t.get("content")) for t in added)
    for a, b in zip(contents, contents[1:]):
        if b.startswith(a):  # the library matches the longest, tiktoken the first alternative
            return FastPlan(f"its added token {a!r} is a prefix of {b!r}")
    return FastPlan(None, pat, nfc)


def _merge_pairs(merges) -> list[tuple[str, str]]:
    out = []
    for m in merges:
        if isinstance(m, str):
            a, sep, b = m.partition(" ")
            if not sep:
                raise ValueError(f"merge {m!r} is not two tokens")
            out.append((a, b))
        else:
            a, b = m
            out.append((a, b))
    return out


def _ranks_by_bytes(rank_of: dict[str, int]) -> dict[bytes, int]:
    """``{token_bytes(t): r}`` of ``rank_of``, translated in one call, not one per token."""
    raw = "".join(rank_of).translate(TO_LATIN1).encode("latin-1")  # one byte per character of the alphabet
    ends = itertools.accumulate(map(len, rank_of))
    starts = itertools.chain((0,), itertools.accumulate(map(len, rank_of)))
    return {raw[a:b]: r for a, b, r in zip(starts, ends, rank_of.values())}


def _merge_order(vocab: dict[str, int], pairs: list[tuple[str, str]], alphabet: dict[str, int],
                 contents: set) -> list[str] | str:
    """The merged tokens in order of their first merge, or why the merges do not qualify
    (module docstring): each merge joins vocabulary tokens into one, a token's merges are
    together, every vocabulary token but the bytes and the added tokens is made."""
    order: dict[str, int] = {c: -1 for c in alphabet}  # token -> index of its first merge
    last = None
    for i, (a, b) in enumerate(pairs):
        t = a + b
        if a not in vocab or b not in vocab:
            part = a if a not in vocab else b
            return f"merge {i} ({a!r} {b!r}) joins {part!r}, which is not in the vocabulary"
        if t not in vocab:
            return f"merge {i} ({a!r} {b!r}) makes {t!r}, which is not in the vocabulary"
        if t in order:
            if t != last and order[t] >= 0:
                return (f"the merges of {t!r} are not together (merge {order[t]} and merge {i}): merge order and "
                        f"token ranks disagree")
        else:
            order[t] = i
            last = t
    made = [t for t in vocab if t not in order and t not in contents]  # a trainer puts added tokens in the vocab
    if made:
        return f"{len(made)} vocabulary token(s) no merge makes (such as {made[0]!r})"
    return sorted((t for t in order if order[t] >= 0), key=order.__getitem__)


def _table_by_dict(vocab: dict[str, int], alphabet: dict[str, int], merged: list[str], identity: bool
                   ) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray, int]:
    """The ranks (``ranks_to_arrays``), and ``rank_to_id`` and byte lengths by rank, of the
    bytes then ``merged``: ranks the ids (``identity``) or merge order."""
    if identity:
        rank_of = {t: vocab[t] for t in [*alphabet, *merged]}
    else:
        rank_of = {c: i for i, c in enumerate(alphabet)}
        rank_of.update({t: 256 + i for i, t in enumerate(merged)})
    n = max(rank_of.values()) + 1
    ranks = _ranks_by_bytes(rank_of)
    rank_to_id = np.zeros(n, dtype=np.uint32)
    lengths = np.zeros(n, dtype=np.uint32)
    for t, r in rank_of.items():
        rank_to_id[r] = vocab[t]
    for b, r in ranks.items():
        lengths[r] = len(b)
    return ranks_to_arrays(ranks), rank_to_id, lengths, n


def _bpe_merges(word: str, pair_rank: dict[tuple[str, str], int]) -> list[str]:
    """The library's BPE of one word (merge the adjacent pair of lowest merge index, leftmost)."""
    parts = list(word)
    while len(parts) > 1:
        best, at = None, -1
        for i in range(len(parts) - 1):
            r = pair_rank.get((parts[i], parts[i + 1]))
            if r is not None and (best is None or r < best):
                best, at = r, i
        if best is None:
            break
        parts[at:at + 2] = [parts[at] + parts[at + 1]]
    return parts


def convert(doc: dict, reachable: bool = True) -> tuple[dict, dict[str, np.ndarray]]:
    """The cache entry of ``doc``: ``meta`` (eligible or the reason; pattern, NFC, specials,
    the static evidence) and the ranks as arrays (``sftdata.tokenize.ranks.ranks_to_arrays`` plus
    ``rank_to_id`` and ``byte_lengths`` by rank, specials after the vocabulary).
    ``reachable`` False skips the one costly check (every token encodes to itself by its
    merges: three quarters of the time), for ``same_conversion``."""
    plan = fast_plan(doc)
    if plan.reason:
        return {"eligible": False, "reason": plan.reason}, {}
    model = doc["model"]
    vocab: dict[str, int] = model.get("vocab") or {}
    alphabet = byte_alphabet()
    missing = [c for c in alphabet if c not in vocab]
    if missing:
        return {"eligible": False, "reason": f"its vocabulary lacks {len(missing)} of the 256 byte tokens: not "
                                             f"byte-level BPE"}, {}
    added = [t for t in doc.get("added_tokens") or [] if isinstance(t, dict)]
    contents = {t.get("content") for t in added}
    by_id = vocab_in_id_order(vocab)
    merged_ids = merge_ids_fast(vocab, model.get("merges"), alphabet, contents, by_id)
    if merged_ids is not None:  # the tokens by id; their strings only where the reachability check reads them
        keys = list(vocab) if reachable and not model.get("ignore_merges") else []
        fast = (list(map(keys.__getitem__, merged_ids.tolist())) if keys else []), merged_ids
    else:
        fast = merge_order_fast(vocab, model.get("merges"), alphabet, contents)
    if fast is None or (reachable and not model.get("ignore_merges")):
        try:
            pairs = _merge_pairs(model.get("merges") or [])
        except (ValueError, TypeError):
            return {"eligible": False, "reason": "its merges are not pairs of tokens"}, {}
    if fast is None:
        merged = _merge_order(vocab, pairs, alphabet, contents)
        if isinstance(merged, str):
            return {"eligible": False, "reason": merged}, {}
        ids = np.fromiter((vocab[t] for t in merged), dtype=np.int64, count=len(merged))
        n_merges = len(pairs)
    else:
        merged, ids = fast
        n_merges = len(model["merges"])
    in_order = bool(np.all(np.diff(ids) > 0))
    ignore_merges = bool(model.get("ignore_merges"))
    if not ignore_merges and reachable:  # tiktoken returns a word that is a token as is: so must the merges
        pair_rank = {p: i for i, p in reversed(list(enumerate(pairs)))}
        for t in merged:
            if len(t) > 2 and _bpe_merges(t, pair_rank) != [t]:
                return {"eligible": False, "reason": f"the token {t!r} does not encode to itself by its merges "
                                                     f"(and ignore_merges is off)"}, {}
    added_ids = {int(t["id"]) for t in added}
    taken = range(len(vocab)) if by_id is not None else set(vocab.values())  # the vocabulary's ids
    identity = in_order and not any(i in taken for i in added_ids)  # else merge-order ranks + one lookup
    if merged_ids is not None:
        table = table_by_id(vocab, alphabet, merged_ids, by_id, identity)
    else:
        table = table_by_strings(vocab, alphabet, merged, ids, identity) if fast is not None else None
    if table is None:
        try:
            table = _table_by_dict(vocab, alphabet, merged, identity)
        except UnicodeEncodeError:
            return {"eligible": False, "reason": "its vocabulary holds characters outside the byte-level alphabet"}, {}
    arrays, rank_to_id, lengths, n = table
    specials = {}
    for j, t in enumerate(sorted(added, key=lambda x: int(x["id"]))):
        specials[t["content"]] = [int(t["id"]) if identity else n + j, int(t["id"]), bool(t.get("special"))]
    size = max([n - 1, *(s[0] for s in specials.values())]) + 1
    rank_to_id = np.concatenate([rank_to_id, np.zeros(size - n, dtype=np.uint32)])
    lengths = np.concatenate([lengths, np.zeros(size - n, dtype=np.uint32)])
    for content, (r, i, _) in specials.items():
        rank_to_id[r] = i
        lengths[r] = len(content.encode("utf-8"))
    combined = [name for name, pat in COMBINED_SPLITS.values() if pat == plan.pat_str]
    meta = {"eligible": True, "reason": None, "pat_str": plan.pat_str, "nfc": plan.nfc, "identity": identity,
            "specials": specials,
            "evidence": {"merges": n_merges, "merged_tokens": len(ids), "merges_in_rank_order": True,
                         "ids_in_merge_order": in_order,
                         "id_lookup": not identity, "ignore_merges": ignore_merges,
                         "tokens_encode_to_themselves": "not needed (ignore_merges)" if ignore_merges else True,
                         **({"split_regexes": f"{combined[0]} as one pattern"} if combined else {})}}
    return meta, {**arrays, "rank_to_id": rank_to_id, "byte_lengths": lengths}


class FastBPE:
    """tiktoken's core with a converted ``tokenizer.json``; ids and offsets as the library's."""

    def __init__(self, meta: dict, arrays: dict[str, np.ndarray], name: str = "hf"):
        import tiktoken

        self.nfc: bool = meta["nfc"]
        self.identity: bool = meta["identity"]
        self.evidence: dict = meta["evidence"]
        specials = meta["specials"]
        self._enc = tiktoken.Encoding(f"sftdata-fast:{name}", pat_str=meta["pat_str"],
                                      mergeable_ranks=arrays_to_ranks(arrays),
                                      special_tokens={c: r for c, (r, _, _) in specials.items()})
        self._core = self._enc._core_bpe
        self._all = set(specials)
        self._plain = {c for c, (_, _, special) in specials.items() if not special}  # the library matches these
        self._special_rank = {c: r for c, (r, _, _) in specials.items()}
        # separators for ``encode_rendered_many``: special tokens with no border, the longest first
        self._separators = sorted((c for c in self._all if not any(c[:k] == c[-k:] for k in range(1, len(c)))),
                                  key=lambda c: (-len(c), c))[:8]
        self._rank_to_id = np.asarray(arrays["rank_to_id"])
        self._cuttable = cuttable(meta["pat_str"], specials)  # a long run of whitespace: ``_ranks``
        self._cut_ends = CUT_PATTERNS.get(meta["pat_str"], False)
        self._lengths = np.asarray(arrays["byte_lengths"]).astype(np.int64)

    def handles(self, text: str) -> bool:
        """False where the library must encode ``text`` (not NFC under an NFC normalizer)."""
        return not self.nfc or text.isascii() or unicodedata.is_normalized("NFC", text)

    def _ranks(self, text: str, allowed: set) -> np.ndarray:
        """The core's ranks of ``text``; a run of whitespace too long for the split regex (a
        million spaces) cut out where no token can change (``space_runs``: Llama 3's and
        Qwen2's patterns), else the regex's ``ValueError`` (the record's ``tokenizer_error``)."""
        try:
            return np.frombuffer(self._core.encode_to_tiktoken_buffer(text, allowed), dtype=np.uint32)
        except ValueError as e:
            if not overflowed(e) or not self._cuttable:
                raise
        def encode(part: str) -> list[int]:
            return np.frombuffer(self._core.encode_to_tiktoken_buffer(part, allowed), dtype=np.uint32).tolist()
        return np.asarray(encode_cutting_runs(text, encode, self._core.encode_single_piece, ends=self._cut_ends,
                                              stops=allowed), dtype=np.uint32)

    def _ids(self, ranks: np.ndarray) -> np.ndarray:
        return ranks.copy() if self.identity else self._rank_to_id[ranks]

    def encode_rendered(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        """``(ids, ranks)`` of a template's rendered text: every added token recognised."""
        ranks = self._ranks(text, self._all)
        return self._ids(ranks), ranks

    def encode_rendered_many(self, texts: list[str]) -> list[tuple[np.ndarray, np.ndarray]] | None:
        """``encode_rendered`` of many texts in one call of the core: the texts joined by a
        special token none of them holds, the result cut where it lies. The core encodes
        the text between special tokens piece by piece, so each text's tokens are its own;
        a separator with no border (no prefix that is also a suffix) cannot begin inside a
        text, and a special token reaching into one would leave fewer separators than
        joins, which sends the texts one by one. None: no separator, or a lone surrogate."""
        joined = self.join_rendered(texts)
        return None if joined is None else self.cut_joined(self.encode_joined(joined[0]), len(texts), joined[1])

    def join_rendered(self, texts: list[str]) -> tuple[str, str] | None:
        """``(the texts joined, the separator)`` for ``encode_joined`` (``encode_rendered_many``);
        None for fewer than two texts, or no separator."""
        if len(texts) < 2:
            return None
        plain = "\x00".join(texts)
        sep = next((c for c in self._separators if c not in plain), None)
        return None if sep is None else (sep.join(texts), sep)

    def encode_joined(self, joined: str) -> np.ndarray | None:
        """The ranks of ``join_rendered``'s text (None: a lone surrogate). The core lets go
        of the interpreter while it encodes: another thread may call this while this one
        goes on."""
        try:
            return self._ranks(joined, self._all)
        except UnicodeEncodeError:
            return None

    def cut_joined(self, ranks: np.ndarray | None, n: int, sep: str) -> list[tuple[np.ndarray, np.ndarray]] | None:
        """``encode_joined``'s ranks of ``n`` texts cut at the separators: each text's
        ``(ids, ranks)``; None where they cannot be (``encode_rendered_many``)."""
        if ranks is None:
            return None
        cuts = np.flatnonzero(ranks == self._special_rank[sep])
        if cuts.size != n - 1:
            return None
        ids = self._ids(ranks)
        starts = [0, *(cuts + 1).tolist()]
        ends = [*cuts.tolist(), ranks.shape[0]]
        return [(ids[a:b], ranks[a:b]) for a, b in zip(starts, ends)]

    def encode(self, text: str) -> np.ndarray:
        """Message text as the library encodes it with ``encode_special_tokens``: special
        tokens' strings are text, other added tokens are still recognised."""
        return self._ids(self._ranks(text, self._plain))

    def offsets(self, text: str, ranks: np.ndarray) -> np.ndarray:
        """Character offsets ``(n, 2)`` of each token, as the library reports them: a token
        holding part of a character covers the whole character."""
        ends = np.cumsum(self._lengths[ranks])
        starts = ends - self._lengths[ranks]
        if text.isascii():
            return np.stack([starts, ends], axis=1)
        raw = np.frombuffer(text.encode("utf-8", "surrogatepass"), dtype=np.uint8)
        lead = np.append((raw & 0xC0) != 0x80, True)
        char = np.append(np.cumsum(lead[:-1]) - 1, len(text))
        return np.stack([char[starts], char[ends] + ~lead[ends]], axis=1).astype(np.int64)


    def byte_ends(self, ranks: np.ndarray) -> np.ndarray:
        """The UTF-8 byte position where each token of ``ranks`` ends (its text's bytes
        from 0; the tokens of several texts one after another: theirs joined)."""
        return np.cumsum(self._lengths[ranks])


def same_conversion(doc: dict, entry: Entry) -> bool:
    """Whether a cached conversion may be trusted for ``doc``: a refusal always (it only
    sends the tokenizer to the library, the reference); an eligible one when it is, table
    and meta, what ``convert`` gives for the file now, all but the one verdict too costly
    to derive again at every load (every token encodes to itself by its merges), which
    stays the cache's together with the self-check's proof (``engine``): the ranks, ids,
    pattern, special tokens and evidence recorded never come from the cache alone."""
    meta, arrays = entry
    if not meta.get("eligible"):
        return True
    want_meta, want_arrays = convert(doc, reachable=False)
    if {k: v for k, v in meta.items() if k != "proof"} != want_meta or set(arrays) != set(want_arrays):
        return False
    return all(arrays[k].dtype == v.dtype and np.array_equal(arrays[k], v) for k, v in want_arrays.items())


def load_fast_bpe(doc: Callable[[], dict], file_sha256: str, name: str = "hf"
                  ) -> tuple[FastBPE | None, str | None, Entry]:
    """``(FastBPE, None, entry)`` for an eligible ``tokenizer.json``, else ``(None, why not,
    entry)``; the conversion (the cache ``entry``) comes from the user's cache after the
    first load once checked against ``doc()``, the parsed file (``same_conversion``)."""
    meta, arrays = cached(CACHE_KIND, file_sha256, lambda: convert(doc()), lambda e: same_conversion(doc(), e))
    if not meta.get("eligible"):
        return None, meta.get("reason") or "not eligible", (meta, arrays)
    return FastBPE(meta, arrays, name), None, (meta, arrays)


def remember_proof(file_sha256: str, entry: Entry, proof: dict) -> None:
    """Keep the self-check's result beside the conversion (``meta["proof"]``)."""
    meta, arrays = entry
    write_entry(CACHE_KIND, file_sha256, {**meta, "proof": proof}, dict(arrays))
