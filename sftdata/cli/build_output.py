"""What prepare and pack say about their build key (docs/CLI.md, "Up to date"): a target
that is up to date, and why one is rebuilt."""

from __future__ import annotations

from rich.text import Text

from ..store.build_key import BuildCheck
from .app import err_console, warn


def show_rebuild(check: BuildCheck) -> None:
    """``rebuilding DIR: what changed; ...`` on stderr, before the work (nothing for a new target)."""
    if check.changes:
        err_console.print(Text(f"rebuilding {check.target.location}: " + "; ".join(check.changes), style="cyan"),
                          soft_wrap=True)


def show_up_to_date(output_dir: str, key: str | None, libraries_changed: list[str]) -> None:
    """``DIR: up to date (build key 3f9a...)`` on stderr, and a warning when the libraries
    that made it are not the ones installed now."""
    err_console.print(Text(f"{output_dir}: up to date (build key {(key or '')[:12]}...); nothing to do (--force "
                           f"rebuilds it)", style="green"), soft_wrap=True)
    if libraries_changed:
        warn(f"{output_dir} was made with other library versions ({'; '.join(libraries_changed)}): "
             f"`sftdata verify {output_dir} --retokenize 200` checks that they still render and encode it alike")
