"""The prepare pipeline: records -> conversations -> episodes -> split -> dataset.

``prepare(inputs, output_dir, PrepareOptions(...))`` (run.py) is what the CLI and scripts
call. Its parts, one job a module: ``options`` (what it takes and gives), ``chunk`` (one
chunk of records rendered and masked), ``pool`` (worker processes, results in input
order; the pool as a runner of tasks), ``partition_task`` (a worker reading its own
partition of the input: the unit the Ray engine runs too), ``plan`` (the final shards
planned from the episodes' lengths), ``shard_task`` (a worker writing one final shard),
``partitioned`` (a partitioned run's waves of tasks), ``split`` (the exact seeded
train/val split, rows of any kind through the store's writers), ``driver`` (the one
build of every kind of row: each result's records curated in input order, the split,
the commit), ``run`` (the entry points: ``prepare`` builds episodes, ``prepare_pref``
pairs, KTO rows and RL prompts).
"""

from .driver import usable_workers
from .options import PrepareOptions
from .partition_task import PartSummary
from .pool import local_parts
from .results import Executor, PrepareSummary
from .run import prepare, prepare_pref
from .split import split_assignment

__all__ = ["Executor", "PartSummary", "PrepareOptions", "PrepareSummary", "local_parts", "prepare", "prepare_pref",
           "split_assignment", "usable_workers"]
