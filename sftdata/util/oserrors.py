"""An OSError that names its path: a write's error (a full disk, a file-size limit) carries
no file name, so the message would say "No space left on device" and not where."""

from __future__ import annotations

import os
import re
from contextlib import contextmanager
from pathlib import Path

_ERRNO_IN_TEXT = re.compile(r"\[errno (\d+)\]", re.IGNORECASE)  # pyarrow's: "Detail: [errno 27] File too large"


@contextmanager
def naming(path: str | Path, doing: str | None = None):
    """An OSError raised inside without a file name is raised again naming ``path`` (and
    ``doing``, e.g. "while preparing data/chat_sft", after the system's words)."""
    try:
        yield
    except OSError as e:
        if e.filename is not None:
            raise
        code, text = e.errno, e.strerror or str(e)
        if m := _ERRNO_IN_TEXT.search(text):
            code = int(m.group(1))
            text = os.strerror(code)  # the system's words, not a library's wrapping of them
        raise OSError(code, f"{text} ({doing})" if doing else text, str(path)) from None
