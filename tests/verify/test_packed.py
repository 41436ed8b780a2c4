"""verify on packed datasets: clean bfd and stream datasets pass; each fault of the row
geometry, the segments, the per-segment mask, the padding and the episode references
is caught with its own message."""

from __future__ import annotations

import re
import shutil

import numpy as np
import pytest

from sftdata.errors import DatasetError
from sftdata.store import open_dataset
from sftdata.verify import PACKED_CHECKS, verify
from tests.helpers.audit import edit_metadata, make_packed, read_idx, read_segments, shard, write_idx, write_segments

# bfd, block 63 (rows of 64), 2 rows per shard. train/shard_00000:
#   row 0: segment 0 = episode 1 at [0, 28), segment 1 = episode 5 at [28, 53), padding [53, 64)
#   row 1: segment 2 = episode 3 at [0, 30), segment 3 = episode 7 at [30, 59)
# stream, block 40 (rows of 41): row 1 starts with segment 2, whose first token is an
# injected <|USER|> (prefix 1), episode 1 from its token 22.
L = 64


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    t = tmp_path_factory.mktemp("packed")
    make_packed(t, "bfd", block_size=63, shard_tokens=128)
    make_packed(t, "stream", source=t / "bfd_src", block_size=40, strategy="stream")
    return t


@pytest.fixture
def bfd(built, tmp_path):
    """A copy of the bfd dataset (its source stays where the metadata says)."""
    out = tmp_path / "bfd"
    shutil.copytree(built / "bfd", out)
    return out


@pytest.fixture
def stream(built, tmp_path):
    out = tmp_path / "stream"
    shutil.copytree(built / "stream", out)
    return out


def problems(ds, check=None, **kw):
    r = verify(ds, **kw)
    return [p for p in r.problems if check is None or p.check == check]


def edit(path, dtype, fn):
    a = np.fromfile(path, dtype=dtype)
    fn(a)
    a.tofile(path)


def test_clean_packed_datasets_pass_every_check(built):
    for name in ("bfd", "stream"):
        r = verify(built / name)
        assert r.ok, [str(p) for p in r.problems]
        assert r.kind == "packed" and [(c.name, c.status) for c in r.checks] == \
            [(c, "skipped" if c == "media" else "ok") for c in PACKED_CHECKS]
        assert r.notes == []
        open_dataset(built / name)
    assert verify(built / "bfd").splits == {"train": {"rows": 4, "tokens": 256, "shards": 2}}


def test_source_gone_checks_references_for_consistency_only(built, tmp_path):
    shutil.copytree(built / "bfd", tmp_path / "bfd")
    edit_metadata(tmp_path / "bfd", lambda m: m["source"].__setitem__("path", str(tmp_path / "gone")))
    r = verify(tmp_path / "bfd", quick=True)
    assert r.ok and r.notes == [f"the source dataset {tmp_path / 'gone'} is not there: segments checked for "
                                "consistency only, not against the source episodes"]


def test_truncated_rows(bfd):
    p = shard(bfd) / "tokens.bin"
    p.write_bytes(p.read_bytes()[:-4])
    rows = [x.message for x in problems(bfd, "rows")]
    assert rows[0] == "127 tokens are not whole rows of 64 (packing.row_len): the file is truncated or from another packing"
    assert rows[1] == "2 row records for the 1 rows of tokens.bin: there must be one per row"
    with pytest.raises(DatasetError, match=r"/bfd: train/shard_00000/mask.bin: 128 mask bytes for the 127 tokens of "
                       r"tokens.bin: tokens and mask differ in count .* \(3 more problem\(s\)\)"):
        open_dataset(bfd)


def test_row_record_moved(bfd):
    p = shard(bfd) / "episodes.idx"
    idx = read_idx(p)
    idx[1, 0] = 0
    write_idx(p, idx)
    (prob,) = problems(bfd, "rows")
    assert (prob.episode, prob.byte) == (1, 16)
    assert prob.message == "row 1 is recorded as tokens [0, +64), not [64, +64): rows must be consecutive blocks of row_len"
    with pytest.raises(DatasetError, match="row 1 is recorded as tokens"):
        open_dataset(bfd)


