"""verify: a clean dataset passes every check; each fault is caught by its own check
with its own message, file and location; open_dataset refuses the structural faults."""

from __future__ import annotations

import base64
import json
import shutil

import numpy as np
import pytest

from sftdata.chat.masking import loss_mask
from sftdata.chat.tokenizer import load_tokenizer
from sftdata.errors import DatasetError, UsageError
from sftdata.store import open_dataset, scan_dataset
from sftdata.verify import CHECKS, verify
from tests.helpers.audit import chats, copy_shard, edit_metadata, make_dataset, read_idx, shard, to_flat, write_idx

# The default dataset: train shard_00000 holds episodes 0-3 (19, 28, 30, 15 tokens),
# shard_00001 episodes 4-5 (25, 29); val one shard of 2 episodes. Episode 0 is
# <|SYSTEM|>Be brief.<|END|><|USER|>What is the capital of France?<|END|><|ASSISTANT|>Paris.<|END|><|EOS|>
USER_TOKEN = 6  # "What"
ASSISTANT_TEXT_TOKEN = 15  # "Paris"


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("pristine"), bad_lines=1)


@pytest.fixture
def ds(pristine, tmp_path):
    out = tmp_path / "ds"
    shutil.copytree(pristine, out)
    return out


def by_check(report, check):
    return [p for p in report.problems if p.check == check]


def only(report, check):
    """The report's problems are all of ``check``; return them."""
    assert {p.check for p in report.problems} == {check}, [str(p) for p in report.problems]
    return report.problems


def test_clean_dataset_passes_every_check(ds):
    r = verify(ds)
    assert r.ok and r.problems == []
    assert [(c.name, c.status) for c in r.checks] == [(name, "skipped" if name == "media" else "ok") for name in CHECKS]
    assert r.splits == {"train": {"episodes": 6, "tokens": 146, "shards": 2},
                        "val": {"episodes": 2, "tokens": 33, "shards": 1}}
    files = sorted(p for p in ds.rglob("*") if p.is_file() and p.name != "dataset_metadata.json")
    assert r.bytes_hashed == sum(p.stat().st_size for p in files)
    open_dataset(ds)  # no error
    assert scan_dataset(ds).problems == []


def test_quick_skips_only_the_checksums(ds):
    r = verify(ds, quick=True)
    assert r.ok and r.bytes_hashed == 0
    assert {c.name: c.status for c in r.checks}["checksums"] == "skipped"
    assert [c.name for c in r.checks if c.status == "ok"] == [c for c in CHECKS if c not in ("checksums", "media")]


def test_truncated_tokens_bin(ds):
    p = shard(ds) / "tokens.bin"
    p.write_bytes(p.read_bytes()[:-8])  # two tokens short: 90 of 92
    r = verify(ds)
    sizes = [str(x) for x in by_check(r, "sizes")]
    assert "train/shard_00000/tokens.bin: 360 bytes; dataset_metadata.json recorded 368: the file is truncated" in sizes[1]
    assert sizes[0].startswith("train/shard_00000/mask.bin: 92 mask bytes for the 90 tokens of tokens.bin: tokens "
                               "and mask differ in count")
    (oob,) = by_check(r, "index")
    assert oob.episode == 3 and oob.byte == 48
    assert "episode 3 spans tokens [77, 92) but the shard holds 90 tokens" in oob.message
    assert [p.message for p in by_check(r, "counts")] == [
        "train/shard_00000 holds 90 tokens; dataset_metadata.json recorded 92",
        "split train holds 144 tokens in 2 shard(s); dataset_metadata.json recorded 146"]
    with pytest.raises(DatasetError, match=r"/ds: train/shard_00000/mask.bin: 92 mask bytes for the 90 tokens of "
                       r"tokens.bin: tokens and mask differ in count .*\(4 more problem\(s\)\)\. Run `sftdata verify "):
        open_dataset(ds)  # verify's first problem (of the structural ones)


