"""Engines that run the pipelines: ``local`` (this process and its worker processes) or
``ray`` (tasks on a Ray cluster). The same per-partition function runs in either; only
the driver commits, and the dataset is byte-identical whichever engine made it.

Each pipeline's Ray executor lives in its own module (``prepare_ray``, ``pack_ray``,
``verify_ray``), imported by the command that needs it: a command imports no other
pipeline. ``cluster`` connects; ``tasks`` holds what their tasks share.
"""

from .cluster import ENGINES, RayCluster, check_engine, connect

__all__ = ["ENGINES", "RayCluster", "check_engine", "connect"]