@pytest.mark.parametrize("change, code, message", [
    (lambda s: s.__setitem__((1, 1), 30), "hole",
     "tokens [28, 30) of row 0 lie between segments 0 and 1: they belong to no segment"),
    (lambda s: s.__setitem__((1, 1), 20), "overlap",
     "segment 1 starts at offset 20 of row 0, inside segment 0 (ends at 28): the segments overlap"),
    (lambda s: s.__setitem__((1, 2), 40), "past_row_end", "segment 1 spans [28, 68) of its row, past the row's 64 tokens"),
    (lambda s: s.__setitem__((2, slice(1, 3)), (2, 28)), "not_at_zero",
     "the first segment of row 1 starts at offset 2, not 0: its positions would not match the tokens"),
    (lambda s: s.__setitem__(slice(0, 2), s[[1, 0]]), "unsorted",
     "segment 1 (row 0, offset 0) comes after segment 0 (row 0, offset 28): segments.idx is not sorted by (row, offset)"),
    (lambda s: s.__setitem__((3, 0), 7), "row_out_of_range", "segment 3 names row 7, but the shard has rows 0..1"),
    (lambda s: s.__setitem__((1, 3), 25), "empty", "segment 1 has length 25 with 25 injected tokens: no episode token"),
])
def test_segment_faults(bfd, change, code, message):
    p = shard(bfd) / "segments.idx"
    seg = read_segments(p)
    change(seg)
    write_segments(p, seg)
    (prob,) = problems(bfd, "segments")
    assert (prob.code, prob.message) == (code, message)
    assert prob.file == "train/shard_00000/segments.idx"
    assert [p.check for p in problems(bfd) if p.check not in ("segments", "checksums", "counts")] == []
    with pytest.raises(DatasetError, match="segments.idx .*" + re.escape(message[:20])):
        open_dataset(bfd)


def test_row_without_segment(bfd):
    p = shard(bfd) / "segments.idx"
    seg = read_segments(p)
    write_segments(p, seg[:2])  # row 1 loses its segments
    msgs = [x.message for x in problems(bfd, "segments")]
    assert msgs == ["row 1 has no segment: a row of padding only"]


def test_mask_on_a_user_token_of_a_segment(bfd):
    edit(shard(bfd) / "mask.bin", np.uint8, lambda m: m.__setitem__(29, 1))  # row 0, segment 1, user text
    (prob,) = problems(bfd, "mask_rule")
    assert (prob.episode, prob.byte, prob.file) == (0, 29, "train/shard_00000/mask.bin")
    assert prob.where == "row 0 of train, byte 29 of mask.bin"  # a packed split's items are rows
    assert prob.message == ("the mask of row 0 differs from the mask rule at 1 token(s): it trains token 29, in "
                            "segment 1 (episode 5), a <|USER|> span")
    open_dataset(bfd)


def test_mask_on_padding_and_untrained_assistant(bfd):
    edit(shard(bfd) / "mask.bin", np.uint8, lambda m: m.__setitem__(L + 60, 1))  # row 1, padding
    (prob,) = problems(bfd, "mask_rule", quick=True)
    assert prob.message == "the mask of row 1 differs from the mask rule at 1 token(s): it trains token 60, in the padding"
    edit(shard(bfd) / "mask.bin", np.uint8, lambda m: m.__setitem__(slice(0, 2 * L), 0))
    (prob,) = problems(bfd, "mask_rule", quick=True)
    assert prob.message == ("the mask of row 0 differs from the mask rule at 23 token(s): it leaves untrained "
                            "token 6, in segment 0 (episode 1), a <|ASSISTANT|> span (1 more rows like it in this shard)")


def test_mask_on_injected_context(stream):
    edit(shard(stream) / "mask.bin", np.uint8, lambda m: m.__setitem__(41, 1))  # row 1, injected <|USER|>
    (prob,) = problems(stream, "mask_rule")
    assert prob.message == ("the mask of row 1 differs from the mask rule at 1 token(s): it trains token 0, in "
                            "segment 0's injected context")


def test_padding_token_changed(bfd):
    edit(shard(bfd) / "tokens.bin", "<u4", lambda t: t.__setitem__(60, 13))
    (prob,) = problems(bfd, "padding")
    assert (prob.episode, prob.byte) == (0, 240)
    assert prob.message == "token 60 of row 0, after its segments end at 53, is id 13, not the padding id 100257"


