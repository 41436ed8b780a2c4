"""curate: canonical keys, shingles and LSH, the driver's duplicate decision in input
order, and evaluation n-grams."""

from __future__ import annotations

import numpy as np
import pytest

from sftdata.curate import Deduplicator, RecordKeys, build_eval_index, canonical_text, exact_key
from sftdata.curate.decontaminate import item_text, ngram_hashes, words
from sftdata.curate.minhash import band_keys, lsh_params, shingle_hashes, signatures
from sftdata.errors import UsageError
from sftdata.records.conversation import parse_record


def conv(*texts):
    msgs = [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(texts)]
    return parse_record(__import__("json").dumps({"messages": msgs}).encode(), "x:line 1", "chat")


def test_whitespace_and_formats_do_not_change_the_exact_key():
    a = conv("What is  2+2?\n", "It is 4.")
    b = conv("  What is 2+2?", "It   is\n4.")
    share = parse_record(b'{"conversations": [{"from": "human", "value": "What is 2+2?"}, '
                         b'{"from": "gpt", "value": "It is 4."}]}', "x:line 2", "chat")
    assert exact_key(canonical_text(a)) == exact_key(canonical_text(b)) == exact_key(canonical_text(share))
    assert exact_key(canonical_text(a)) != exact_key(canonical_text(conv("What is 2+2?", "It is 5.")))
    # a role is part of the text: the same words said by the other side differ
    assert canonical_text(conv("hi", "yo")) != canonical_text(conv("hi yo", "x"))


def test_the_same_words_about_other_images_are_not_duplicates():
    def with_image(ref):
        return parse_record({"messages": [{"role": "user", "content": [{"type": "image", "image": ref}, "What is it?"]},
                                          {"role": "assistant", "content": "A cat."}]}, "f:line 1", media=True)
    a, b = canonical_text(with_image("a.png")), canonical_text(with_image("b.png"))
    assert exact_key(a) != exact_key(b) and exact_key(a) == exact_key(canonical_text(with_image("a.png")))
    assert a.endswith("\x1fmedia:image=a.png\x1eassistant\x1fA cat.")


def test_shingles_cover_each_range_and_a_short_range_is_one_shingle():
    ids = np.arange(20, dtype=np.uint32)
    flat, off = shingle_hashes(ids, np.array([0, 10, 17]), np.array([10, 17, 20]), k=5)
    assert off.tolist() == [0, 6, 9, 10]
    again, _ = shingle_hashes(np.concatenate([ids[10:17], ids[:10]]), np.array([7]), np.array([17]), k=5)
    assert np.array_equal(np.sort(again), np.sort(flat[:6]))  # the same tokens, the same shingles
    assert len(set(flat.tolist())) == 10


def test_signatures_estimate_jaccard():
    pytest.importorskip("rensa")
    rng = np.random.default_rng(0)
    base = rng.integers(0, 2**63, 400, dtype=np.uint64)
    near = base.copy()
    near[:20] = rng.integers(0, 2**63, 20, dtype=np.uint64)  # Jaccard 380 / 420 = 0.905
    other = rng.integers(0, 2**63, 400, dtype=np.uint64)
    sig = signatures(np.concatenate([base, near, other]), np.array([0, 400, 800, 1200], dtype=np.uint64))
    assert sig.shape == (3, 128) and sig.dtype == np.uint32
    assert abs(np.mean(sig[0] == sig[1]) - 380 / 420) < 0.08
    assert np.mean(sig[0] == sig[2]) < 0.05
    assert np.array_equal(sig, signatures(np.concatenate([base, near, other]), np.array([0, 400, 800, 1200])))


