"""Engines that run the pipelines: ``local`` (this process and its worker processes) or
``ray`` (tasks on a Ray cluster). The same per-partition function runs in either; only
the driver commits, and the dataset is byte-identical whichever engine made it."""

from .cluster import ENGINES, RayCluster, check_engine, connect
from .pack_ray import ray_pack_executor
from .prepare_ray import ray_prepare_executor
from .verify_ray import ray_verify_executor

__all__ = ["ENGINES", "RayCluster", "check_engine", "connect", "ray_pack_executor", "ray_prepare_executor",
           "ray_verify_executor"]
