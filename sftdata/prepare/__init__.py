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

from .chunk import process_chunk
from .driver import usable_workers
from .options import PrepareOptions
from .partition_task import PartNumbering, PartSummary, partition_settings, prepare_partition
from .pool import local_parts
from .results import ChunkResult, Executor, PrepareSummary, Progress, StagedPart
from .run import prepare, prepare_pref
from .split import split_assignment

__all__ = [
    "ChunkResult", "Executor", "PartNumbering", "PartSummary", "PrepareOptions",
    "PrepareSummary", "Progress", "StagedPart", "local_parts", "partition_settings", "prepare", "prepare_partition",
    "prepare_pref", "process_chunk", "split_assignment", "usable_workers",
]
