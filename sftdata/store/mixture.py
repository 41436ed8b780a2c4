"""The mixture file: its content (``Mixture``, checked field by field), writing it
(``make_mixture``) and opening it with its members (``open_mixture``), refusing a member
that changed since the mixture was made or that cannot be trained beside the others.
``sftdata.order.mixture.MixtureOrder`` turns it into the training order. The file
(``sftdata mix``, docs/MIXTURES.md)::

    {"format": "sftdata-mixture", "version": 1, "by": "rows", "seed": 1337,
     "members": [{"name": "chat", "path": "data/chat", "weight": 0.8,
                  "metadata_sha256": "9f2c..."}, ...]}

``path`` is relative to the mixture file's folder unless absolute; ``metadata_sha256`` is
the sha256 of the member's ``dataset_metadata.json`` when the mixture was made, so a
member changed since is refused rather than silently mixed differently. ``by`` says
what the weights share out per epoch: ``rows`` (episodes, or packed rows) or ``tokens``.
The file's sha256 (of its bytes) is what the loader's audit log and resumable state
record. Telling a mixture file from a dataset folder is ``format.is_mixture_file`` (the
loader loads this module only for a mixture).
"""

from __future__ import annotations

import hashlib
import math
import os
import re
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import numpy as np
import orjson

from ..errors import ConfigError, DatasetError, OutputExistsError, UsageError
from ..order.batches import MAX_SEED, eligible_ids
from ..order.config import LoaderConfig
from ..order.mixture import MemberItems, MixtureOrder
from ..storage import METADATA_FILE
from ..storage.fsops import create_file, refuse_link
from ..storage.lock import NAME_TRIES, tag
from ..util.hashing import sha256_file
from ..util.oserrors import naming
from .format import (
    FORMAT_VERSION,
    LAST_REPLY_FORMAT_VERSION,
    MIXTURE_FORMAT,
    ROW_KINDS,
    dataset_holding,
    dumps_json,
    is_mixture_file,
)
from .reader import Dataset, open_dataset
from .rows import ROW_ITEMS, RowSplit
from .shard import split_segments

# tokenizer_state keys that say where a tokenizer was read from, not which one it is
_LOCATION_KEYS = ("path", "source")


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


