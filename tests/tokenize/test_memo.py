import random
import sys

import numpy as np
import pytest

from sftdata.chat.render import SPLIT_SAFE_PATTERNS, TOOLS_HEADER, render_batch, render_chunk, splits_at_newlines, system_parts
from sftdata.errors import UsageError
from sftdata.prepare import PrepareOptions, pool, prepare
from sftdata.records.tools import parse_tool
from sftdata.store import open_dataset
from sftdata.tokenize.memo import ENTRY_BYTES, PROBE_EVERY, SEEN_BYTES, WINDOW_CALLS, SegmentMemo, id_array
from tests.helpers.agent import agent_records
from tests.helpers.data import chat, write_jsonl


def tree_bytes(root):
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


class Counting:
    """``tok`` that records every text it encodes."""

    def __init__(self, tok):
        self.tok, self.seen = tok, []
        self.ranks_sha256, self.pat_str = tok.ranks_sha256, tok.pat_str

    def encode_batch(self, texts):
        self.seen.extend(texts)
        return self.tok.encode_batch(texts)


def counting(tok):
    c = Counting(tok)
    return c, c.seen


LONG = "A long system prompt that repeats in every record of an agent dataset. " * 3


def test_a_repeated_text_is_encoded_once_and_its_ids_are_exact(tok):
    memo = SegmentMemo(tok, 1 << 20)
    enc, seen = counting(tok)
    texts = [LONG, "hi", LONG, LONG + "!", LONG]
    pieces, lengths = memo.encode(texts, enc)
    assert [p.tolist() for p in pieces] == [tok.encode(t) for t in texts]
    assert lengths == [len(tok.encode(t)) for t in texts]
    assert seen == [LONG, "hi", LONG + "!"]  # within a call: each distinct text once; "hi" is never looked up
    n = len(tok.encode(LONG))
    st = memo.stats
    assert (st.lookups, st.hits, st.tokens_reused) == (4, 2, 2 * n)
    # a second call: LONG was seen three times, so it was stored; LONG + "!" was seen once, so not yet
    seen.clear()
    pieces, _ = memo.encode([LONG, LONG + "!"], enc)
    assert seen == [LONG + "!"] and pieces[0] == id_array(tok.encode(LONG))
    seen.clear()
    memo.encode([LONG + "!"], enc)  # stored on its second sighting
    assert seen == []
    took = memo.take_stats()
    assert took.hits == 4 and took.peak_bytes == memo.peak_bytes > 0
    assert memo.stats.hits == 0  # each chunk reports its own


def test_the_memo_stays_within_its_cap_and_keeps_the_frequent_texts(tok):
    rng = random.Random(1)
    frequent = [f"frequent segment {i} " * 8 for i in range(4)]
    cost = max(sys.getsizeof(t) + sys.getsizeof(id_array(tok.encode(t))) for t in frequent) + ENTRY_BYTES
    cap = 30 * cost
    results = {}
    for policy in ("frequency", "lru"):
        memo = SegmentMemo(tok, cap, policy=policy)
        for step in range(60):
            once = [f"a text seen once {step} {k} " * 8 for k in range(40)]  # a burst of one-offs
            batch = frequent + once
            rng.shuffle(batch)
            memo.encode(batch, tok)
            assert memo.bytes <= cap and memo.peak_bytes <= cap
        results[policy] = memo.take_stats()
    freq, lru = results["frequency"], results["lru"]
    assert lru.evictions > 0  # the frequency memo never stored a one-off, so it had nothing to evict
    # each step, the frequency memo serves the 4 frequent texts (from the second step on); LRU lost them to one-offs
    assert freq.hits == 4 * 58
    assert lru.hits < freq.hits / 2


