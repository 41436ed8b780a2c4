"""The mixture file on disk: writing it (``make_mixture``), telling it from a dataset
folder, and opening it with its members (``open_mixture``), refusing a member that
changed since the mixture was made or that cannot be trained beside the others.

The file's content is ``sftdata.mixture.Mixture``; its sha256 (of the file's bytes) is
what the loader's audit log and resumable state record.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson

from ..config import LoaderConfig
from ..errors import ConfigError, DatasetError, OutputExistsError
from ..mixture import MIXTURE_FORMAT, Mixture, MixtureMember, check_mixture, mixture_from_dict
from ..mixture_order import MemberItems, MixtureOrder
from ..order import eligible_ids
from ..sources import sha256_file
from .format import METADATA_FILE, dumps_json
from .reader import Dataset, open_dataset
from .shard import split_segments

MAX_MIXTURE_BYTES = 1 << 20  # a mixture file is small; a larger file is something else
# tokenizer_state keys that say where a tokenizer was read from, not which one it is
_LOCATION_KEYS = ("path", "source")


def is_mixture_file(path: str | Path) -> bool:
    """True when ``path`` is a file holding an sftdata mixture (its ``format``)."""
    p = Path(path)
    try:
        if not p.is_file() or p.stat().st_size > MAX_MIXTURE_BYTES:
            return False
        obj = orjson.loads(p.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return False
    return isinstance(obj, dict) and obj.get("format") == MIXTURE_FORMAT


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
        least ``min_tokens`` tokens; packed rows, all, with their real (unpadded) tokens."""
        out = []
        for ds in self.datasets:
            sp = ds.split(split)
            if ds.kind == "packed":
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
                        items="rows" if om.kind == "packed" else "episodes")


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
    out = {"kind": ds.kind, "format": meta.get("format"), "format_version": meta.get("format_version")}
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
    if out.is_dir():
        raise OutputExistsError(f"{out} is a folder; give a file name for the mixture (e.g. {out}.mix.json)")
    if out.exists() and not is_mixture_file(out):
        raise OutputExistsError(f"{out} exists and is not a mixture file (never replaced); choose another name")
    if out.exists() and not overwrite:
        raise OutputExistsError(f"{out} exists; give --overwrite to replace it")
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
    tmp = out.with_name(f".{out.name}.tmp{os.getpid()}")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp.write_bytes(data)
    os.replace(tmp, out)
    return mixture, hashlib.sha256(data).hexdigest()
