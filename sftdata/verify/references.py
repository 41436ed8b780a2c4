"""The references check of ``verify`` for packed datasets: no episode token in two
segments, one record number per episode, and, when the source dataset is still at its
recorded path unchanged, every segment's tokens equal its source episode's tokens, its
record number the source's, and its injected context (stream) what ``stream_prefix``
injects for that episode there.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

from ..chat.loss_rule import LossRule, rule_from_state
from ..errors import DatasetError, SftDataError
from ..packing.layout import Segments
from ..packing.strategies import stream_prefix
from ..storage import METADATA_FILE
from ..storage.location import dataset_path, remote_url
from ..store.format import REPACK, SEGMENTS_FILE, Problem, decode_segments, more_like_it
from ..store.reader import Dataset, open_dataset
from ..store.shard import Shard, Split
from ..store.structure import marker_name, readable_rows
from ..util.hashing import sha256_file
from ..util.ranges import gather_ranges, range_index, whole_runs
from .content import CHUNK_TOKENS

# compares the tokens of each of ``shards`` (one split's) with source split ``sp`` elsewhere, yielding
# ``compare_shard_tokens``'s problems shard by shard: (shards, sp, row_len) -> [Problem], ...
Compare = Callable[[list[Shard], Split, int], Iterable[list[Problem]]]


def _source(meta: dict) -> tuple[Dataset | None, LossRule | None, list[str]]:
    """The source dataset when it is at its recorded path unchanged, its mask rule, and
    notes on what cannot be compared."""
    src_info = meta.get("source") or {}
    src_path = Path(str(src_info.get("path", "")))
    if not src_info.get("path"):
        return None, None, []
    if remote_url(src_path):  # packed from an object-store URL: its copy in the cache
        try:
            src_path = dataset_path(src_path)
        except DatasetError as e:
            return None, None, [f"the source dataset {src_info['path']} cannot be read ({e}): segments checked "
                                "for consistency only"]
    if not (src_path / METADATA_FILE).is_file():
        return None, None, [f"the source dataset {src_path} is not there: segments checked for consistency only, "
                            "not against the source episodes"]
    if sha256_file(src_path / METADATA_FILE) != src_info.get("metadata_sha256"):
        return None, None, [f"the source dataset {src_path} changed since packing (its metadata sha256 differs): "
                            "segments not compared with its episodes"]
    try:
        src = open_dataset(src_path)
    except DatasetError as e:
        return None, None, [f"the source dataset {src_path} cannot be opened ({e}): segments checked for "
                            "consistency only"]
    try:
        return src, rule_from_state(src.tokenizer_state), []
    except SftDataError:
        return src, None, [f"the source dataset {src_path} records no mask rule: injected context not checked"]


def check_references(shards: list[Shard], meta: dict, row_len: int, compare: Compare | None = None
                     ) -> tuple[list[Problem], list[str]]:
    """Segments' episode references of the packed ``shards`` whose segments are sound:
    consistent among themselves and, when the source dataset is at its recorded path and
    unchanged, equal to the source episodes. Returns the problems and notes. ``compare``
    compares each shard's tokens with the source elsewhere (``compare_shard_tokens`` per
    shard, in shard order: an engine's tasks); the problems are the same."""
    out: list[Problem] = []
    src_ds, markers, notes = _source(meta)
    for split in dict.fromkeys(sh.split for sh in shards):
        mine = [sh for sh in shards if sh.split == split]
        parts = [decode_segments(sh.segments) for sh in mine]
        seg = Segments.concat(parts)  # rows local to each shard
        owner = np.concatenate([np.full(len(p), k) for k, p in enumerate(parts)])
        local = np.concatenate([np.arange(len(p)) for p in parts])
        ep, st, take, src = seg.episode, seg.episode_start, seg.take, seg.source

        add = _reporter(out, mine, seg, owner, local)
        order = np.lexsort((st, ep))
        e_o, s_o, t_o, r_o = ep[order], st[order], take[order], src[order]
        same = e_o[1:] == e_o[:-1]
        bad = np.flatnonzero(same & (s_o[1:] < s_o[:-1] + t_o[:-1]))
        if bad.size:
            i = int(order[bad[0] + 1])
            add(i, f"tokens {s_o[bad[0] + 1]}.. of episode {ep[i]} are also in another segment: they would be "
                   "trained twice", "episode_twice", bad.size)
        bad = np.flatnonzero(same & (r_o[1:] != r_o[:-1]))
        if bad.size:
            i = int(order[bad[0] + 1])
            add(i, f"segments of episode {ep[i]} name records {r_o[bad[0]]} and {r_o[bad[0] + 1]}", "record_mismatch",
                bad.size)
        if src_ds is None or split not in src_ds.splits:
            continue
        sp = src_ds.split(split)
        bad = np.flatnonzero((ep >= sp.num_episodes) | (ep < 0))
        if bad.size:
            i = int(bad[0])
            add(i, f"segment names episode {ep[i]}, but split {split} of the source has {sp.num_episodes} episodes",
                "no_such_episode", bad.size)
            continue
        bad = np.flatnonzero(st + take > sp.lengths[ep])
        if bad.size:
            i = int(bad[0])
            add(i, f"segment takes tokens [{st[i]}, {st[i] + take[i]}) of episode {ep[i]}, which has "
                   f"{sp.lengths[ep[i]]} tokens", "past_episode_end", bad.size)
            continue
        srcs = sp.sources
        if srcs is not None:
            bad = np.flatnonzero((src != -1) & (src != srcs[ep]))
            if bad.size:
                i = int(bad[0])
                add(i, f"segment names record {src[i]} for episode {ep[i]}; the source episode came from record "
                       f"{srcs[ep[i]]}", "record_mismatch", bad.size)
        # tokens are compared where they can be read (a rows problem says why not elsewhere)
        sel = seg.row < np.array([readable_rows(sh, row_len) for sh in mine])[owner]
        seg, owner, local = seg[sel], owner[sel], local[sel]
        add = _reporter(out, mine, seg, owner, local)
        if compare is None:
            _compare_tokens(mine, seg, owner, local, sp, row_len, add)
        else:  # the first shard whose tokens differ holds the split's first differing segment
            out += next((found for found in compare(mine, sp, row_len) if found), [])
        if markers is not None:
            _compare_prefixes(mine, seg, owner, local, sp, markers, row_len, add)
    return out, notes


