"""A ``tokenizer.json``'s byte-level BPE vocabulary and merges as whole arrays, for the fast
engine (``fast_bpe``): GPT-2's byte alphabet, the merges' order checked and the tiktoken
table cut with a dozen numpy calls, not a Python loop per token or merge. Each route says
None wherever its arrays cannot decide, and ``fast_bpe`` falls back to the next (the id
route, the array route, the loop, which alone words a refusal).

* ``merge_ids_fast`` (the id route): a vocabulary whose ids are its places in the file
  (Llama 3's, Qwen's). Its tokens' bytes come from one table over UTF-16 code units; the
  merges, joined as one text, are compared as bytes, each merged token with the one
  before (runs of one token) and the first of each run with the vocabulary's next token
  by id: what the merges make, in which order, checked without a lookup per merge. The
  merges' parts are looked up once each as a set.
* ``merge_order_fast`` (the array route): any vocabulary, each merged token looked up.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable

import numpy as np

from .ranks import _spread


def byte_alphabet() -> dict[str, int]:
    """GPT-2's printable stand-in character for each byte: ``{"Ġ": 32, "!": 33, ...}``."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


TO_LATIN1 = str.maketrans({c: chr(b) for c, b in byte_alphabet().items()})


def token_bytes(s: str) -> bytes:
    """A vocabulary string's bytes (``UnicodeEncodeError`` when it leaves the alphabet)."""
    return s.translate(TO_LATIN1).encode("latin-1")


def _distinct(values: np.ndarray) -> bool:
    ordered = np.sort(values)
    return bool(np.all(ordered[1:] != ordered[:-1]))


def merge_order_fast(vocab: dict[str, int], merges, alphabet: dict[str, int], contents: set
                      ) -> tuple[list[str], np.ndarray] | None:
    """``fast_bpe._merge_order``'s tokens and their ids, from whole arrays (a dozen calls over the
    merges, not a Python loop): None where it cannot say (merges not all ``"a b"`` strings
    or all ``[a, b]`` pairs of strings, an empty token, ids not all integers or shared by two
    tokens, a merge that does not qualify), and ``fast_bpe._merge_order`` decides, with its reason."""
    if not isinstance(merges, list) or not merges or "" in vocab or set(map(type, vocab.values())) != {int}:
        return None
    try:
        kinds = set(map(type, merges))
        if kinds == {str} and set(map(str.count, merges, itertools.repeat(" "))) == {1}:
            parts = " ".join(merges).split(" ")
        elif kinds == {list} and set(map(len, merges)) == {2}:
            parts = list(itertools.chain.from_iterable(merges))
            if set(map(type, parts)) != {str}:
                return None
        else:
            return None
        if not vocab.keys() >= set(parts):  # a merge of a part not in the vocabulary
            return None
        made = list(map(str.__add__, parts[0::2], parts[1::2]))
        t = np.fromiter(map(vocab.get, made, itertools.repeat(-1)), dtype=np.int64, count=len(made))
        ids = np.fromiter(vocab.values(), dtype=np.int64, count=len(vocab))
    except (TypeError, ValueError, OverflowError):  # ids that are not integers: the loop says what is wrong
        return None
    if min(t.min(), ids.min()) < 0 or not _distinct(ids):
        return None
    heads = np.flatnonzero(np.concatenate(([True], t[1:] != t[:-1])))  # the first merge of each run of one token
    firsts_made = t[heads]
    if not _distinct(firsts_made):  # a token's merges apart
        return None
    others = [vocab[c] for c in [*alphabet, *(c for c in contents if isinstance(c, str) and c in vocab)]]
    if not np.isin(ids, np.concatenate([firsts_made, np.asarray(others, dtype=np.int64)])).all():
        return None  # a vocabulary token no merge makes
    return list(map(made.__getitem__, heads.tolist())), firsts_made


