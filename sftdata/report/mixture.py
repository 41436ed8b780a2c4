"""What ``sftdata inspect MIX`` shows: each member's realized items and tokens per epoch
against its weight (the order the loader follows: ``sftdata.store.mixture.mixture_order``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..errors import UsageError
from ..order.config import LoaderConfig
from ..store.mixture import member_root, mixture_order, open_mixture


@dataclass
class MemberEpoch:
    epoch: int
    items: int  # episodes (packed: rows) the member contributes to the epoch
    tokens: int  # their tokens (packed: real tokens of the rows)
    items_share: float  # of the epoch's items
    tokens_share: float  # of the epoch's tokens


@dataclass
class MemberFigures:
    name: str
    path: str  # the member's folder
    weight: float
    share: float  # the normalised weight: the target share of rows or tokens
    eligible: int  # eligible items in the split
    tokens: int  # their tokens
    epochs: list[MemberEpoch] = field(default_factory=list)


@dataclass
class MixtureOverview:
    path: str
    sha256: str
    by: str
    seed: int
    kind: str
    split: str
    episode_min_tokens: int
    members: list[MemberFigures]
    epoch_items: list[int]  # items of each epoch shown

    def as_dict(self) -> dict:
        return asdict(self)


def mixture_overview(path: str | Path, *, split: str = "train", epochs: int = 3,
                     cfg: LoaderConfig | None = None) -> MixtureOverview:
    """Each member's items and tokens in epochs ``0 .. epochs - 1`` of ``split``."""
    if epochs < 1:
        raise UsageError(f"--epochs must be >= 1, got {epochs}")
    cfg = cfg or LoaderConfig()
    om = open_mixture(path, token_dtype=cfg.token_dtype)
    if split not in om.splits:
        raise UsageError(f"split {split!r} is not in every member of {path} (common splits: "
                         f"{', '.join(om.splits) or 'none'})")
    cfg = cfg.replace(epoch_seed=om.mixture.seed, epoch_drop_last=False)
    o = mixture_order(cfg, om, split)
    shares = om.mixture.shares()
    members = [MemberFigures(m.name, str(member_root(om.path, m)), m.weight, float(s), int(it.ids.shape[0]),
                             int(it.tokens.sum()))
               for m, s, it in zip(om.mixture.members, shares, o.members)]
    sizes = []
    for e in range(epochs):
        got = o.realized(e)
        n, t = sum(c for c, _ in got), sum(k for _, k in got)
        sizes.append(n)
        for mf, (c, k) in zip(members, got):
            mf.epochs.append(MemberEpoch(e, c, k, c / n if n else 0.0, k / t if t else 0.0))
    return MixtureOverview(str(path), om.sha256, om.mixture.by, om.mixture.seed, om.kind, split,
                           cfg.episode_min_tokens, members, sizes)
