"""The one task runner (sftdata/tasks/runner.py): results in the jobs' order with at most
``depth`` in flight, the next item started before the one before is yielded, and the one
stop rule: an error in one task stops the others, and the staging area outlives them."""

import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from sftdata.errors import SftDataError
from sftdata.store.format import STOP_FILE
from sftdata.tasks import ProcessRunner, RayTasks, in_order, overlapped, process_pool, running, worker_started
from tests.helpers.processes import SAFETY_S


def test_in_order_yields_in_the_jobs_order_with_at_most_depth_in_flight():
    """Later jobs finish first, by events rather than sleeps: in each run of 3 (the depth,
    all in flight together) a job waits until the next one has finished."""
    lock, running, most, finished = threading.Lock(), [0], [0], []
    done = [threading.Event() for _ in range(12)]

    def job(i):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        if i % 3 != 2:
            assert done[i + 1].wait(SAFETY_S), f"job {i + 1} never finished"
        with lock:
            running[0] -= 1
            finished.append(i)
        done[i].set()
        return i * i

    class Threads:  # a runner (prepare.results.TaskRunner) over 4 threads, 3 jobs in flight at most
        depth, threads = 3, ThreadPoolExecutor(4)

        def submit(self, fn, args, doing):
            return self.threads.submit(fn, *args)

        def result(self, future, doing):
            return future.result()

    jobs = (((i,), f"job {i}", f"tag {i}") for i in range(12))
    got = list(in_order(Threads(), job, jobs))
    assert got == [(i * i, f"tag {i}") for i in range(12)]
    assert finished == [2, 1, 0, 5, 4, 3, 8, 7, 6, 11, 10, 9]  # the results came back out of order
    assert most[0] <= 3


def test_overlapped_starts_the_next_item_before_yielding_the_one_before():
    events = []

    def start(item):
        events.append(f"start {item}")
        return item * 10

    def jobs(fail_at=None):
        for i in range(3):
            if i == fail_at:
                raise ValueError(f"item {i} unreadable")
            events.append(f"read {i}")
            yield i, f"tag {i}"

    for got, tag in overlapped(jobs(), start):
        events.append(f"yield {got} {tag}")
    assert events == ["read 0", "start 0", "read 1", "start 1", "yield 0 tag 0", "read 2", "start 2",
                      "yield 10 tag 1", "yield 20 tag 2"]
    events.clear()
    with pytest.raises(ValueError, match="item 2 unreadable"):  # after item 1, as one at a time
        for got, _ in overlapped(jobs(fail_at=2), start):
            events.append(f"yield {got}")
    assert events == ["read 0", "start 0", "read 1", "start 1", "yield 0", "yield 10"]
    assert list(overlapped(iter(()), start)) == []

    def stops(item):  # a StopIteration escaping the work on an item is an error, never the end of the input
        return next(iter(())) if item == 1 else item

    with pytest.raises(RuntimeError, match="generator raised StopIteration"):
        list(overlapped(jobs(), stops))


# ---------------------------------------------------------------- the one stop rule

def _task(stage: str, k: int) -> int:
    """Task 0 fails once task 1 has started; task 1 runs until the stop rule's STOP file
    appears in the staging area, then says it ended (a file) and returns. (A safety net
    only: a task never told to stop gives up, leaving no "ended" file.)"""
    stage_dir = Path(stage)
    if k == 0:
        if not _until((stage_dir / "started_1").exists):
            return -1
        raise SftDataError("task 0 failed")
    (stage_dir / "started_1").touch()
    if _until((stage_dir / STOP_FILE).exists):
        (stage_dir / "ended_1").touch()
    return k


def _until(condition) -> bool:
    deadline = time.monotonic() + SAFETY_S
    while not condition():
        if time.monotonic() > deadline:
            return False
        threading.Event().wait(0.01)
    return True


@pytest.fixture(params=["processes", "ray"])
def make_runner(request):
    if request.param == "processes":
        return lambda stage: ProcessRunner(process_pool(2, worker_started, ()), 2, stage)
    ray = request.getfixturevalue("ray_cluster")

    def on_ray(stage):
        runner = RayTasks(ray)
        runner.stage_dir = stage
        return runner

    return on_ray


def test_an_error_in_one_task_stops_the_others_before_the_staging_area_goes(tmp_path, make_runner):
    """The one stop rule, for local processes and Ray alike: task 0 fails while task 1 runs;
    leaving ``running`` writes STOP into the staging area and returns only once task 1 has
    seen it and ended, so the staging area can then be removed with no task writing on."""
    stage = tmp_path / "stage"
    stage.mkdir()
    runner = make_runner(stage)
    with pytest.raises(SftDataError, match="^task 0 failed$"):
        with running(runner):
            list(in_order(runner, _task, (((str(stage), k), f"task {k}", k) for k in range(2))))
    assert sorted(p.name for p in stage.iterdir()) == [STOP_FILE, "ended_1", "started_1"]
    shutil.rmtree(stage)


def test_a_run_that_ends_writes_no_stop(tmp_path):
    stage = tmp_path / "stage"
    stage.mkdir()
    with running(ProcessRunner(process_pool(2, worker_started, ()), 2, stage)) as runner:
        assert list(in_order(runner, abs, (((-k,), f"job {k}", k) for k in range(5)))) == \
            [(k, k) for k in range(5)]
    assert list(stage.iterdir()) == []
