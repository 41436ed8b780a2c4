"""``python -m sftdata``: the same as the ``sftdata`` command."""

from .cli import main

main()