def test_a_memo_serves_one_tokenizer_only(tok):
    other = type("Other", (), {"file_sha256": "ab" * 32, "encode_batch": tok.encode_batch})()
    memo = SegmentMemo(tok, 1 << 20)
    memo.encode([LONG, LONG], tok)
    with pytest.raises(ValueError, match="this memo holds the ids of another tokenizer"):
        memo.encode([LONG], other)
    same_ranks_other_pattern = type("T", (), {"ranks_sha256": tok.ranks_sha256, "pat_str": r"\s+|\S+"})()
    assert SegmentMemo(same_ranks_other_pattern, 1).identity != memo.identity
    with pytest.raises(ValueError, match="memo policy must be one of"):
        SegmentMemo(tok, 1 << 20, policy="random")


def test_sightings_cost_memory_too(tok):
    memo = SegmentMemo(tok, 10 * SEEN_BYTES + 100_000)
    memo.encode([f"{i} unique text that is long enough to be looked up, once only" for i in range(50)],
                tok)
    assert memo.bytes <= memo.cap_bytes and len(memo._seen) <= 50


# -- splitting the system span -------------------------------------------------------------
PIECES = [" ", "  ", "\t", "\n", "\r\n", "\n\n", " \n", "x", "word", "Word", "42", "12345", "{", "}", '"',
          "'s", "é", "中文", "!?", "/", "-", ".", ":", "\u00a0", "  \t\n "]


def random_text(rng, n):
    return "".join(rng.choice(PIECES) for _ in range(n))


def test_cl100k_encodes_a_newline_ended_text_and_what_follows_apart(tok):
    """The property the system span's split rests on, over adversarial whitespace."""
    assert splits_at_newlines(tok) and tok.pat_str in SPLIT_SAFE_PATTERNS
    rng = random.Random(0)
    for _ in range(3000):
        a = random_text(rng, rng.randint(0, 12)) + rng.choice(["\n", " \n", "\n\n", "\r\n", "\t\n", "x\n"])
        b = rng.choice(["{", "[", '"', "-", "1", "x", "é", "}"]) + random_text(rng, rng.randint(0, 12))
        assert tok.encode(a + b) == tok.encode(a) + tok.encode(b), (a, b)


def test_a_pattern_not_proven_is_not_split(tok):
    """GPT-2's pattern splits "  \\n" differently when text follows: such a tokenizer keeps
    its system span whole."""
    import tiktoken

    gpt2_pat = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
    enc = tiktoken.Encoding("gpt2-like", pat_str=gpt2_pat, mergeable_ranks=tok._enc._mergeable_ranks,
                            special_tokens={})
    a, b = "tools:  \n", "{}"
    assert enc.encode_ordinary(a + b) != enc.encode_ordinary(a) + enc.encode_ordinary(b)
    assert not splits_at_newlines(type("T", (), {"pat_str": gpt2_pat})())


def test_system_parts_join_to_the_system_text():
    rec = agent_records(1)[0]
    conv = parse_tool(rec, "f:line 1")
    parts = system_parts(conv)
    assert len(parts) == 1 + len(conv.tools)
    assert parts[0] == rec["messages"][0]["content"] + "\n\n" + TOOLS_HEADER
    assert all(p.endswith("\n") for p in parts[:-1]) and all(not p[0].isspace() for p in parts[1:])


def test_a_chunk_renders_the_same_ids_with_and_without_the_memo(tok):
    convs = [parse_tool(r, f"f:line {i + 1}") for i, r in enumerate(agent_records(40, seed=3))]
    plain = render_chunk(convs, tok, max_tokens=700)
    memo = SegmentMemo(tok, 1 << 20)
    for _ in range(2):  # the second time, everything long is served from the memo
        with_memo = render_chunk(convs, tok, max_tokens=700, memo=memo)
        assert np.array_equal(plain.ids, with_memo.ids) and np.array_equal(plain.mask, with_memo.mask)
        assert np.array_equal(plain.lengths, with_memo.lengths)
        assert [str(r) for r in plain.results] == [str(r) for r in with_memo.results]
    assert memo.stats.hits > 0 and any(not isinstance(r, int) for r in plain.results)  # some too_long
    singles = render_batch(convs, tok, max_tokens=700)
    kept = [r for r in singles if not isinstance(r, Exception)]
    assert np.array_equal(np.concatenate([r.ids for r in kept]), plain.ids)


