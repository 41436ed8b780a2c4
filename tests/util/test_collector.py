"""The collector held back for a run (util/collector.py), and the process's settings given
back as they were: on error too, nested, and leaving a process's own frozen objects alone."""

import gc

import pytest

from sftdata.util.collector import YOUNG_THRESHOLD, fewer_collections, paused


@pytest.fixture
def settings():
    before = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    yield
    gc.set_threshold(*before)


def test_a_run_freezes_what_was_alive_and_raises_the_young_threshold_then_restores(settings):
    assert gc.get_freeze_count() == 0
    with fewer_collections():
        assert gc.get_threshold() == (YOUNG_THRESHOLD, 10, 10)
        frozen = gc.get_freeze_count()
        assert frozen > 0
        with fewer_collections():  # nested: the same setting, nothing frozen twice
            assert gc.get_threshold() == (YOUNG_THRESHOLD, 10, 10) and 0 < gc.get_freeze_count() <= frozen
        assert gc.get_threshold() == (YOUNG_THRESHOLD, 10, 10)  # the outer run still holds it
    assert gc.get_threshold() == (700, 10, 10) and gc.get_freeze_count() == 0
    with pytest.raises(ValueError), fewer_collections():
        raise ValueError("a failed run")
    assert gc.get_threshold() == (700, 10, 10) and gc.get_freeze_count() == 0


def test_a_process_that_froze_its_own_objects_keeps_them_frozen_and_a_higher_threshold(settings):
    gc.set_threshold(50_000, 20, 20)
    gc.freeze()
    try:
        own = gc.get_freeze_count()

        @fewer_collections()
        def run():
            assert gc.get_threshold() == (50_000, 20, 20) and 0 < gc.get_freeze_count() <= own  # none added
            return "done"

        assert run() == "done"
        assert 0 < gc.get_freeze_count() <= own and gc.get_threshold() == (50_000, 20, 20)  # still frozen
    finally:
        gc.unfreeze()


def test_a_paused_block_collects_nothing_and_gives_back_the_collector_as_it_was():
    assert gc.isenabled()
    with paused():
        assert not gc.isenabled()
        with paused():  # nested: still paused
            assert not gc.isenabled()
        assert not gc.isenabled()  # the outer block still holds it
    assert gc.isenabled()
    with pytest.raises(ValueError), paused():
        raise ValueError("a failed load")
    assert gc.isenabled()
    gc.disable()
    try:
        with paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # a process that had it off keeps it off
    finally:
        gc.enable()