def test_flipped_byte_is_caught_by_the_checksum_alone(ds):
    p = shard(ds) / "tokens.bin"
    b = bytearray(p.read_bytes())
    b[ASSISTANT_TEXT_TOKEN * 4] ^= 0x01  # "Paris" becomes a neighbouring id: still valid tokens
    p.write_bytes(bytes(b))
    (prob,) = only(verify(ds), "checksums")
    assert prob.file == "train/shard_00000/tokens.bin"
    assert "sha256 is" in prob.message and "the file changed after prepare (a flipped bit" in prob.message
    assert verify(ds, quick=True).ok  # only the checksum sees it
    open_dataset(ds)


def test_shard_from_another_dataset(ds, tmp_path):
    other = make_dataset(tmp_path / "o", records=chats(8, offset=3), val_split=0.25)
    copy_shard(shard(other, "train", 0), shard(ds, "train", 1))
    r = verify(ds)
    replaced = [p for p in r.problems if "the shard was replaced, e.g. by a shard of another dataset" in p.message]
    assert len(replaced) == 1 and replaced[0].file == "train/shard_00001"
    assert not [p for p in r.problems if p.check == "checksums" and p.file.startswith("train/shard_00001/")]
    assert "train/shard_00001 holds 4 episodes; dataset_metadata.json recorded 2" in [p.message for p in r.problems]
    with pytest.raises(DatasetError, match=r"train/shard_00001.*the shard was replaced"):
        open_dataset(ds)


def test_shard_of_same_sizes_but_other_content_is_caught_by_checksums(ds):
    # shard_00000 of train rewritten with the same sizes but other bytes in every file
    d = shard(ds)
    for fn in ("tokens.bin", "mask.bin", "episodes.idx", "sources.idx"):
        b = bytearray((d / fn).read_bytes())
        b[-1] ^= 0x01
        (d / fn).write_bytes(bytes(b))
    r = verify(ds)
    (prob,) = by_check(r, "checksums")
    assert prob.file == "train/shard_00000" and "every file of train/shard_00000" in prob.message


def test_idx_record_out_of_bounds(ds):
    p = shard(ds) / "episodes.idx"
    idx = read_idx(p)
    idx[1, 1] += 1000
    write_idx(p, idx)
    r = verify(ds, quick=True)
    (prob,) = by_check(r, "index")
    assert prob.file == "train/shard_00000/episodes.idx"
    assert (prob.episode, prob.byte, prob.split) == (1, 16, "train")
    assert prob.message == "episode 1 spans tokens [19, 1,047) but the shard holds 92 tokens: the record points past the end"
    with pytest.raises(DatasetError, match=r"episode 1 spans tokens \[19, 1,047\) but the shard holds 92 tokens"):
        open_dataset(ds)


def test_overlapping_episodes(ds):
    p = shard(ds) / "episodes.idx"
    idx = read_idx(p)
    idx[2, 0] -= 3
    idx[2, 1] += 3
    write_idx(p, idx)
    r = verify(ds, quick=True)
    (prob,) = by_check(r, "index")
    assert (prob.episode, prob.byte) == (2, 32)
    assert prob.message.startswith("episode 2 starts at token 44, inside episode 1 (tokens [19, 47)): the episodes overlap")
    # episodes are checked one by one, as indexed: episode 2 now starts with the end of
    # episode 1's assistant span, whose mask (1, 1) the rule does not give without its opener
    (rule,) = by_check(r, "mask_rule")
    assert rule.episode == 2 and rule.message.startswith(
        "the mask of episode 2 trains 2 token(s) the mask rule leaves untrained (first: token 0, in text outside any span)")
    with pytest.raises(DatasetError, match="the episodes overlap"):
        open_dataset(ds)


