"""What a command imports: the sftdata modules a fresh interpreter holds after running it."""

from __future__ import annotations

import subprocess
import sys

from tests.helpers.paths import ROOT


def modules_after(*args: str) -> set[str]:
    """The sftdata modules a fresh interpreter holds after running ``sftdata ARGS``."""
    code = ("import sys; from sftdata.cli import app\n"
            "try:\n    app(sys.argv[1:], prog_name='sftdata')\nexcept SystemExit:\n    pass\n"
            "print(' '.join(m for m in sys.modules if m.startswith('sftdata')), file=sys.stderr)")
    r = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=ROOT,
                       env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, timeout=120)
    return set(r.stderr.split())
