"""The ``sftdata`` command line (Typer). Commands are thin: parse, call one library
function, draw its result. Nothing else imports this package."""

from __future__ import annotations

# (ruff leaves this block unsorted: per-file-ignores) the order of these imports is the order of the commands in --help)
from .app import app, main
from . import prepare_cmd  # noqa: F401  (registers prepare-chat / prepare-tool)
from . import replay_cmd  # noqa: F401  (registers replay-order)
from . import pack_cmd  # noqa: F401  (registers pack)
from . import mix_cmd  # noqa: F401  (registers mix)
from . import export_cmd  # noqa: F401  (registers export)
from . import inspect_cmd  # noqa: F401  (registers inspect)
from . import report_cmd  # noqa: F401  (registers report)
from . import verify_cmd  # noqa: F401  (registers verify)
from . import clean_cmd  # noqa: F401  (registers clean)

__all__ = ["app", "main"]