def test_segment_tokens_differ_from_the_source(bfd):
    edit(shard(bfd) / "tokens.bin", "<u4", lambda t: t.__setitem__(30, 12))  # row 0, segment 1, its token 2
    (prob,) = problems(bfd, "references", quick=True)
    assert prob.code == "tokens_differ" and prob.file == "train/shard_00000/segments.idx"
    assert prob.message == ("segment 1's tokens differ from episode 5 of the source (first at its token 2): the rows "
                            "were not packed from this source, or were changed")


def test_injected_context_changed(stream):
    """The injected tokens are context only (mask 0), but they are what the model sees
    before the row's episode tokens: they must be the conversation's own system span and
    <|USER|>, as stream packing injects them, not anything else."""
    edit(shard(stream) / "tokens.bin", "<u4", lambda t: t.__setitem__(41, 100279))  # <|USER|> -> <|ASSISTANT|>
    (prob,) = problems(stream, "references", quick=True)
    assert prob.code == "prefix_differs" and (prob.episode, prob.byte) == (1, 112)
    assert prob.message == ("segment 2's injected context (1 token(s)) is not what stream packing injects for "
                            "episode 1 at its token 22 (<|USER|>)")
    assert problems(stream, "mask_rule", quick=True) == []


def test_episode_in_two_segments_and_record_mismatch(bfd):
    p = shard(bfd) / "segments.idx"
    seg = read_segments(p)
    seg[1, 4] = 7  # segment 1 claims episode 7, which segment 3 holds
    write_segments(p, seg)
    msgs = [(x.code, x.message) for x in problems(bfd, "references", quick=True)]
    assert msgs[:3] == [
        ("episode_twice", "tokens 0.. of episode 7 are also in another segment: they would be trained twice"),
        ("record_mismatch", "segments of episode 7 name records 5 and 7"),
        ("record_mismatch", "segment names record 5 for episode 7; the source episode came from record 7")]
    seg[1, 4] = 5
    seg[1, 6] = 3
    write_segments(p, seg)
    (prob,) = problems(bfd, "references", quick=True)
    assert prob.message == "segment names record 3 for episode 5; the source episode came from record 5"


def test_packed_counts_off(bfd):
    edit_metadata(bfd, lambda m: m["splits"]["train"].__setitem__("rows", 5))
    (prob,) = problems(bfd)
    assert prob.message == "split train holds 4 rows in 2 shard(s); dataset_metadata.json recorded 5"
    with pytest.raises(DatasetError, match="split train holds 4 rows"):
        open_dataset(bfd)


def test_missing_segments_file_and_bad_row_len(bfd):
    edit_metadata(bfd, lambda m: m["packing"].__setitem__("row_len", "64"))
    r = verify(bfd, quick=True)
    assert [p.message for p in r.problems] == ["a packed dataset needs packing.row_len, an integer >= 2; got '64'"]
    assert {c.name: c.status for c in r.checks}["segments"] == "skipped"


def test_a_row_len_the_tokens_do_not_fit_is_reported_not_a_traceback(bfd):
    """Segments that fit rows of 100 but address tokens the shard does not have (128
    tokens: one row of 100) are compared with the source only where they can be read."""
    edit_metadata(bfd, lambda m: m["packing"].__setitem__("row_len", 100))
    r = verify(bfd, quick=True)
    assert [p.message for p in r.problems if p.check == "rows"][:2] == [
        "128 tokens are not whole rows of 100 (packing.row_len): the file is truncated or from another packing",
        "2 row records for the 1 rows of tokens.bin: there must be one per row"]
    assert {c.name: c.status for c in r.checks}["references"] == "ok"


def test_a_damaged_source_is_a_note_not_an_error(built, tmp_path):
    src = shutil.copytree(built / "bfd_src", tmp_path / "src")
    shutil.copytree(built / "bfd", tmp_path / "bfd")
    edit_metadata(tmp_path / "bfd", lambda m: m["source"].__setitem__("path", str(src)))
    (shard(src) / "sources.idx").write_bytes(b"")
    r = verify(tmp_path / "bfd", quick=True)
    assert r.ok and len(r.notes) == 1
    assert r.notes[0].startswith(f"the source dataset {src} cannot be opened ({src}: train/shard_00000/sources.idx: "
                                 "0 record numbers for 4 episodes: there must be exactly one per episode")
    assert r.notes[0].endswith("for the full report): segments checked for consistency only")