def test_mask_set_on_a_user_token(ds):
    p = shard(ds) / "mask.bin"
    m = np.fromfile(p, dtype=np.uint8)
    m[USER_TOKEN] = 1
    m.tofile(p)
    r = verify(ds)
    (prob,) = by_check(r, "mask_rule")
    assert prob.file == "train/shard_00000/mask.bin" and (prob.episode, prob.byte) == (0, USER_TOKEN)
    assert prob.message == ("the mask of episode 0 trains 1 token(s) the mask rule leaves untrained "
                            "(first: token 6, in a <|USER|> span)")
    # trained count +1; the lone trained user token is a trained span that cannot stop
    assert [p.check for p in r.problems] == ["counts", "counts", "mask_rule", "stops", "checksums"]
    (stop,) = by_check(r, "stops")
    assert (stop.code, stop.episode, stop.byte) == ("cannot_stop", 0, USER_TOKEN)
    assert stop.message.startswith("the trained reply at tokens 6..6 of episode 0 ends with id ")
    assert stop.message.endswith(", not a trained stop id (<|END|> (id 100282)): the model never learns to stop "
                                 "after it")
    assert r.cannot_stop == {"train": {"count": 1, "episodes": [0]}}
    assert verify(ds, quick=True).problems[-2:] == [prob, stop]
    open_dataset(ds)  # not a structural fault: the loader's cheap checks pass


def test_mask_not_training_an_assistant_span_counts_every_bad_episode(ds):
    p = shard(ds) / "mask.bin"
    m = np.fromfile(p, dtype=np.uint8)
    m[:] = 0
    m.tofile(p)
    (prob,) = by_check(verify(ds, quick=True), "mask_rule")
    assert prob.episode == 0 and prob.message == (
        "the mask of episode 0 leaves 4 token(s) untrained that the rule trains (first: token 14, in a "
        "<|ASSISTANT|> span); 4 episodes of this shard differ")


def test_unclosed_assistant_does_not_blame_the_episodes_after_it(ds, tmp_path):
    """The rule zeroes an array after an unclosed assistant span; verify compares per
    episode, so only episode 0 (whose END is gone and whose mask follows the rule) is
    looked at, and nothing is reported."""
    tok = load_tokenizer()
    d = shard(ds)
    toks = np.fromfile(d / "tokens.bin", dtype="<u4")
    toks[17] = 13  # episode 0's closing <|END|> becomes "." : its assistant span is unclosed
    toks.tofile(d / "tokens.bin")
    m = np.fromfile(d / "mask.bin", dtype=np.uint8)
    m[:19] = loss_mask(toks[:19], tok.ids)
    m.tofile(d / "mask.bin")
    r = verify(ds, quick=True)
    assert by_check(r, "mask_rule") == []
    assert loss_mask(toks, tok.ids)[19:].sum() == 0  # what one call over the whole shard would say
    assert [p.message for p in r.problems] == [
        "train/shard_00000 holds 26 trained tokens; dataset_metadata.json recorded 30",
        "split train holds 48 trained tokens in 2 shard(s); dataset_metadata.json recorded 52"]


def test_masks_untrained_after_an_unclosed_assistant_are_still_compared_per_episode(ds):
    """After an episode with an unclosed assistant span, one rule call over the shard says
    0 for every later token; the stored masks of the episodes after it must still be
    compared with their own rule's: episodes 1 and 2 train nothing here, wrongly."""
    tok = load_tokenizer()
    d = shard(ds)
    toks = np.fromfile(d / "tokens.bin", dtype="<u4")
    toks[17] = 13  # episode 0's closing <|END|> becomes "."
    toks.tofile(d / "tokens.bin")
    m = np.fromfile(d / "mask.bin", dtype=np.uint8)
    m[:19] = loss_mask(toks[:19], tok.ids)
    m[19:19 + 28 + 30] = 0  # episodes 1 and 2 (28 and 30 tokens): their assistant spans untrained
    m.tofile(d / "mask.bin")
    (prob,) = by_check(verify(ds, quick=True), "mask_rule")
    assert prob.episode == 1 and prob.byte == 19 + 6
    assert prob.message == ("the mask of episode 1 leaves 14 token(s) untrained that the rule trains (first: token "
                            "6, in a <|ASSISTANT|> span); 2 episodes of this shard differ")


def test_missing_file(ds):
    (shard(ds) / "mask.bin").unlink()
    r = verify(ds)
    (prob,) = by_check(r, "files")
    assert prob.file == "train/shard_00000/mask.bin" and prob.message == "train/shard_00000/mask.bin is missing"
    assert "restore the file from a good copy" in prob.fix
    with pytest.raises(DatasetError, match=r"train/shard_00000/mask.bin is missing"):
        open_dataset(ds)


