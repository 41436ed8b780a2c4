"""An episodes dataset -> a packed dataset (several conversations per row): the run
(``run``: plan, rows, commit) and the rows of a plan (``rows``, the unit both engines run)."""

from .run import PackOptions, PackProgress, PackReport, SplitReport, pack, speedup

__all__ = ["PackOptions", "PackProgress", "PackReport", "SplitReport", "pack", "speedup"]