def _chunks_served(memo, calls, tok):
    """Feed ``calls`` (lists of texts) as render_chunk does, one ``serves()`` per chunk: which were served."""
    served = []
    for texts in calls:
        if memo.serves():
            memo.encode(texts, tok)
            served.append(True)
        else:
            served.append(False)
    return served


def _unique(i: int, n: int = 6) -> list[str]:
    return [f"text number {i}-{k}, long enough to be looked up by the memo of encoded texts ({i * 7 + k})"
            for k in range(n)]


def test_a_memo_that_saves_nothing_goes_idle_after_one_window_and_probes(tok):
    memo = SegmentMemo(tok, 1 << 20)
    served = _chunks_served(memo, [_unique(i) for i in range(WINDOW_CALLS + 2 * PROBE_EVERY)], tok)
    # a full window served, then only every PROBE_EVERY-th chunk (a probe that finds no repeat)
    assert served == [True] * WINDOW_CALLS + ([False] * (PROBE_EVERY - 1) + [True]) * 2
    assert memo.idle and memo.stats.lookups == (WINDOW_CALLS + 2) * 6
    assert memo.stats.chunks_idle == 2 * (PROBE_EVERY - 1)


def test_an_idle_memo_wakes_at_the_probe_that_finds_repeats(tok):
    memo = SegmentMemo(tok, 1 << 20)
    _chunks_served(memo, [_unique(i) for i in range(WINDOW_CALLS)], tok)
    assert memo.idle
    prompt = "You are a helpful agent with tools. " * 20
    repeating = [[prompt, f"question {i} about the weather in some city, asked at length, {i}"] * 3
                 for i in range(PROBE_EVERY + 3)]
    served = _chunks_served(memo, repeating, tok)
    assert served == [False] * (PROBE_EVERY - 1) + [True] * 4  # the probe found the prompt 3 times: awake
    assert not memo.idle


def test_a_memo_that_pays_never_goes_idle(tok):
    memo = SegmentMemo(tok, 1 << 20)
    prompt = "A long system prompt shared by every record of an agent dataset. " * 10
    served = _chunks_served(memo, [[prompt, f"user turn {i}"] for i in range(5 * WINDOW_CALLS)], tok)
    assert all(served) and not memo.idle and memo.stats.chunks_idle == 0


def test_an_idle_memo_renders_the_same_ids(tok):
    convs = [parse_tool(r, f"f:line {i + 1}") for i, r in enumerate(agent_records(20, seed=4))]
    plain = render_chunk(convs, tok)
    memo = SegmentMemo(tok, 1 << 20)
    memo.idle = True  # as after a window that saved too little
    idle = render_chunk(convs, tok, memo=memo)
    assert np.array_equal(plain.ids, idle.ids) and np.array_equal(plain.mask, idle.mask)
    assert memo.stats.lookups == 0 and memo.stats.chunks_idle == 1
    markers = int(np.isin(plain.ids, list(tok.special_tokens.values())).sum())
    assert memo.stats.tokens_encoded == plain.ids.size - markers  # the figures still add up