def test_missing_shard_folder(ds):
    shutil.rmtree(shard(ds, "train", 1))
    r = verify(ds)
    assert "shard folder train/shard_00001, listed in dataset_metadata.json, is missing" in [p.message for p in r.problems]


def test_metadata_counts_off(ds):
    edit_metadata(ds, lambda m: m["splits"]["train"].__setitem__("episodes", 7))
    (prob,) = only(verify(ds), "counts")
    assert prob.file == "dataset_metadata.json" and prob.where == "splits.train.episodes"
    assert prob.message == "split train holds 6 episodes in 2 shard(s); dataset_metadata.json recorded 7"
    with pytest.raises(DatasetError, match="split train holds 6 episodes in 2 shard"):
        open_dataset(ds)


def test_token_id_past_the_vocabulary(ds):
    p = shard(ds) / "tokens.bin"
    t = np.fromfile(p, dtype="<u4")
    t[19 + 7] = 100300  # token 7 of episode 1
    t.tofile(p)
    r = verify(ds)
    (prob,) = by_check(r, "vocab")
    assert prob.file == "train/shard_00000/tokens.bin" and (prob.episode, prob.byte) == (1, (19 + 7) * 4)
    assert prob.message == "token 7 of episode 1 is id 100,300, past the vocabulary (100,286 ids): no tokenizer can decode it"
    assert [p.check for p in r.problems] == ["vocab", "ranges", "checksums"]  # ranges: the data's ids now reach 100,300


def test_episode_not_ending_with_eos(ds):
    p = shard(ds, "val") / "tokens.bin"
    t = np.fromfile(p, dtype="<u4")
    t[14] = 13  # last token of val episode 0
    t.tofile(p)
    (prob,) = by_check(verify(ds), "eos")
    assert (prob.split, prob.episode, prob.byte) == ("val", 0, 56)
    assert prob.message.startswith("episode 0 ends with id 13, not <|EOS|> (id 100257)")
    with pytest.raises(DatasetError, match="episode 0 ends with id 13"):
        open_dataset(ds)


def test_mask_value_not_binary(ds):
    p = shard(ds, "train", 1) / "mask.bin"
    m = np.fromfile(p, dtype=np.uint8)
    m[30] = 7  # token 5 of episode 5 (second of this shard)
    m.tofile(p)
    (prob,) = by_check(verify(ds), "mask_values")
    assert (prob.episode, prob.byte) == (5, 30)
    assert prob.message == "token 5 of episode 5 has mask value 7, not 0 or 1"


def test_unsorted_gap_and_trailing_tokens_each_have_a_message(ds):
    p = shard(ds) / "episodes.idx"
    idx = read_idx(p)
    write_idx(p, idx[[1, 0, 2, 3]])
    msgs = [x.message for x in by_check(verify(ds, quick=True), "index")]
    assert any("episode 1 starts at token 0, before episode 0 (token 19): episodes.idx is not sorted" in m for m in msgs)
    write_idx(p, idx[[0, 2, 3]])
    msgs = [x.message for x in by_check(verify(ds, quick=True), "index")]
    assert msgs == ["tokens [19, 47) between episodes 0 and 1 belong to no episode: the index is not contiguous"]
    write_idx(p, idx[:3])
    msgs = [x.message for x in by_check(verify(ds, quick=True), "index")]
    assert msgs == ["tokens.bin holds 15 tokens after the last episode ends (token 77) that belong to no episode"]