# characters of GPT-2's byte alphabet: a vocabulary of these alone maps one to one onto byte strings
_ALPHABET_ONLY = re.compile("[" + re.escape("".join(byte_alphabet())) + "]*")


def table_by_strings(vocab: dict[str, int], alphabet: dict[str, int], merged: list[str], merged_ids: np.ndarray,
                     identity: bool) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray, int] | None:
    """``fast_bpe._table_by_dict``'s result from whole arrays: the tokens' strings joined, translated and
    encoded once, cut by their lengths. None where a token holds a character outside the
    alphabet (two tokens could then share their bytes: the dict decides)."""
    tokens = [*alphabet, *merged]
    joined = "".join(tokens)
    if _ALPHABET_ONLY.fullmatch(joined) is None:
        return None
    blob = np.frombuffer(joined.translate(TO_LATIN1).encode("latin-1"), dtype=np.uint8)
    sizes = np.fromiter(map(len, tokens), dtype=np.uint32, count=len(tokens))
    ids = np.concatenate([np.fromiter((vocab[c] for c in alphabet), dtype=np.int64, count=len(alphabet)), merged_ids])
    return _assembled(blob, sizes, ids, identity)


def table_by_id(vocab: dict[str, int], alphabet: dict[str, int], merged_ids: np.ndarray, vocab_bytes, identity: bool
                 ) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray, int]:
    """``table_by_strings``'s result cut from the vocabulary's bytes in id order (``vocab_in_id_order``)."""
    blob, offsets = vocab_bytes
    ids = np.concatenate([np.fromiter((vocab[c] for c in alphabet), dtype=np.int64, count=len(alphabet)), merged_ids])
    sizes = np.diff(offsets)[ids]
    return _assembled(blob[_spread(offsets[ids], sizes)], sizes.astype(np.uint32), ids, identity)


def _assembled(blob: np.ndarray, sizes: np.ndarray, ids: np.ndarray, identity: bool
               ) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray, int]:
    """The table of the tokens whose bytes are ``blob`` cut by ``sizes``, of ids ``ids``:
    ranks the ids (``identity``) or their places."""
    ranks = ids if identity else np.arange(len(ids), dtype=np.int64)
    n = int(ranks.max()) + 1
    rank_to_id = np.zeros(n, dtype=np.uint32)
    lengths = np.zeros(n, dtype=np.uint32)
    rank_to_id[ranks] = ids
    lengths[ranks] = sizes
    return {"blob": blob, "lengths": sizes, "ranks": ranks.astype(np.uint32)}, rank_to_id, lengths, n


# GPT-2's byte alphabet as a table over UTF-16 code units: the byte a character stands for,
# -2 for a space (a merge's separator, never a vocabulary character), -1 for any other unit
_UNIT_BYTE = np.full(1 << 16, -1, dtype=np.int16)
_UNIT_BYTE[[ord(c) for c in byte_alphabet()]] = list(byte_alphabet().values())
_UNIT_BYTE[ord(" ")] = -2


def _unit_bytes(text: str) -> np.ndarray | None:
    """The bytes GPT-2's alphabet maps ``text``'s characters to (-2 for a space), or None
    where a character is outside it (a surrogate pair too: two units, both outside)."""
    units = _UNIT_BYTE[np.frombuffer(text.encode("utf-16-le", "surrogatepass"), dtype=np.uint16)]
    return None if units.size and units.min() == -1 else units


def vocab_in_id_order(vocab: dict[str, int]) -> tuple[np.ndarray, np.ndarray] | None:
    """``(bytes, offsets)`` of the vocabulary where its ids are its places in the file
    (0, 1, 2, ...: Llama 3's, Qwen's) and every token is non-empty and of the byte
    alphabet: token ``i``'s bytes are ``bytes[offsets[i]:offsets[i + 1]]``. Else None."""
    try:
        if set(map(type, vocab.values())) != {int} or not np.array_equal(
                np.fromiter(vocab.values(), dtype=np.int64, count=len(vocab)), np.arange(len(vocab))):
            return None
    except OverflowError:  # an id past int64
        return None
    units = _unit_bytes("".join(vocab))
    sizes = np.fromiter(map(len, vocab), dtype=np.int64, count=len(vocab))
    if units is None or units.size != sizes.sum() or (units < 0).any() or not sizes.all():
        return None
    return units.astype(np.uint8), np.concatenate(([0], np.cumsum(sizes)))


