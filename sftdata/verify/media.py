"""The ``media`` check of a dataset with images or videos, and ``--sources`` for its media.

Each shard's media table (``store.media_table``: every line well formed, spans inside their
episode or packed row, in order, apart) and then what only the pinned processor settings
and the tokens can say:

- every span's count re-derived: an image's tokens, processed size and grid with
  ``image_count`` from its recorded size (a video's tokens from its recorded grid: the
  container's frame count and rate that decide the grid are not recorded);
- the media tokens of an episode (each kind's token the model puts vision features at:
  ``media.expand.item_token``, ids from ``tokenizer_state.json``) are exactly its spans', in
  order: the k-th span takes the next ``tokens`` of them, its first at ``offset``, each of
  its kind (a tiled image's tokens have row and column marks between them, a Qwen3-VL
  video's timestamps: a span's tokens are counted, not taken as a range); no media token
  stands beyond what the spans account for;
- no media token is trained (mask 0).

One pass over each shard's tokens, vectorised: never a per-token loop.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import ConfigError
from ..media import MEDIA_MISSING, MediaError, image_count, read_media
from ..media.expand import item_token, placeholders
from ..media.item import IMAGE, MediaSpan
from ..store.format import MEDIA_FILE, RECREATE, TOKENIZER_FILE, TOKENS_FILE, Problem, more_like_it
from ..store.media_table import MEDIA_CHECK, MediaTable, read_media_table
from ..store.reader import Dataset
from ..store.shard import Shard

MEDIA_CHECKS = {MEDIA_CHECK: "each media span's count re-derived from its size and the pinned processor settings; "
                             "its tokens the family's media token, counted in order, never trained; spans "
                             "inside their episode, apart"}
NO_MEDIA = "no media (a text dataset)"
UNPLACED = ("item_out_of_range", "past_item_end", "unsorted")  # spans whose tokens cannot be walked in order
STATE_KEYS = ("special_tokens", "added_tokens", "base_special_tokens")


@dataclass
class MediaFindings:
    problems: list[Problem] = field(default_factory=list)
    skipped: str | None = None  # why the check could not run
    notes: list[str] = field(default_factory=list)
    spans: int = 0  # spans checked


def placeholder_ids(state: dict | None, settings: dict) -> tuple[dict[str, int], list[str]]:
    """The id of each kind's placeholder token (``{"image": 151655, "video": 151656}``) as the
    tokenizer state records it, and the placeholders it does not record."""
    known: dict[str, int] = {}
    for key in STATE_KEYS:
        d = (state or {}).get(key)
        if isinstance(d, dict):
            known.update({k: v for k, v in d.items() if isinstance(v, int) and k not in known})
    marks = _marks(settings)
    return {kind: known[m] for kind, m in marks.items() if m in known}, [m for m in marks.values() if m not in known]


def _marks(settings: dict) -> dict[str, str]:
    """Each kind's media token (the one its expansion repeats, ``count.tokens`` times)."""
    return {kind: item_token(settings, kind) for kind in placeholders(settings)}


def check_media(ds: Dataset) -> MediaFindings:
    """The ``media`` check over every shard of ``ds`` (skipped, with why, for a text dataset)."""
    out = MediaFindings()
    if not ds.has_media:
        out.skipped = NO_MEDIA
        return out
    settings = ds.processor_settings
    if settings is None:
        out.problems.append(Problem(MEDIA_CHECK, TOKENIZER_FILE, "processor", f"{TOKENIZER_FILE} records no "
                                    "processor settings, but the metadata records media: no count can be "
                                    "re-derived, nor a placeholder id found", RECREATE))
        return out
    try:
        ids, unknown = placeholder_ids(ds.tokenizer_state, settings)
    except ConfigError as e:
        ids, unknown = None, []
        out.notes.append(f"media: {e}; the media tokens were not checked, the counts were")
    if unknown:
        out.problems.append(Problem(MEDIA_CHECK, TOKENIZER_FILE, "", f"{TOKENIZER_FILE} has no id for the media "
                                    f"placeholder(s) {', '.join(unknown)} of the processor's family "
                                    f"{settings.get('family')!r}: the tokenizer is not the model's", RECREATE))
        ids = None
    counts: dict = {}
    for shard in ds.shards:
        table = read_media_table(shard)  # not kept: one shard's table in memory at a time
        out.problems += [p for p in table.problems if p.check == MEDIA_CHECK]  # a missing table: the reader's files
        out.spans += len(table.entries)
        out.problems += _count_problems(shard, table, settings, counts)
        misplaced = any(p.check != MEDIA_CHECK or p.code in UNPLACED for p in table.problems)
        if ids is not None and shard.tokens is not None and not misplaced:
            out.problems += _token_problems(shard, table, ids, _marks(settings))
    return out