def test_metadata_and_tokenizer_problems(ds):
    edit_metadata(ds, lambda m: m.__setitem__("format_version", 99))
    r = verify(ds, quick=True)
    assert [p.message for p in by_check(r, "metadata")] == ["format_version 99 is not known (this sftdata reads 1, 2, 3 and 4)"]
    st = json.loads((ds / "tokenizer_state.json").read_text())
    st["ranks_sha256"] = "0" * 64
    (ds / "tokenizer_state.json").write_text(json.dumps(st))
    prob, identity = by_check(verify(ds, quick=True), "tokenizer")
    assert "the dataset recorded 000000000000...; token ids would mean other text" in prob.message
    assert identity.file == "dataset_metadata.json"
    assert "(metadata vs state: ranks_sha256 223921b76ee99bde... vs 0000000000000000...)" in identity.message
    (ds / "tokenizer_state.json").unlink()
    (ds / "dataset_metadata.json").unlink()
    r = verify(ds)
    assert [p.check for p in r.problems] == ["metadata", "tokenizer"]
    assert r.problems[0].message.startswith("dataset_metadata.json is missing")
    assert {c.name: c.status for c in r.checks}["mask_rule"] == "skipped"


def test_problem_text_and_json(ds):
    (shard(ds) / "sources.idx").unlink()
    r = verify(ds)
    d = r.as_dict()
    assert d["ok"] is False and json.loads(json.dumps(d))["problems"][0] == {
        "check": "files", "file": "train/shard_00000/sources.idx", "where": "",
        "message": "train/shard_00000/sources.idx is missing", "fix": r.problems[0].fix,
        "split": None, "episode": None, "byte": None, "code": ""}
    assert str(r.problems[0]).startswith("train/shard_00000/sources.idx: train/shard_00000/sources.idx is missing. To fix: restore")


def test_flat_layout_options_are_refused_for_a_described_dataset(ds):
    with pytest.raises(UsageError, match="--tokenizer is for older flat layouts"):
        verify(ds, tokenizer="cl100k_base")
    with pytest.raises(UsageError, match="--token-dtype is for older flat layouts"):
        verify(ds, token_dtype="uint16")


def test_lost_metadata_still_reads_tokens_with_the_tokenizer_dtype(tmp_path):
    ranks = tmp_path / "bytes.tiktoken"  # 256 byte tokens: a vocabulary that fits uint16
    ranks.write_text("".join(f"{base64.b64encode(bytes([i])).decode()} {i}\n" for i in range(256)))
    small = make_dataset(tmp_path, records=chats(2), val_split=0.0, tokenizer=str(ranks))
    assert json.loads((small / "dataset_metadata.json").read_text())["token_dtype"] == "uint16"
    assert verify(small).ok
    (small / "dataset_metadata.json").unlink()
    r = verify(small)
    assert [p.check for p in r.problems] == ["metadata"]  # no size or index problem: read as uint16
    assert r.splits["train"]["tokens"] == sum(p.stat().st_size for p in (small / "train").glob("*/tokens.bin")) // 2


def test_no_dataset_is_an_error_not_a_report(tmp_path):
    with pytest.raises(DatasetError, match="does not exist"):
        verify(tmp_path / "nope")
    with pytest.raises(DatasetError, match="holds no dataset"):
        verify(tmp_path)


# ---------------------------------------------------------------- older flat layout
def test_flat_layout_structural_checks_with_notes(ds, tmp_path):
    flat = to_flat(ds, tmp_path / "flat")
    r = verify(flat)
    assert r.ok and r.layout == "flat"
    status = {c.name: c.status for c in r.checks}
    assert [k for k, v in status.items() if v == "skipped"] == ["metadata_checksum", "eos", "counts", "vocab", "ranges",
                                                                 "mask_rule", "media", "stops", "serving",
                                                                 "checksums"]
    assert any("counts, file sizes and checksums cannot be checked" in n for n in r.notes)
    assert any("token ids, EOS endings and the loss mask cannot be checked" in n for n in r.notes)
    idx = read_idx(flat / "train" / "episodes.idx")
    idx[4, 0] -= 1
    idx[4, 1] += 1
    write_idx(flat / "train" / "episodes.idx", idx)
    (prob,) = verify(flat).problems
    assert prob.file == "train/episodes.idx" and "the episodes overlap" in prob.message and prob.code == "overlap"
    with pytest.raises(DatasetError, match="episode 4 starts at token 91, inside episode 3"):
        open_dataset(flat)


