"""The ``sftdata`` command line (Typer). Commands are thin: parse, call one library
function, draw its result; ``app.COMMANDS`` lists them, each imported when it is used.
Nothing else imports this package."""

from __future__ import annotations

from .app import app, main

__all__ = ["app", "main"]