def test_lsh_parameters_and_bands():
    assert lsh_params(0.85, 128) == (11, 11)
    assert lsh_params(0.5, 128)[0] > 11  # a lower threshold: more, shorter bands
    sig = np.arange(256, dtype=np.uint32).reshape(2, 128)
    k = band_keys(sig, 8, 16)
    assert k.shape == (2, 8) and len(set(k.ravel().tolist())) == 16
    same = sig.copy()
    same[1, :16] = sig[0, :16]  # band 0 equal
    assert band_keys(same, 8, 16)[0, 0] == band_keys(same, 8, 16)[1, 0]


def keys(records, texts, sigs=None):
    return RecordKeys(np.array(records, dtype=np.int64), [f"in.jsonl:line {r + 1}" for r in records],
                      [exact_key(t) for t in texts], sigs, [])


def test_first_occurrence_is_kept_and_named():
    d = Deduplicator("exact")
    assert d.decide(keys([0, 1], ["a", "b"])) == []
    drops = d.decide(keys([5, 7], ["b", "c"]))  # record 5 repeats record 1 of an earlier chunk
    assert [(x.record, x.kept_record, x.kept_where, x.kind) for x in drops] == [(5, 1, "in.jsonl:line 2", "exact")]
    assert drops[0].message() == ("the same conversation as record 1 (in.jsonl:line 2), which is kept (the first "
                                  "occurrence)")
    assert d.counts() == {"mode": "exact", "exact_duplicates": 1}


def test_off_counts_exact_duplicates_and_drops_nothing():
    d = Deduplicator("off")
    assert d.decide(keys([0, 1, 2, 3], ["a", "a", "b", "a"])) == []
    assert d.counts() == {"mode": "off", "exact_duplicates": 2}
    assert d.decide(keys([4, 5, 6], ["c", "b", "c"])) == []  # across chunks: b seen before, c twice here
    assert d.counts() == {"mode": "off", "exact_duplicates": 4}


def test_near_duplicates_of_kept_records_only():
    rng = np.random.default_rng(1)
    a = rng.integers(0, 2**32, 128, dtype=np.uint32)
    b = a.copy()
    b[:10] += 1  # 118 / 128 = 0.92 agree
    c = b.copy()
    c[10:25] += 1  # 103 / 128 = 0.80 with a, 0.88 with b
    d = Deduplicator("near", 0.85)
    drops = d.decide(keys([0, 1, 2], ["a", "b", "c"], np.stack([a, b, c])))
    # b is a near duplicate of a and dropped; c is near b only, which was not kept: c stays
    assert [(x.record, x.kept_record, x.kind, round(x.similarity, 3)) for x in drops] == [(1, 0, "near", 0.922)]
    assert "estimated Jaccard similarity 0.92 of its token shingles) of record 0" in drops[0].message()
    assert d.counts()["near_duplicates"] == 1 and d.counts()["bands"] == 11


def test_bad_settings_are_refused():
    with pytest.raises(UsageError, match="--dedup must be one of off, exact, near, got 'fuzzy'"):
        Deduplicator("fuzzy")
    with pytest.raises(UsageError, match=r"--dedup-threshold must be in \(0, 1\], got 1.5"):
        Deduplicator("near", 1.5)


def test_eval_ngrams_ignore_case_and_punctuation():
    assert words("Hello, World! It's 2x.") == ["hello", "world", "it", "s", "2x"]
    assert item_text({"question": "Q?", "choices": ["a", "b"], "id": 3}) == "Q?\na\nb"
    idx = build_eval_index([("ev.jsonl", [(0, "ev.jsonl:line 1", "one two three four five"),
                                          (1, "ev.jsonl:line 2", "too short")])], n=4)
    assert idx.describe() == [{"path": "ev.jsonl", "items": 2, "too_short": 1}]
    assert idx.first_hit("So: ONE two, three... four!") == (0, "one two three four")
    assert idx.first_hit("one two three five") is None
    assert ngram_hashes(["a", "b"], 3).size == 0
    with pytest.raises(UsageError, match="--decontaminate-ngram must be >= 1, got 0"):
        build_eval_index([], n=0)
