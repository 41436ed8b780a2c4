"""A mixture: several prepared datasets trained together at chosen weights.

Pure and I/O-free: the mixture file's content as a dataclass, checked field by field
(``sftdata.store.mixture`` reads and writes the file, ``sftdata.mixture_order`` turns it
into the training order). The file (``sftdata mix``, docs/MIXTURES.md)::

    {"format": "sftdata-mixture", "version": 1, "by": "rows", "seed": 1337,
     "members": [{"name": "chat", "path": "data/chat", "weight": 0.8,
                  "metadata_sha256": "9f2c..."}, ...]}

``path`` is relative to the mixture file's folder unless absolute; ``metadata_sha256`` is
the sha256 of the member's ``dataset_metadata.json`` when the mixture was made, so a
member changed since is refused rather than silently mixed differently. ``by`` says
what the weights share out per epoch: ``rows`` (episodes, or packed rows) or ``tokens``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from fractions import Fraction

from .errors import DatasetError
from .order import MAX_SEED

MIXTURE_FORMAT = "sftdata-mixture"
MIXTURE_VERSION = 1
BY = ("rows", "tokens")
_NAME = re.compile(r"^[A-Za-z0-9_.+-]{1,100}$")


@dataclass(frozen=True)
class MixtureMember:
    name: str  # unique within the mixture: the replay's ``dataset`` column
    path: str  # as written in the file (relative to the mixture file's folder, or absolute)
    weight: float  # > 0; the weights are shared out in proportion (they need not sum to 1)
    metadata_sha256: str  # sha256 of the member's dataset_metadata.json when the mixture was made

    def as_dict(self) -> dict:
        return {"name": self.name, "path": self.path, "weight": self.weight, "metadata_sha256": self.metadata_sha256}


@dataclass(frozen=True)
class Mixture:
    members: tuple[MixtureMember, ...]
    by: str = "rows"
    seed: int = 1337

    @property
    def names(self) -> list[str]:
        return [m.name for m in self.members]

    def shares(self) -> list[Fraction]:
        """Each member's exact share of an epoch (the weights normalised, as fractions of
        the floats written in the file, so every machine rounds the same way)."""
        w = [Fraction(m.weight) for m in self.members]
        total = sum(w)
        return [x / total for x in w]

    def as_dict(self) -> dict:
        return {"format": MIXTURE_FORMAT, "version": MIXTURE_VERSION, "by": self.by, "seed": self.seed,
                "members": [m.as_dict() for m in self.members]}


def check_mixture(members: list[MixtureMember], by: str, seed: int, where: str) -> Mixture:
    """The ``Mixture`` of these values, or ``DatasetError`` naming ``where`` and the fix."""
    if by not in BY:
        raise DatasetError(f"{where}: by is {by!r}; it must be one of {', '.join(BY)} (what the weights share out)")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise DatasetError(f"{where}: seed {seed!r} must be an integer in 0..{MAX_SEED}")
    if not members:
        raise DatasetError(f"{where}: a mixture needs at least one member dataset; give DATASET:WEIGHT arguments")
    seen: dict[str, str] = {}
    for m in members:
        if not isinstance(m.name, str) or not _NAME.match(m.name):
            raise DatasetError(f"{where}: member name {m.name!r} must be 1-100 letters, digits or ._+- (it names the "
                               f"member in replay-order's dataset column); rename the folder or give NAME=DATASET:WEIGHT")
        if m.name in seen:
            raise DatasetError(f"{where}: two members are named {m.name!r} ({seen[m.name]} and {m.path}); names must "
                               f"be unique: give one of them another with NAME=DATASET:WEIGHT")
        seen[m.name] = m.path
        w = m.weight
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) or w <= 0:
            raise DatasetError(f"{where}: member {m.name!r} has weight {w!r}; a weight is a finite number > 0 (leave "
                               f"a dataset out of the mixture rather than give it weight 0)")
        if not isinstance(m.path, str) or not m.path:
            raise DatasetError(f"{where}: member {m.name!r} has no path")
        if not isinstance(m.metadata_sha256, str) or not re.fullmatch(r"[0-9a-f]{64}", m.metadata_sha256):
            raise DatasetError(f"{where}: member {m.name!r} records no valid metadata_sha256; re-create the mixture "
                               f"with `sftdata mix`")
    return Mixture(tuple(members), by, int(seed))


def mixture_from_dict(obj, where: str) -> Mixture:
    """Parse the content of a mixture file (``where`` names it in errors)."""
    if not isinstance(obj, dict) or obj.get("format") != MIXTURE_FORMAT:
        raise DatasetError(f"{where} is not an sftdata mixture file (no \"format\": \"{MIXTURE_FORMAT}\"); make one "
                           f"with `sftdata mix DATASET:WEIGHT ... -o {where}`")
    if obj.get("version") != MIXTURE_VERSION:
        raise DatasetError(f"{where}: mixture version {obj.get('version')!r} is not supported (this sftdata reads "
                           f"version {MIXTURE_VERSION}); re-create it with this sftdata's `sftdata mix`")
    raw = obj.get("members")
    if not isinstance(raw, list) or not all(isinstance(m, dict) for m in raw):
        raise DatasetError(f"{where}: \"members\" must be a list of {{name, path, weight, metadata_sha256}} objects")
    members = [MixtureMember(m.get("name"), m.get("path"), m.get("weight"), m.get("metadata_sha256")) for m in raw]
    return check_mixture(members, obj.get("by"), obj.get("seed"), where)