def test_flat_layout_gaps_are_reported_but_do_not_stop_the_loader(ds, tmp_path):
    flat = to_flat(ds, tmp_path / "flat")
    idx = read_idx(flat / "train" / "episodes.idx")
    write_idx(flat / "train" / "episodes.idx", idx[[0, 2, 1, 4]])  # unsorted, a gap, trailing tokens
    codes = [p.code for p in verify(flat).problems]
    assert codes == ["unsorted", "gap", "trailing_tokens"]
    open_dataset(flat)  # the loader reads episodes by (start, length): none of these breaks it
    write_idx(flat / "train" / "episodes.idx", idx[[0, 2, 1, 4, 5, 5]])
    with pytest.raises(DatasetError, match="the episodes overlap"):
        open_dataset(flat)


def test_flat_layout_with_a_tokenizer_and_a_float32_mask(ds, tmp_path):
    flat = to_flat(ds, tmp_path / "flat", mask_dtype="<f4")
    r = verify(flat, tokenizer="cl100k_base")
    assert r.ok and {c.name: c.status for c in r.checks}["mask_rule"] == "ok"
    m = np.fromfile(flat / "train" / "mask.bin", dtype="<f4")
    m[USER_TOKEN] = 1.0
    m[3] = 0.5  # any non-zero value counts as trained for the mask rule
    m.tofile(flat / "train" / "mask.bin")
    r = verify(flat, tokenizer="cl100k_base")
    assert [p.check for p in r.problems] == ["mask_values", "mask_rule", "stops"]
    assert r.problems[0].message == "token 3 of episode 0 has mask value 0.5, not 0 or 1"
    assert r.problems[2].code == "cannot_stop" and r.problems[2].message.startswith(
        "the trained reply at tokens 3..3 of episode 0 ends with id ")
    assert r.problems[1].byte == 3 * 4 and r.problems[1].message == (
        "the mask of episode 0 trains 2 token(s) the mask rule leaves untrained (first: token 3, in a <|SYSTEM|> span)")


def test_flat_layout_of_uint16_tokens(ds, tmp_path):
    flat = to_flat(ds, tmp_path / "flat", with_mask=False)
    t = np.fromfile(flat / "train" / "tokens.bin", dtype="<u4")
    (t % 60000).astype("<u2").tofile(flat / "train" / "tokens.bin")
    assert not verify(flat).ok  # read as uint32: half as many tokens, episodes past the end
    r = verify(flat, token_dtype="uint16")
    assert r.ok and {c.name: c.status for c in r.checks}["mask_values"] == "skipped"


def test_a_partial_index_record_is_a_sizes_problem_not_a_traceback(ds):
    p = shard(ds) / "episodes.idx"
    p.write_bytes(p.read_bytes()[:-5])  # 59 bytes: 3 whole records and 11 bytes of the fourth
    r = verify(ds, quick=True)
    assert [(x.check, x.file, x.byte) for x in r.problems[:3]] == [
        ("sizes", "train/shard_00000/episodes.idx", 48), ("sizes", "train/shard_00000/sources.idx", None),
        ("sizes", "train/shard_00000/episodes.idx", 59)]
    assert r.problems[0].message == "59 bytes is not a multiple of 16 (uint64 start, length pairs): the index is truncated"
    assert r.splits["train"]["episodes"] == 5
    with pytest.raises(DatasetError, match=r"episodes.idx: 59 bytes is not a multiple of 16"):
        open_dataset(ds)


@pytest.mark.parametrize("asked", [{"sources": True}, {"retokenize_episodes": 2}])
def test_the_checks_that_prove_a_dataset_read_no_cache_entry(ds, monkeypatch, asked):
    """verify --sources and --retokenize rebuild the tokenizer from its files: not one entry
    of the user's cache is looked up (plain verify may use it: its checks prove no token)."""
    from sftdata.util import cache

    looked = []
    real = cache.entry_path
    monkeypatch.setattr(cache, "entry_path", lambda kind, key: looked.append(real(kind, key)) or looked[-1])
    verify(ds)
    assert any(p is not None for p in looked)  # plain verify: the ranks from the cache
    looked.clear()
    verify(ds, **asked)
    assert looked and all(p is None for p in looked)
