"""Audit log lines (a documented file format, docs/LOADER.md) and checking a log against a
replayed order.

One event per line, fields separated by `` | ``::

    2026-01-03T16:44:19.628Z | TRAINING | INFO | action=epoch_start | split=train | epoch=0 | seed=42 \
        | num_episodes=504 | first_episode_ids="[173, 274, 489, 72, 305, 76, 475, 140, 469, 498]" | step=0

(one line in the file; cut here to fit.)

Values are bare when they hold no space, ``|``, ``=`` or quote; otherwise JSON strings.
Booleans are ``true``/``false``; lists are written as a quoted JSON list. Files are
``<audit_dir>/audit_<UTC time>_p<pid>.log``, appended line by line (each line is
written with one ``write`` on a file opened for appending, so concurrent writers in
one folder never interleave within a line).

The keys are part of the format and never change: a packed run writes its row ids and
row counts under ``first_episode_ids`` / ``num_episodes`` / ``episodes_seen`` too.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from ..errors import InputError, UsageError
from .batches import Order

FIRST_IDS = 10  # epoch_start records this many first episode ids
_BARE = re.compile(r"^[^\s|=\"]*$")


def format_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    if isinstance(v, (list, tuple)):
        return json.dumps("[" + ", ".join(str(int(i)) for i in v) + "]")
    s = str(v)
    return s if s and _BARE.match(s) else json.dumps(s)


def format_line(action: str, fields: dict, *, category: str = "TRAINING", level: str = "INFO",
                when: float | None = None) -> str:
    t = datetime.fromtimestamp(time.time() if when is None else when, tz=UTC)
    stamp = t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"
    parts = [stamp, category, level, f"action={format_value(action)}"]
    parts += [f"{k}={format_value(v)}" for k, v in fields.items()]
    return " | ".join(parts)


class AuditLog:
    """Appends audit events to ``<directory>/audit_<UTC time>_p<pid>.log``."""

    def __init__(self, directory: str | Path, *, filename: str | None = None):
        self.dir = Path(directory)
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise InputError(f"cannot create the audit folder {self.dir}: {e}") from None
        if filename is None:
            filename = f"audit_{datetime.now(UTC):%Y%m%dT%H%M%SZ}_p{os.getpid()}.log"
        self.path = self.dir / filename

    def event(self, action: str, level: str = "INFO", **fields) -> str:
        line = format_line(action, fields, level=level) + "\n"
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode("utf-8"))
        finally:
            os.close(fd)
        return line

    def __getstate__(self):
        return {"dir": str(self.dir), "path": str(self.path)}

    def __setstate__(self, state):
        self.dir, self.path = Path(state["dir"]), Path(state["path"])


# ---------------------------------------------------------------------------- reading
@dataclass
class AuditEntry:
    line: int  # 1-based line number in the file
    timestamp: str
    category: str
    level: str
    action: str
    fields: dict = field(default_factory=dict)  # key -> value as written (unquoted string)


def parse_line(text: str, line: int = 0) -> AuditEntry | None:
    """Parse one audit line; None when it is not in the audit format."""
    parts = text.rstrip("\n").split(" | ", 3)
    if len(parts) < 4:
        return None
    stamp, category, level, rest = parts
    fields: dict[str, str] = {}
    i, n = 0, len(rest)
    while i < n:
        eq = rest.find("=", i)
        if eq < 0:
            return None
        key = rest[i:eq]
        j = eq + 1
        if j < n and rest[j] == '"':
            try:
                val, end = json.JSONDecoder().raw_decode(rest, j)
            except json.JSONDecodeError:
                return None
            j = end
        else:
            end = rest.find(" | ", j)
            j = n if end < 0 else end
            val = rest[eq + 1:j]
        fields[key] = val
        if j < n:
            if not rest.startswith(" | ", j):
                return None
            j += 3
        i = j
    if "action" not in fields:
        return None
    action = fields.pop("action")
    return AuditEntry(line, stamp, category, level, action, fields)


def read_log(path: str | Path) -> tuple[list[AuditEntry], list[int]]:
    """Entries of an audit log, and the numbers of lines that are not audit lines."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        raise InputError(f"audit log {p} does not exist") from None
    entries, bad = [], []
    for no, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        e = parse_line(raw, no)
        (entries.append(e) if e is not None else bad.append(no))
    return entries, bad