def compare_shard_tokens(sh: Shard, sp: Split, row_len: int) -> list[Problem]:
    """The tokens check of one packed shard whose segments are sound, against split ``sp``
    of the source: a problem at its first segment whose tokens differ from its source
    episode's, or none."""
    seg = decode_segments(sh.segments)
    local = np.flatnonzero(seg.row < readable_rows(sh, row_len))
    seg, owner, out = seg[local], np.zeros(local.size, np.int64), []
    _compare_tokens([sh], seg, owner, local, sp, row_len, _reporter(out, [sh], seg, owner, local))
    return out


def _reporter(out: list[Problem], mine: list[Shard], seg: Segments, owner, local):
    """``add(i, message, code, n)``: a references problem at segment ``i`` of ``seg``
    (of shard ``mine[owner[i]]``, its record ``local[i]`` in segments.idx)."""
    def add(i, message, code, n=1):
        shard = mine[int(owner[i])]
        out.append(Problem("references", shard.file(SEGMENTS_FILE), message=message + more_like_it(n, "segments"),
                           fix="the rows do not match their source: " + REPACK, code=code,
                           **shard.at_row(int(seg.row[i]), int(local[i]))))
    return add


def _compare_prefixes(mine, seg: Segments, owner, local, sp, markers: LossRule, row_len: int, add) -> None:
    """Each injected prefix equals what stream packing injects for its episode at its
    start (``packing.stream_prefix``): the conversation's own system span and
    ``<|USER|>``. One call per rewritten row; bfd rows have none."""
    starts = seg.flat_start(row_len)
    for i in np.flatnonzero(seg.prefix > 0).tolist():
        shard = mine[int(owner[i])]
        at, n = int(starts[i]), int(seg.prefix[i])
        got = np.asarray(shard.tokens[at:at + n]).astype(np.int64)
        ep, start = int(seg.episode[i]), int(seg.episode_start[i])
        want = stream_prefix(np.asarray(sp.episode(ep)[0]), start, markers)[0] if start > 0 else None
        if want is None or not np.array_equal(got, want):
            should = "none (the row is not rewritten there)" if want is None else \
                " ".join(marker_name(t, markers.markers) or str(t) for t in want[:8].tolist()) + (" ..." if want.size > 8 else "")
            add(i, f"segment {int(local[i])}'s injected context ({n} token(s)) is not what stream "
                   f"packing injects for episode {ep} at its token {start} ({should})", "prefix_differs")
            return


def _compare_tokens(mine, seg: Segments, owner, local, sp, row_len: int, add) -> None:
    """Each segment's episode tokens equal the source episode's, a chunk at a time."""
    take = seg.take
    at = seg.flat_start(row_len) + seg.prefix  # where its episode tokens start in its shard
    for k, j in whole_runs(np.cumsum(take), CHUNK_TOKENS):
        got, want = [], []
        for part_i in np.unique(owner[k:j]):
            sel = np.flatnonzero(owner[k:j] == part_i) + k
            got.append(gather_ranges(mine[int(part_i)].tokens, at[sel], take[sel]))
        eps = seg.episode[k:j]
        starts = sp.starts[eps] + seg.episode_start[k:j]
        shard_of = sp.shard_of(eps)
        for si in np.unique(shard_of):
            sel = np.flatnonzero(shard_of == si)
            want.append((sel, gather_ranges(sp.shards[int(si)].tokens, starts[sel], take[k:j][sel])))
        got_all = np.concatenate(got).astype(np.int64)
        want_all = np.empty_like(got_all)
        off = np.concatenate([[0], np.cumsum(take[k:j])])
        for sel, vals in want:
            want_all[range_index(off[sel], take[k:j][sel])] = vals
        d = np.flatnonzero(got_all != want_all)
        if d.size:
            i = k + int(np.searchsorted(off, d[0], side="right")) - 1
            add(i, f"segment {int(local[i])}'s tokens differ from episode {seg.episode[i]} of the source (first at "
                   f"its token {int(d[0] - off[i - k])}): the rows were not packed from this source, or were changed",
                "tokens_differ")
            return