# ------------------------------------------------------------------------- counts
def rederive_count(settings: dict, span: MediaSpan, cache: dict) -> str | None:
    """What differs between a span's recorded count and the one its size gives, or None."""
    item, got = span.item, span.item.count
    if item.kind == IMAGE:
        key = (item.kind, item.size)
        if key not in cache:
            try:
                cache[key] = image_count(settings, *item.size)
            except (MediaError, ConfigError) as e:
                cache[key] = str(e)
        want = cache[key]
        if isinstance(want, str):
            return f"its size {item.size[0]}x{item.size[1]} cannot be counted: {want}"
        fields = (("tokens", got.tokens, want.tokens), ("processed", got.processed, want.processed),
                  ("grid", got.grid, want.grid))
    else:
        merge = int((settings.get("video") or {}).get("merge_size") or settings.get("merge_size") or 1)
        grid = got.grid
        if len(grid) != 3:
            return f"its grid {list(grid)} is not (t, h, w)"
        fields = (("tokens", got.tokens, grid[0] * grid[1] * grid[2] // merge ** 2),)
    diffs = [f"{name} {_show(a)} recorded, {_show(b)} re-derived" for name, a, b in fields if a != b]
    return "; ".join(diffs) or None


def _show(v) -> str:
    return str(list(v)) if isinstance(v, tuple) else f"{v:,}"


def _count_problems(shard: Shard, table: MediaTable, settings: dict, cache: dict) -> list[Problem]:
    bad = []
    for k, (item, span) in enumerate(table.entries):
        why = rederive_count(settings, span, cache)
        if why:
            bad.append((k, item, span, why))
    if not bad:
        return []
    k, item, span, why = bad[0]
    what = "row" if shard.packed else "episode"
    gid = shard.first_gid + item
    where = f"{what} {gid} of {shard.split}, line {int(table.lines[k]):,} of {MEDIA_FILE}"
    return [Problem(MEDIA_CHECK, shard.file(MEDIA_FILE), where, f"the {span.item.kind} {span.item.uri} at offset "
                    f"{span.offset:,} of {what} {gid}: {why} (family {settings.get('family')!r}, the settings "
                    f"pinned in {TOKENIZER_FILE})" + more_like_it(len(bad), "spans"),
                    "prepare the dataset again with the same processor settings", shard.split, episode=gid,
                    code="count")]


# ------------------------------------------------------------------------- tokens
def _token_problems(shard: Shard, table: MediaTable, ids: dict[str, int], marks: dict[str, str]) -> list[Problem]:
    """The media tokens of each item (episode or packed row), in order, are exactly its spans'
    in order: the k-th span takes the next ``tokens`` of them, its first at ``offset``, each its
    kind's token (a tiled image's or a timestamped video's tokens have text between them, so a
    span's tokens are counted, not a range); none stands beyond what the spans account for, and
    none is trained."""
    toks, mask = shard.read_range(0, shard.num_tokens)
    index = np.asarray(shard.index).astype(np.int64)
    item_starts = index[:, 0]
    nitems = index.shape[0]
    what = "row" if shard.packed else "episode"
    out: list[Problem] = []

    def add(pos: int, message: str, count: int, code: str, noun: str, token: bool = True) -> None:
        i = int(np.searchsorted(item_starts, pos, side="right")) - 1
        gid = shard.first_gid + i
        token_of = f", token {pos - int(item_starts[i]):,} of it" if token else ""
        out.append(Problem(MEDIA_CHECK, shard.file(TOKENS_FILE), f"{what} {gid} of {shard.split}{token_of}",
                           message.format(item=f"{what} {gid}", off=f"{pos - int(item_starts[i]):,}")
                           + more_like_it(count, noun), "restore the shard, or " + shard.recreate, shard.split,
                           episode=gid, byte=pos * shard.token_dtype.itemsize, code=code))

    name = {v: marks[k] for k, v in ids.items()}
    pos = np.flatnonzero(np.isin(toks, np.array(sorted(set(ids.values())), dtype=toks.dtype)))
    if mask is not None:
        trained = pos[mask[pos] != 0]
        if trained.size:
            p = int(trained[0])
            add(p, f"{{item}} trains the media token {name[int(toks[p])]} at token {{off}}: a media token is never "
                   "trained (mask 0)", trained.size, "trained", "tokens")
    of_item = np.searchsorted(item_starts, pos, side="right") - 1
    held = np.bincount(of_item, minlength=nitems)[:nitems]
    tokens = table.tokens.astype(np.int64)
    claimed = np.bincount(table.items, weights=tokens, minlength=nitems)[:nitems].astype(np.int64)
    differ = np.flatnonzero(held != claimed)
    if differ.size:
        i = int(differ[0])
        extra = held[i] > claimed[i]
        add(int(item_starts[i]), f"{{item}} holds {int(held[i]):,} media token(s) but the spans of its {MEDIA_FILE} "
                                 f"account for {int(claimed[i]):,}: "
                                 + ("a media token without its media" if extra else "a span without its tokens"),
            differ.size, "stray_placeholder" if extra else "missing_placeholder", what + "s", token=False)
    good = held == claimed
    sel = good[table.items] if table.items.size else np.zeros(0, bool)
    if not sel.any():
        return out
    # each good span's first token: its item's first media token, plus the tokens of its item's spans before it
    first = np.searchsorted(of_item, np.arange(nitems))  # index in pos of each item's first media token
    before = np.cumsum(tokens) - tokens
    item_base = before[np.searchsorted(table.items, table.items)]  # spans before the item's first span
    at = first[table.items] + before - item_base
    want = item_starts[table.items] + table.offsets
    kinds = np.array(table.kinds)
    placed = sel & (pos[np.minimum(at, max(pos.size - 1, 0))] == want) if pos.size else np.zeros_like(sel)
    bad = np.flatnonzero(sel & ~placed)
    if bad.size:
        j = int(bad[0])
        add(int(want[j]), f"the {kinds[j]} span at token {{off}} of {{item}} does not begin with its item's next "
                          f"media token: the media tokens before it are not those of the spans before it, or it "
                          f"is not a media token", bad.size, "not_placeholder", "spans")
    kept = np.flatnonzero(placed)
    if kept.size:
        expected = np.repeat(np.array([ids.get(k, -1) for k in kinds[kept]], np.int64), tokens[kept])
        starts = np.repeat(at[kept] - np.cumsum(tokens[kept]) + tokens[kept], tokens[kept])
        got = pos[starts + np.arange(expected.size)]
        wrong = np.flatnonzero(toks[got].astype(np.int64) != expected)
        if wrong.size:
            p = int(got[wrong[0]])
            kind = next(k for k, v in ids.items() if v == expected[wrong[0]])
            add(p, f"token {{off}} of {{item}} is {name[int(toks[p])]} in the {kind} span there, not {marks[kind]} "
                   f"(id {ids[kind]}): the tokens do not hold the {kind}'s", wrong.size, "not_placeholder", "tokens")
    return out


# ------------------------------------------------------------------------- --sources
def media_source_problems(ds: Dataset) -> tuple[list[Problem], list[str]]:
    """``--sources`` for the media: each item's bytes read again from its uri and hashed; a
    ``sources`` problem for each that is missing, unreadable or changed (sha256), and notes
    (inline ``data:`` items are not kept, so they cannot be read again)."""
    if not ds.has_media:
        return [], []
    seen: dict[str, tuple[str, str, int]] = {}  # uri -> (sha256, shard rel, line)
    inline = 0
    for shard in ds.shards:
        table = read_media_table(shard)  # not kept: one shard's table in memory at a time
        for k, (_, span) in enumerate(table.entries):
            uri = span.item.uri
            if uri.startswith("data:"):
                inline += 1
            elif uri not in seen:
                seen[uri] = (span.item.sha256, shard.file(MEDIA_FILE), int(table.lines[k]))
    out = []
    for uri, (sha, file, line) in seen.items():
        where = f"line {line:,} of {file}"
        try:
            found = read_media(uri).sha256
        except MediaError as e:
            state = "is missing" if e.reason == MEDIA_MISSING else "cannot be read"
            out.append(Problem("sources", uri, where, f"media {uri} {state} ({e.reason}): the dataset cannot be "
                               "reproduced from its inputs",
                               "restore the file at that path, or re-create the dataset from the media as they are",
                               code=e.reason))
            continue
        if found != sha:
            out.append(Problem("sources", uri, where, f"media {uri} has sha256 {found[:16]}..., its media table "
                               f"recorded {sha[:16]}...: it changed since prepare read it",
                               "restore the media as it was, or re-create the dataset from it as it is now",
                               code="changed"))
    notes = [f"--sources: {inline:,} inline data: media item(s) are not kept in the dataset; not read again"] \
        if inline else []
    return out, notes