def read_mixture(path: str | Path) -> tuple[Mixture, str]:
    """The mixture in ``path`` and the sha256 of the file."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise DatasetError(f"mixture file {p} does not exist; make it with `sftdata mix DATASET:WEIGHT ... -o {p}`") \
            from None
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError as e:
        raise DatasetError(f"{p} is not valid JSON ({e}); re-create the mixture with `sftdata mix`") from None
    return mixture_from_dict(obj, str(p)), hashlib.sha256(data).hexdigest()


def member_root(mixture_path: str | Path, member: MixtureMember) -> Path:
    """The member's dataset folder: its path, relative to the mixture file's folder."""
    p = Path(member.path)
    return p if p.is_absolute() else Path(mixture_path).parent / p


def metadata_checksum(root: Path) -> str:
    f = root / METADATA_FILE
    if not f.is_file():
        raise DatasetError(f"{root} has no {METADATA_FILE}: only datasets made by `sftdata prepare-chat`, "
                           f"`prepare-tool` or `pack` can be mixed (they record what they hold)")
    return sha256_file(f)


@dataclass
class OpenedMixture:
    """A mixture file with its members opened (memory-mapped)."""

    path: Path
    mixture: Mixture
    sha256: str
    datasets: list[Dataset]

    @property
    def kind(self) -> str:
        return self.datasets[0].kind

    @property
    def names(self) -> list[str]:
        return self.mixture.names

    @property
    def splits(self) -> tuple[str, ...]:
        """The splits every member has."""
        first = self.datasets[0].splits
        return tuple(s for s in first if all(s in ds.splits for ds in self.datasets))

    def items(self, split: str, min_tokens: int) -> list[MemberItems]:
        """Each member's eligible items of ``split`` and their tokens: episodes of at
        least ``min_tokens`` tokens; packed rows, all, with their real (unpadded) tokens;
        pairs (KTO rows, RL prompts) whose shortest sequence has ``min_tokens``, with the
        tokens of every sequence a trainer reads (``prompt + chosen`` and ``prompt + rejected``)."""
        out = []
        for ds in self.datasets:
            sp = ds.split(split)
            if ds.kind in ROW_KINDS:
                lens = RowSplit(ds.kind, sp).sequence_lengths
                ids = eligible_ids(lens.min(axis=1) if lens.size else np.zeros(0, np.int64), min_tokens)
                out.append(MemberItems(ids, lens.sum(axis=1)[ids], lens.shape[0]))
            elif ds.kind == "packed":
                seg = split_segments(sp)
                real = np.bincount(seg.row, weights=seg.length, minlength=sp.num_rows).astype(np.int64)
                out.append(MemberItems(np.arange(sp.num_rows, dtype=np.int64), real, sp.num_rows))
            else:
                ids = eligible_ids(sp.lengths, min_tokens)
                out.append(MemberItems(ids, sp.lengths[ids], sp.num_episodes))
        return out


def mixture_order(cfg: LoaderConfig, om: OpenedMixture, split: str, world_size: int = 1) -> MixtureOrder:
    """The order of ``split`` of a mixture: the loader's, ``replay-order``'s and
    ``inspect``'s (the mixture's seed; the config's batch size, shuffle, drop_last and
    ``episode_min_tokens``)."""
    sampling = cfg.batch_sampling_mode or "epoch"
    if getattr(cfg, "batch_tokens", None) is not None:
        raise ConfigError(f"a mixture ({om.path}) is batched by batch_size rows; batch_tokens is not supported for "
                          f"mixtures: remove it from the config (or train one dataset with token-budget batches)")
    if sampling != "epoch":
        raise ConfigError(f"a mixture ({om.path}) is read in epochs whose shares are its weights; "
                          f"batch_sampling_mode={sampling!r} is not supported, leave it null or set it to epoch")
    return MixtureOrder(om.items(split, cfg.episode_min_tokens), om.mixture.shares(), by=om.mixture.by,
                        batch_size=cfg.batch_size, world_size=world_size, seed=om.mixture.seed,
                        shuffle=cfg.epoch_shuffle, drop_last=cfg.epoch_drop_last, names=om.names,
                        what=f"split {split!r} of the mixture {om.path}",
                        items="rows" if om.kind == "packed" else ROW_ITEMS.get(om.kind, "episodes"))


def open_mixture(path: str | Path, *, token_dtype=None) -> OpenedMixture:
    """Open a mixture and its members; ``DatasetError`` when a member is missing, broken
    (``open_dataset``), changed since the mixture was made, or not trainable beside the
    first member (another tokenizer, kind, format version or packing)."""
    p = Path(path)
    mixture, sha = read_mixture(p)
    datasets = []
    for m in mixture.members:
        root = member_root(p, m)
        if not root.is_dir():
            raise DatasetError(f"{p}: member {m.name!r} is {root}, which does not exist (paths are relative to the "
                               f"mixture file's folder); move it back, or re-create the mixture with `sftdata mix`")
        got = metadata_checksum(root)
        if got != m.metadata_sha256:
            raise DatasetError(f"{p}: member {m.name!r} ({root}) has changed since the mixture was made (its "
                               f"{METADATA_FILE} hashes to {got[:12]}..., the mixture recorded "
                               f"{m.metadata_sha256[:12]}...), so the order would differ from the one recorded; "
                               f"re-create the mixture with `sftdata mix` (a new run), or restore the dataset")
        datasets.append(open_dataset(root, token_dtype=token_dtype))
    check_compatible(mixture.names, datasets, str(p))
    return OpenedMixture(p, mixture, sha, datasets)


def tokenizer_identity(state: dict | None) -> dict:
    """What makes two tokenizer states the same tokenizer (not where it was read from)."""
    return {k: v for k, v in (state or {}).items() if k not in _LOCATION_KEYS}


def _format(ds: Dataset) -> dict:
    meta = ds.metadata or {}
    version = meta.get("format_version")  # 3 (episodes flagged "last reply only") batches as 1: the masks are stored
    out = {"kind": ds.kind, "format": meta.get("format"),
           "format_version": FORMAT_VERSION if version == LAST_REPLY_FORMAT_VERSION else version}
    if ds.kind == "packed":
        pk = ds.packing or {}
        out.update({k: pk.get(k) for k in ("block_size", "row_len", "pad_token_id")})
    return out


def check_compatible(names: list[str], datasets: list[Dataset], where: str) -> None:
    """Refuse members that cannot be batched together, naming both."""
    first, f0, t0 = names[0], _format(datasets[0]), tokenizer_identity(datasets[0].tokenizer_state)
    for name, ds in zip(names[1:], datasets[1:]):
        f = _format(ds)
        diff = [k for k in f0 if f0[k] != f[k]]
        if diff:
            k = diff[0]
            raise DatasetError(f"{where}: member {name!r} ({ds.root}) has {k} {f[k]!r} but member {first!r} "
                               f"({datasets[0].root}) has {f0[k]!r}; the members of a mixture must have the same "
                               f"format (all episodes, or all packed with the same --block-size and pad id): "
                               f"re-prepare or re-pack one of them")
        t = tokenizer_identity(ds.tokenizer_state)
        if t != t0:
            k = next(k for k in sorted(set(t) | set(t0)) if t.get(k) != t0.get(k))
            raise DatasetError(f"{where}: member {name!r} ({ds.root}) was made with another tokenizer than member "
                               f"{first!r} ({datasets[0].root}): its tokenizer_state.json differs at {k!r} "
                               f"({_short(t.get(k))} vs {_short(t0.get(k))}); the same ids would mean different "
                               f"text. Prepare both with the same --tokenizer (and --chat-template)")


def _short(v) -> str:
    s = repr(v)
    return s if len(s) <= 60 else s[:57] + "..."


def make_mixture(specs: list[tuple[str | None, str, float]], out: str | Path, *, by: str = "rows", seed: int = 1337,
                 overwrite: bool = False) -> tuple[Mixture, str]:
    """Write the mixture of ``specs`` (name or None for the folder's name, dataset path,
    weight) to ``out``; returns it and the file's sha256. Every member is opened and
    checked first, so a mixture that is written can be trained."""
    out = Path(out)
    refuse_link(out, "give the file it points to as --output, or remove the link")
    if out.is_dir():
        raise OutputExistsError(f"{out} is a folder; give a file name for the mixture (e.g. {out}.mix.json)")
    if out.exists() and not is_mixture_file(out):
        raise OutputExistsError(f"{out} exists and is not a mixture file (never replaced); choose another name")
    if out.exists() and not overwrite:
        raise OutputExistsError(f"{out} exists; give --overwrite to replace it")
    inside = dataset_holding(out)
    if inside is not None:
        raise UsageError(f"--output {out} is inside the dataset {inside}; write the mixture file elsewhere (a "
                         f"dataset folder holds only its own files), e.g. {inside.parent / out.name}")
    base = out.resolve().parent
    members, datasets = [], []
    for name, path, weight in specs:
        root = Path(path)
        if not root.is_dir():
            raise DatasetError(f"{root} is not a dataset folder (give the --output-dir of prepare-chat, "
                               f"prepare-tool or pack)")
        stored = os.path.relpath(root.resolve(), base)
        members.append(MixtureMember(name or root.resolve().name, stored, weight, metadata_checksum(root)))
        datasets.append(open_dataset(root))
    mixture = check_mixture(members, by, seed, str(out))
    check_compatible(mixture.names, datasets, str(out))
    data = dumps_json(mixture.as_dict())
    out.parent.mkdir(parents=True, exist_ok=True)
    _write_new(out, data)
    return mixture, hashlib.sha256(data).hexdigest()


def _write_new(out: Path, data: bytes) -> None:
    """Write ``out`` whole: a new file beside it (never over anything there, a link
    included), renamed over it (which replaces the name, never writes through a link)."""
    for _ in range(NAME_TRIES):
        tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}-{tag()}")
        try:
            with naming(tmp, f"while writing {out}"):
                create_file(tmp, data)
        except FileExistsError:
            continue
        os.replace(tmp, out)
        return
    raise OutputExistsError(f"no free name beside {out} for the new file after {NAME_TRIES} tries; remove the "
                            f".{out.name}.tmp-* files sftdata did not make")
