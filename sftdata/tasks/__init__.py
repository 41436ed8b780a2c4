"""One task runner for every pipeline (prepare, prepare-pref, pack, verify): local worker
processes (``pool``) or Ray tasks (``ray_tasks``) behind one protocol (``runner``), with
ordered results, a shared read-only context and one stop rule on Ctrl-C and errors."""

from .pool import ProcessRunner, process_pool, worker_started
from .ray_tasks import TASKS_PER_CPU, RayTasks, get_result
from .runner import Engine, TaskRunner, in_order, overlapped, running

__all__ = ["TASKS_PER_CPU", "Engine", "ProcessRunner", "RayTasks", "TaskRunner", "get_result", "in_order", "overlapped",
           "process_pool", "running", "worker_started"]