def _merge_units(merges) -> tuple[np.ndarray, np.ndarray, Iterable[str]] | None:
    """The merges joined as ``"a b a b ..."`` in ``_unit_bytes``, the places of its spaces, and
    the merges' parts, where each is one ``"a b"`` string or one ``[a, b]`` pair of strings
    with no space in a part, all of the alphabet; else None."""
    if not isinstance(merges, list) or not merges:
        return None
    kinds = set(map(type, merges))
    try:
        if kinds == {list} and set(map(len, merges)) == {2}:
            text = " ".join(itertools.chain.from_iterable(merges))  # a TypeError for a part that is no string
            parts, ends = itertools.chain.from_iterable(merges), None
        elif kinds == {str}:
            text = " ".join(merges)
            sizes = np.fromiter(map(len, merges), dtype=np.int64, count=len(merges))
            parts, ends = text.split(" "), np.cumsum(sizes + 1)[:-1] - 1  # the spaces between merges
        else:
            return None
    except TypeError:
        return None
    units = _unit_bytes(text)
    spaces = None if units is None else np.flatnonzero(units == -2)
    if spaces is None or spaces.size != 2 * len(merges) - 1 or (ends is not None and not np.array_equal(
            spaces[1::2], ends)):  # the spaces between merges, and exactly one more in each
        return None
    return units, spaces, parts


def merge_ids_fast(vocab: dict[str, int], merges, alphabet: dict[str, int], contents: set, vocab_bytes
                   ) -> np.ndarray | None:
    """``merge_order_fast``'s ids where the vocabulary is in id order (``vocab_in_id_order``,
    ``vocab_bytes``) and the merges make its tokens in that order, each but the bytes and
    the added tokens, all merges of a token together: compared as bytes, one merge with
    the one before, the first of each run with the next token, not looked up one by one.
    None where that is not so (``merge_order_fast`` then decides)."""
    joined = None if vocab_bytes is None else _merge_units(merges)
    if joined is None or set(joined[2]).difference(vocab):  # (a set's own lookup of each in the dict)
        return None  # a part not in the vocabulary, or empty (the array route and the loop say which)
    units, spaces, _ = joined
    made = units[units != -2].astype(np.uint8)  # the merged tokens' bytes, one after another
    sizes = np.diff(np.concatenate(([-1], spaces, [units.size]))) - 1
    sizes = sizes[0::2] + sizes[1::2]
    blob, offsets = vocab_bytes
    starts = np.cumsum(sizes) - sizes
    shift = np.repeat(sizes, sizes)
    differs = made != made[np.arange(made.size) - shift]  # each byte against the one a token before
    same = np.concatenate(([False], (sizes[1:] == sizes[:-1]) & ~np.logical_or.reduceat(differs, starts)[1:]))
    heads = np.flatnonzero(~same)  # the first merge of each run of one token
    keep = np.ones(len(vocab), dtype=bool)
    keep[[vocab[c] for c in alphabet]] = False
    keep[[vocab[c] for c in contents if isinstance(c, str) and c in vocab]] = False
    ids = np.flatnonzero(keep)  # the tokens the merges must make, in id order
    lengths = np.diff(offsets)[ids]
    if heads.size != ids.size or not np.array_equal(sizes[heads], lengths):
        return None
    if not np.array_equal(made[_spread(starts[heads], lengths)], blob[_spread(offsets[ids], lengths)]):
        return None
    return ids