# -- prepare ---------------------------------------------------------------------------------
def test_prepare_is_byte_identical_with_the_memo_on_off_and_at_any_worker_count(tmp_path, monkeypatch, tok):
    monkeypatch.setattr(pool, "CHUNK_RECORDS", 16)  # many chunks: the memo carries over between them
    src = write_jsonl(tmp_path / "agent.jsonl", agent_records(150, seed=5) + ["not json"])
    trees = {}
    for name, extra in {"off": dict(memo_mb=0), "on": dict(memo_mb=64), "on2": dict(memo_mb=64, workers=2),
                        "tiny": dict(memo_mb=0.02, memo_policy="lru"), "tiny2": dict(memo_mb=0.02, workers=2)}.items():
        summary = prepare([src], tmp_path / name, PrepareOptions(mode="tool", val_split=0.1, **extra))
        trees[name] = tree_bytes(tmp_path / name)
        m = summary.memo
        if name == "off":
            assert summary.as_dict()["memo"]["lookups"] == 0 and m.tokens_reused == 0
            continue
        # every text token (all but markers and EOS) was either encoded or reused: the figures add up
        ds = open_dataset(tmp_path / name)
        ids = np.concatenate([sh.tokens for sh in ds.shards])
        markers = int(np.isin(ids, list(tok.special_tokens.values())).sum())
        tokens = int(ids.size)
        assert m.tokens_reused + m.tokens_encoded == tokens - markers
        tiny = name.startswith("tiny")
        assert m.hits <= m.lookups and m.hit_rate > (0.4 if tiny else 0.5) and m.reused_share > (0.5 if tiny else 0.8)
        assert m.peak_bytes <= PrepareOptions(memo_mb=extra["memo_mb"], workers=extra.get("workers", 1)
                                              ).memo_bytes_per_worker()
        if name == "tiny":
            assert m.evictions > 0
    assert trees["off"] == trees["on"] == trees["on2"] == trees["tiny"] == trees["tiny2"]


def test_memo_mb_must_not_be_negative(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", [chat("q", "a")])
    for bad in (-1, float("nan"), float("inf")):
        with pytest.raises(UsageError, match=r"--memo-mb must be 0 \(no memo\) or a positive number of megabytes"):
            prepare([src], tmp_path / "out", PrepareOptions(memo_mb=bad))
    with pytest.raises(UsageError, match="memo_policy must be one of frequency, lru, not 'mru'"):
        prepare([src], tmp_path / "out", PrepareOptions(memo_policy="mru"))
    assert not (tmp_path / "out").exists()


def test_cli_reports_the_memo_and_refuses_a_negative_cap(tmp_path):
    import json

    from typer.testing import CliRunner

    from sftdata.cli import app

    runner = CliRunner()
    src = write_jsonl(tmp_path / "agent.jsonl", agent_records(30, seed=2))
    r = runner.invoke(app, ["prepare-tool", str(src), "-o", str(tmp_path / "a"), "-j", "1"])
    assert r.exit_code == 0, r.output
    assert "memo of encoded texts" in r.output and "tokens not re-encoded" in r.output
    r = runner.invoke(app, ["prepare-tool", str(src), "-o", str(tmp_path / "b"), "-j", "1", "--json", "--memo-mb", "8"])
    memo = json.loads(r.stdout)["memo"]
    assert memo["memo_mb"] == 8 and memo["hits"] > 0 and 0 < memo["hit_rate"] <= 1
    assert memo["tokens_reused"] > memo["tokens_encoded"] and memo["peak_mb_per_worker"] <= 8
    r = runner.invoke(app, ["prepare-tool", str(src), "-o", str(tmp_path / "c"), "-j", "1", "--memo-mb", "0"])
    assert r.exit_code == 0 and "memo of encoded texts" not in r.output
    r = runner.invoke(app, ["prepare-tool", str(src), "-o", str(tmp_path / "d"), "--memo-mb", "-5"])
    assert r.exit_code == 2 and "--memo-mb must be 0 (no memo) or a positive number of megabytes, got -5.0" in r.output


@pytest.mark.parametrize("policy", ["frequency", "lru"])
def test_the_memory_the_memo_really_holds_stays_within_its_cap(tok, policy):
    import gc
    import tracemalloc

    rng = random.Random(3)
    src = [" ".join(str(rng.random()) for _ in range(rng.randint(5, 60))) for _ in range(1500)]
    cap = 256 << 10
    memo = SegmentMemo(tok, cap, policy)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(3):
            memo.encode(["".join([t[:1], t[1:]]) for t in src], tok)  # fresh strings, as parsed records give
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert memo.peak_bytes <= cap and memo.bytes <= cap
    assert held <= cap
    if policy == "lru":  # every text stored at once, so the memo filled and evicted
        assert memo.stats.evictions > 0
