"""The ``stops`` check of ``verify``: the model can learn to stop.

* every trained span (a run of mask 1, per episode; per row in a packed dataset) ends
  with a stop id of the dataset's rule (``stops.rule_stop_ids``: ``<|END|>``, a template's
  end-of-turn ids), itself trained, and holds more than that: a reply whose only trained
  token is its end-of-turn (``<|ASSISTANT|> <|END|>`` with the markers) is empty, and the
  model would learn to end a turn without a word (``empty_reply``);
* the rule trains its end-of-turn token at all (a template's ``{% generation %}`` blocks
  may leave it out);
* the pad id is never trained, and is not a stop id unless ``serving.json`` records that
  prepare recorded it (``pad_is_stop``; then a note says so).

The content checks call ``StopFindings.add`` on each chunk they already read, so the
data is read once; every episode that cannot stop is listed (``cannot_stop``).
"""

from __future__ import annotations

import copy

import numpy as np

from ..chat.loss_rule import LossRule
from ..chat.stops import rule_opener, rule_stop_ids, rule_trains_stop, scan_stops
from ..store.format import MASK_FILE, RECREATE, SERVING_FILE, TOKENIZER_FILE, Problem, more_like_it
from ..store.shard import Shard

LISTED = 100  # episode (row) ids listed per split in ``cannot_stop``


