"""Python's garbage collector held back for the length of a run (pure but for the
interpreter's collector settings, which it restores).

A run makes millions of short-lived objects (messages, turns, arrays), so the collector
runs its youngest generation every 700 allocations and, every so often, walks every
object the process holds (its modules, the tokenizer's tables, a training script's
model), which costs a run 5-10% of its time and finds nothing to free: a run's objects
do not form cycles. Within ``fewer_collections()``:

* the objects alive when the run starts are frozen (``gc.freeze``): the collector does
  not walk them again; they are unfrozen when the run ends (unless the process had
  frozen objects of its own: then nothing is frozen or unfrozen);
* the youngest generation is collected every ``YOUNG_THRESHOLD`` allocations instead of
  700 (or the process's own threshold, when higher).

Nested or concurrent runs share one setting: the first in changes it, the last out
restores what the process had. It is used only where one process does the work with no
process pool beside it (prepare-pref's one-process loop, pairs verify's re-render);
prepare-chat, whose workers are forked, does not use it.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

YOUNG_THRESHOLD = 10_000

_lock = threading.Lock()
_state: dict = {"depth": 0, "threshold": None, "froze": False}


@contextmanager
def fewer_collections() -> Iterator[None]:
    """Hold the collector back while the block runs (module docstring)."""
    with _lock:
        if _state["depth"] == 0:
            threshold = gc.get_threshold()
            _state["threshold"] = threshold
            _state["froze"] = gc.get_freeze_count() == 0
            if _state["froze"]:
                gc.freeze()
            gc.set_threshold(max(threshold[0], YOUNG_THRESHOLD), *threshold[1:])
        _state["depth"] += 1
    try:
        yield
    finally:
        with _lock:
            _state["depth"] -= 1
            if _state["depth"] == 0:
                gc.set_threshold(*_state["threshold"])
                if _state["froze"]:
                    gc.unfreeze()


_paused: dict = {"depth": 0, "enabled": False}


@contextmanager
def paused() -> Iterator[None]:
    """No collection at all while the block runs: for a short burst of objects that form
    no cycles and live on (a tokenizer.json parsed: 150,000 entries the collector would
    otherwise walk again at each generation's threshold as they are made). The collector
    is enabled again after, if it was; nested or concurrent blocks share one setting."""
    with _lock:
        if _paused["depth"] == 0:
            _paused["enabled"] = gc.isenabled()
            gc.disable()
        _paused["depth"] += 1
    try:
        yield
    finally:
        with _lock:
            _paused["depth"] -= 1
            if _paused["depth"] == 0 and _paused["enabled"]:
                gc.enable()
