"""Engines that run the pipelines: ``local`` (this process and its worker processes) or
``ray`` (tasks on a Ray cluster). The same per-partition function runs in either; only
the driver commits, and the dataset is byte-identical whichever engine made it.

``cluster`` connects, and gives pack's and verify's engine (``ray_engine``: their tasks
as Ray tasks); prepare's partitioned run has its own module (``prepare_ray``), imported
by the build commands alone: a command imports no other pipeline.
"""

from .cluster import check_engine, connect, ray_engine

__all__ = ["check_engine", "connect", "ray_engine"]
