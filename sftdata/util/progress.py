"""A progress bar drawn from its first report: the CLI's and the scripts' one bar."""

from __future__ import annotations

from rich.progress import Progress


class LazyProgress:
    """A rich ``Progress`` that starts drawing at the first report, so that an error
    raised before any work (a bad option, a missing file) is printed alone: no empty bar
    and no blank line above it. ``update`` creates the one task, then moves it."""

    def __init__(self, progress: Progress):
        self.progress = progress
        self.task = None

    def update(self, description: str, **kw) -> None:
        if self.task is None:
            self.progress.start()
            self.task = self.progress.add_task(description, total=None)
        self.progress.update(self.task, description=description, **kw)

    def __enter__(self) -> LazyProgress:
        return self

    def __exit__(self, *exc) -> None:
        if self.task is not None:
            self.progress.stop()
