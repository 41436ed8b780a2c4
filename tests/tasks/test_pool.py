"""Tasks in local worker processes (sftdata/tasks/pool.py): a pool stopped with its tasks
answered or still running returns only once its workers and manager thread are gone."""

import threading

from sftdata.tasks import pool
from tests.helpers.processes import SAFETY_S, hold, pool_threads_closed, wait_for


def test_a_closed_pool_has_its_workers_and_its_manager_thread_gone(tmp_path):
    """A run that ends (its tasks answered) or stops (a task still running) returns from
    ``stop_pool`` only once the running tasks have finished, every worker process has
    ended and the pool's manager thread with it: no worker writes on into a staging area
    about to be removed, and the exit handler finds no pipe to race (issue 44.4)."""
    p = pool.process_pool(2, pool.worker_started, ())
    assert sorted(p.submit(abs, -i).result() for i in range(4)) == [0, 1, 2, 3]
    procs = list(p._processes.values())
    pool.stop_pool(p, stopped=False)
    assert [x.exitcode for x in procs] == [0, 0] and pool_threads_closed()

    p = pool.process_pool(2, pool.worker_started, ())
    pid_file, go_file = tmp_path / "pid", tmp_path / "go"
    held = p.submit(hold, pid_file, go_file)
    wait_for("the task to start", pid_file.exists)
    procs = list(p._processes.values())
    stopping = threading.Thread(target=pool.stop_pool, args=(p, True))
    stopping.start()
    go_file.touch()  # the running task finishes: stop_pool waits for it, then for the workers
    stopping.join(SAFETY_S)
    assert not stopping.is_alive() and held.result() == int(pid_file.read_text())
    assert [x.exitcode for x in procs] == [0, 0] and pool_threads_closed()