class StopFindings:
    """What the stops check found, one shard's chunks at a time."""

    def __init__(self, rule: LossRule, pad_id: int | None, strings: dict[int, str], pad_accepted: bool = False,
                 items: str = "episodes"):
        self.rule = rule
        self.stops = rule_stop_ids(rule)
        self.opener = rule_opener(rule)
        self.strings = strings
        self.pad_id = pad_id
        self.pad_accepted = pad_accepted
        self.items = items
        self.check_pad = pad_id is not None and not (pad_accepted and pad_id in self.stops)
        self.cannot_stop: dict[str, dict] = {}  # split -> {"count": n, "episodes": [first LISTED ids]}
        self._first: dict[str, tuple] = {}
        self._counts = {"unstoppable": 0, "pad": 0, "empty": 0}

    def name(self, i: int) -> str:
        s = self.strings.get(int(i))
        return f"{s} (id {int(i)})" if s is not None else f"id {int(i)}"

    def add(self, shard: Shard, ids: np.ndarray, mask: np.ndarray, offsets: np.ndarray, local: np.ndarray,
            starts: np.ndarray) -> None:
        """A chunk of whole pieces of ``shard``: ``local[k]`` is piece ``k``'s index in the
        shard, ``starts[k]`` its first token's offset in ``tokens.bin``."""
        scan = scan_stops(ids, mask, offsets, self.stops, self.pad_id if self.check_pad else None, self.opener)
        k, p = scan.unstoppable
        if k.size:
            eps = np.unique(k)
            rec = self.cannot_stop.setdefault(shard.split, {"count": 0, self.items: []})
            rec["count"] += int(eps.size)
            room = LISTED - len(rec[self.items])
            rec[self.items] += [shard.first_gid + int(local[e]) for e in eps[:max(room, 0)]]
            self._counts["unstoppable"] += int(eps.size)
            if "unstoppable" not in self._first:
                e, q = int(k[0]), int(p[0])
                a = int(offsets[e])
                zeros = np.flatnonzero(np.asarray(mask[a:a + q + 1]) == 0)
                span_start = int(zeros[-1]) + 1 if zeros.size else 0
                self._first["unstoppable"] = (int(local[e]), q, span_start, int(ids[a + q]), int(starts[e]))
        k, p = scan.pad_trained
        if k.size:
            self._counts["pad"] += int(np.unique(k).size)
            self._first.setdefault("pad", (int(local[int(k[0])]), int(p[0]), int(starts[int(k[0])])))
        k, p = scan.empty
        if k.size:
            self._counts["empty"] += int(np.unique(k).size)
            self._first.setdefault("empty", (int(local[int(k[0])]), int(p[0]), int(ids[int(offsets[int(k[0])]) +
                                                                                         int(p[0])]),
                                             int(starts[int(k[0])])))

    def absorb(self, cannot_stop: dict[str, dict]) -> None:
        """Add the ``cannot_stop`` of shards checked elsewhere (an engine's task), in shard
        order: the same record as adding their chunks here."""
        for split, rec in cannot_stop.items():
            mine = self.cannot_stop.setdefault(split, {"count": 0, self.items: []})
            mine["count"] += rec["count"]
            room = LISTED - len(mine[self.items])
            mine[self.items] += rec[self.items][:max(room, 0)]

    def fresh(self) -> StopFindings:
        """A copy with nothing found yet (the same rule, ids and options)."""
        out = copy.copy(self)
        out.cannot_stop, out._first, out._counts = {}, {}, {"unstoppable": 0, "pad": 0, "empty": 0}
        return out

    def part_state(self) -> tuple[dict, dict]:
        """What was found in the chunks added since the last ``shard_problems`` (a range of
        a shard checked elsewhere): each finding's first, and the counts."""
        return dict(self._first), dict(self._counts)

    def absorb_part(self, state: tuple[dict, dict], cannot_stop: dict[str, dict]) -> None:
        """Add a range's ``part_state`` and ``cannot_stop``, ranges in shard order: the same as
        adding their chunks here (the first finding is the first range's, counts add up)."""
        first, counts = state
        for k, v in first.items():
            self._first.setdefault(k, v)
        for k, n in counts.items():
            self._counts[k] += n
        self.absorb(cannot_stop)

    def shard_problems(self, shard: Shard) -> list[Problem]:
        """The problems of the shard whose chunks were added since the last call."""
        out = []
        what = "row" if self.items == "rows" else "episode"
        msz = 1 if shard.mask is None else shard.mask.dtype.itemsize
        if "unstoppable" in self._first:
            i, q, a, tok, start = self._first["unstoppable"]
            stops = ", ".join(self.name(s) for s in self.stops)
            out.append(Problem(
                "stops", shard.file(MASK_FILE), message=f"the trained reply at tokens {a}..{q} of {what} "
                f"{shard.first_gid + i} ends with {self.name(tok)}, not a trained stop id ({stops}): the model never "
                f"learns to stop after it{more_like_it(self._counts['unstoppable'], self.items)}",
                fix="the mask was edited or made by another tool; " + RECREATE, code="cannot_stop",
                **self._at(shard, i, (start + q) * msz)))
        if "pad" in self._first:
            i, q, start = self._first["pad"]
            out.append(Problem(
                "stops", shard.file(MASK_FILE), message=f"token {q} of {what} {shard.first_gid + i} is the pad id "
                f"({self.name(self.pad_id)}) and is trained: a trainer that masks labels equal to the pad id would "
                f"disagree with this mask{more_like_it(self._counts['pad'], self.items)}",
                fix="the mask was edited or made by another tool; " + RECREATE, code="pad_trained",
                **self._at(shard, i, (start + q) * msz)))
        if "empty" in self._first:
            i, q, tok, start = self._first["empty"]
            out.append(Problem(
                "stops", shard.file(MASK_FILE), message=f"the trained reply ending at token {q} of {what} "
                f"{shard.first_gid + i} is empty: its only trained token is the end-of-turn {self.name(tok)}, so the "
                f"model would learn to end a turn without a word{more_like_it(self._counts['empty'], self.items)}",
                fix="the record's reply was empty, or its chat template dropped it (a tool call it cannot render); "
                    + RECREATE + " (this version refuses such records by name)", code="empty_reply",
                **self._at(shard, i, (start + q) * msz)))
        self._first.clear()
        self._counts = {"unstoppable": 0, "pad": 0, "empty": 0}
        return out

    def _at(self, shard: Shard, i: int, byte: int) -> dict:
        loc = shard.at(i, MASK_FILE, byte)
        if self.items == "rows":
            loc["where"] = loc["where"].replace("episode", "row", 1)
        return loc

    def rule_problems(self) -> tuple[list[Problem], list[str]]:
        """What the rule and the pad id alone say: problems, and notes."""
        out, notes = [], []
        stops = ", ".join(self.name(s) for s in self.stops)
        if not rule_trains_stop(self.rule):
            out.append(Problem("stops", TOKENIZER_FILE, "", f"the mask rule leaves the end-of-turn token ({stops}) "
                               f"untrained: no reply of this dataset teaches the model to stop",
                               "put the end-of-turn token inside the template's {% generation %} block and " + RECREATE,
                               code="stop_untrained"))
        if self.pad_id is not None and self.pad_id in self.stops:
            if self.pad_accepted:
                notes.append(f"the pad id {self.name(self.pad_id)} is also a stop id (recorded at prepare in "
                             f"serving.json): train with sftdata's loss mask, never with labels derived "
                             f"from the pad id")
            else:
                out.append(Problem("stops", SERVING_FILE, "", f"the pad id {self.name(self.pad_id)} is also a stop "
                                   f"id ({stops}): a trainer that masks labels equal to the pad id never trains the "
                                   f"stop token", "pad with a token the data never trains (`sftdata pack --pad-id`, "
                                   "or a pad_token in the tokenizer's config) and " + RECREATE, code="pad_is_stop"))
        return out, notes