# ---------------------------------------------------------------------------- checking
@dataclass
class AuditMismatch:
    line: int
    epoch: int | None
    what: str  # "first_episode_ids" | "seed" | "num_episodes" | "epoch_seed" | "format" ...
    logged: object
    expected: object
    message: str


@dataclass
class AuditCheck:
    path: str
    split: str
    checked: int  # epoch_start lines compared
    epochs: list[int] = field(default_factory=list)
    mismatches: list[AuditMismatch] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.checked > 0 and not self.mismatches

    def as_dict(self) -> dict:
        return {"path": self.path, "split": self.split, "ok": self.ok, "checked": self.checked,
                "epochs": self.epochs,
                "mismatches": [m.__dict__ for m in self.mismatches]}


def check_audit(path: str | Path, order: Order, split: str = "train") -> AuditCheck:
    """Compare every ``epoch_start`` line of ``split`` in an audit log with ``order``:
    first episode ids, effective seed and episode count; and the ``dataset_load`` seed
    and shuffle flag. Lines without a ``split`` field count as train."""
    if order.sampling != "epoch":
        raise UsageError("--check-audit needs batch_sampling_mode=epoch (random sampling logs no epochs)")
    entries, bad = read_log(path)
    res = AuditCheck(str(path), split, 0)
    for no in bad:
        res.mismatches.append(AuditMismatch(no, None, "format", None, None,
                                            f"line {no}: not an audit line (damaged or edited)"))
    for e in entries:
        if e.action == "dataset_load":  # one line for all splits
            _compare(res, e, None, "epoch_seed", e.fields.get("epoch_seed"), str(order.seed))
            _compare(res, e, None, "epoch_shuffle", e.fields.get("epoch_shuffle"),
                     format_value(order.shuffle))
        elif e.action == "epoch_start" and e.fields.get("split", "train") == split:
            _check_epoch_start(res, e, order)
    return res


def _compare(res: AuditCheck, e: AuditEntry, epoch, key, logged, expected) -> bool:
    if logged is None or logged == expected:
        return True
    where = f"epoch {epoch}: " if epoch is not None else ""
    res.mismatches.append(AuditMismatch(e.line, epoch, key, logged, expected,
                                        f"line {e.line}: {where}{key} is {logged} in the log, the replay "
                                        f"gives {expected}"))
    return False


def _check_epoch_start(res: AuditCheck, e: AuditEntry, order: Order) -> None:
    try:
        epoch = int(e.fields["epoch"])
        logged_ids = [int(v) for v in json.loads(e.fields["first_episode_ids"])]
    except (KeyError, ValueError, TypeError):
        res.mismatches.append(AuditMismatch(e.line, None, "format", None, None,
                                            f"line {e.line}: epoch_start without a readable epoch and "
                                            f"first_episode_ids"))
        return
    res.checked += 1
    res.epochs.append(epoch)
    _compare(res, e, epoch, "seed", e.fields.get("seed"), str(order.seed + epoch))
    _compare(res, e, epoch, "num_episodes", e.fields.get("num_episodes"), str(order.epoch_size(epoch)))
    expected = order.epoch_order(epoch)[:FIRST_IDS].tolist()
    if logged_ids != expected:
        k = next((i for i, (a, b) in enumerate(zip(logged_ids, expected)) if a != b),
                 min(len(logged_ids), len(expected)))
        got = logged_ids[k] if k < len(logged_ids) else "nothing"
        want = expected[k] if k < len(expected) else "nothing"
        res.mismatches.append(AuditMismatch(
            e.line, epoch, "first_episode_ids", logged_ids, expected,
            f"line {e.line}: epoch {epoch}: first_episode_ids differ at position {k}: the log has {got}, "
            f"the replay gives {want}"))
