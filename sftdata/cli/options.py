"""Options shared by several commands, as ``Annotated`` aliases defined once (the help
text is part of the CLI's contract: tests/contract/)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

# metavar "": a flag takes no value, so help shows none (typer would show <bool>)
JsonOpt = Annotated[bool, typer.Option("--json", metavar="", help="Print the result as JSON on stdout, and "
                                       "nothing else there (progress and warnings go to stderr).")]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", metavar="", help="No progress bar, table or warning "
                                        "on stderr (errors are still printed).")]
OverwriteOpt = Annotated[bool, typer.Option("--overwrite", metavar="", help="Replace the dataset at --output-dir, "
                                            "once the new one is complete (never a folder that is not a dataset).")]
WaitOpt = Annotated[bool, typer.Option("--wait", metavar="", help="When another sftdata is writing the same "
                                       "--output-dir, wait for it to finish instead of stopping at once (then "
                                       "--overwrite decides whether its result may be replaced).")]
DatasetArg = Annotated[Path, typer.Argument(metavar="DATASET", show_default=False, help="Dataset folder (the "
                                           "--output-dir of prepare-chat, prepare-tool or pack).")]
TokenDtypeOpt = Annotated[str | None, typer.Option("--token-dtype", metavar="DTYPE", help="Older flat layout only: "
                                                      "dtype of tokens.bin, uint16 or uint32 (default).")]
