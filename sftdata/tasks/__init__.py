"""One task runner for every pipeline (prepare, prepare-pref, pack, verify): local worker
processes (``pool``) or Ray tasks (``ray_tasks``) behind one protocol (``runner``), with
ordered results, a shared read-only context and one stop rule on Ctrl-C and errors."""

from .pool import ProcessRunner, process_pool, stop_pool, wait_result, worker_started
from .ray_tasks import TASK_RETRIES, TASKS_PER_CPU, RayTasks, get_result, stop_tasks
from .runner import Engine, TaskRunner, in_order, overlapped, running, write_stop

__all__ = ["TASK_RETRIES", "TASKS_PER_CPU", "Engine", "ProcessRunner", "RayTasks", "TaskRunner", "get_result", "in_order",
           "overlapped", "process_pool", "running", "stop_pool", "stop_tasks", "wait_result", "worker_started",
           "write_stop"]
