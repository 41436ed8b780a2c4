"""``--config run.toml`` (or ``.yaml`` / ``.yml``): a file of option values, keyed by the
declared names (``val_split`` or ``val-split``; a flag's own name too: ``format``,
``template_var``), checked against what the command takes. Every error is one line naming
the file, the key and what is allowed (``UsageError``)."""

from __future__ import annotations

import tomllib
from pathlib import Path

from ..errors import UsageError
from .declared import Option, taken_by
from .values import coerce

YAML_MISSING = "pip install 'sftdata[yaml]'"


def _read(path: Path) -> object:
    suffix = path.suffix.lower()
    if suffix not in (".toml", ".yaml", ".yml"):
        raise UsageError(f"--config {path}: give a .toml, .yaml or .yml file")
    try:
        data = path.read_bytes()
    except OSError as e:
        raise UsageError(f"--config {path}: cannot read it ({e.strerror or e})") from None
    if suffix == ".toml":
        try:
            return tomllib.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
            raise UsageError(f"--config {path}: not valid TOML ({e})") from None
    try:
        import yaml  # an optional dependency: the yaml extra
    except ImportError:
        raise UsageError(f"--config {path}: reading YAML needs PyYAML: {YAML_MISSING} (or write the file as TOML)") \
            from None
    try:
        return yaml.safe_load(data) or {}
    except yaml.YAMLError as e:
        raise UsageError(f"--config {path}: not valid YAML ({' '.join(str(e).split())})") from None


def _names(o: Option) -> set[str]:
    """The keys that give ``o``: its name and its flag's, each with - or _."""
    names = {o.name, *(f[2:] for f in o.flags if f.startswith("--"))}
    return {n.replace(a, b) for n in names for a, b in (("_", "-"), ("-", "_"))}


def read_config(path: str | Path, command: str) -> dict:
    """``{option name: value}`` of the file at ``path`` for ``command`` (module docstring)."""
    path = Path(path)
    data = _read(path)
    if not isinstance(data, dict):
        raise UsageError(f"--config {path}: give a table of option = value, not a {type(data).__name__}")
    options = [o for o in taken_by(command) if o.flags]
    by_key = {n: o for o in options for n in _names(o)}
    out: dict = {}
    for key, value in data.items():
        o = by_key.get(str(key))
        if o is None:
            raise UsageError(f"--config {path}: {command} takes no option {key!r}; it takes "
                             f"{', '.join(o.name for o in options)}")
        if o.name in out:
            raise UsageError(f"--config {path}: {key!r} gives {o.name} a second time")
        try:
            out[o.name] = coerce(o.type, value, o.nullable)
        except TypeError as e:
            raise UsageError(f"--config {path}: {key} {e}") from None
    return out
