"""``make_loader(cfg, dataset_dir)``: the loader of a dataset folder, its source detected."""

from __future__ import annotations

from pathlib import Path

from ..errors import ConfigError, DatasetError
from ..order.audit import AuditLog
from ..order.config import LoaderConfig
from ..storage import METADATA_FILE, read_json
from ..storage.location import dataset_path
from ..store.format import TOKENIZER_FILE, is_mixture_file
from ..store.reader import has_episode_index, open_dataset, open_token_stream, require_row_kind
from .batch import resolve_backend, resolve_rank
from .guards import check_value_ranges
from .loader import Loader
from .windows import WindowSource


def detect_mode(dataset_dir: str | Path) -> str:
    """``sft_episode`` when ``train/shard_*/episodes.idx`` or ``train/episodes.idx``
    exists, else ``token_stream``. A packed dataset has an episode index too (of its
    rows): ``make_loader`` reads it as packed rows."""
    return "sft_episode" if has_episode_index(dataset_dir, "train") else "token_stream"


def make_loader(cfg: LoaderConfig | dict, dataset_dir: str | Path, *, backend: str = "auto", device: str = "cpu",
                rank: int | None = None, world_size: int | None = None,
                audit_dir: str | Path | None = None, tokenizer: str | Path | None = None) -> Loader:
    """The ``Loader`` of ``dataset_dir``: ``dataset_mode`` from ``cfg``, else detected;
    a packed dataset gives packed rows; a mixture file (``sftdata mix``) its members at
    their weights (docs/MIXTURES.md).

    ``backend``: ``auto`` (torch tensors on ``device`` if torch is installed, else numpy),
    ``numpy`` or ``torch``. ``rank`` / ``world_size`` default from torch.distributed (when
    initialised) or RANK / WORLD_SIZE. ``audit_dir`` (or ``cfg.audit_dir``): where rank 0
    writes ``audit_*.log``. A structurally broken dataset is refused with the message of
    ``sftdata verify``; so is one with nothing to train on, ids past the vocabulary or
    mask values other than 0/1 (``guards``), and a batch that cannot fit in memory.

    ``tokenizer``: the model's tokenizer (a folder, a tokenizer.json, a tiktoken name or
    a Hub model id); a dataset made with another (its vocabulary, special ids or chat
    template differ) is refused naming both tokenizers' sha256 (``check_tokenizer``).
    Its files are read, no tokenizer library is loaded. None: no check.
    """
    if isinstance(cfg, dict):
        cfg = LoaderConfig.from_dict(cfg)
    if not isinstance(cfg, LoaderConfig):
        raise ConfigError(f"make_loader needs a LoaderConfig (or a dict), got {type(cfg).__name__}")
    mixture = is_mixture_file(dataset_dir)
    if mixture:
        from ..store.mixture import open_mixture  # lazy: the mixture code loads only for a mixture file

        data = open_mixture(dataset_dir, token_dtype=cfg.token_dtype)
    else:
        root = dataset_path(dataset_dir)  # a path, a file:// URL, or an object-store URL (fetched into the cache)
        if not root.is_dir():
            raise DatasetError(f"dataset folder {root} does not exist; create it with "
                               f"`sftdata prepare-chat ... --output-dir {root}`")
    backend = resolve_backend(backend)
    rank, world_size = resolve_rank(rank, world_size)
    if not mixture and (cfg.dataset_mode or detect_mode(root)) == "token_stream":
        state = read_json(root / TOKENIZER_FILE) if (root / TOKENIZER_FILE).is_file() else None
        meta = read_json(root / METADATA_FILE) if (root / METADATA_FILE).is_file() else None
        check_value_ranges(root, meta, state, mask=False)
        if tokenizer is not None:
            check_tokenizer(root, meta, state, tokenizer)
        data = WindowSource(cfg, _token_arrays(root, cfg), world_size, root=root, tokenizer_state=state)
    elif not mixture:
        if not has_episode_index(root, "train"):
            raise DatasetError(f"dataset_mode=sft_episode needs an episode index, but {root} has neither "
                               f"train/shard_*/episodes.idx nor train/episodes.idx; prepare the dataset with "
                               f"`sftdata prepare-chat`, or set dataset_mode=token_stream")
        data = open_dataset(root, token_dtype=cfg.token_dtype)  # refuses a structurally broken dataset
    if tokenizer is not None and not isinstance(data, WindowSource):  # a mixture: each member
        for ds in data.datasets if mixture else [data]:
            check_tokenizer(ds.root, ds.metadata, ds.tokenizer_state, tokenizer)
    adir = audit_dir if audit_dir is not None else cfg.audit_dir
    audit = AuditLog(adir) if adir is not None and rank == 0 else None
    return Loader(cfg, data, backend=backend, device=device, rank=rank, world_size=world_size, audit=audit)


def check_tokenizer(root, metadata: dict | None, tokenizer_state: dict | None, tokenizer: str | Path) -> None:
    """Refuse the dataset at ``root`` unless it was made with the model's ``tokenizer``
    (``tokenize.identity.check_same_tokenizer``: file hashes, no tokenizer library)."""
    from ..tokenize.identity import check_same_tokenizer  # lazy: loaded only when a tokenizer is given

    check_same_tokenizer(root, metadata, tokenizer_state, tokenizer)


def _token_arrays(root: Path, cfg: LoaderConfig) -> dict:
    """The token arrays of train (required) and val (when there is one)."""
    splits = {}
    for split in ("train", "val"):
        try:
            splits[split] = open_token_stream(root, split, token_dtype=cfg.token_dtype)
        except DatasetError:
            if split == "train":
                raise
    return splits


def make_pair_loader(cfg: LoaderConfig | dict, dataset_dir: str | Path, *, padding_free: bool = False,
                     backend: str = "auto", device: str = "cpu", rank: int | None = None,
                     world_size: int | None = None, audit_dir: str | Path | None = None,
                     tokenizer: str | Path | None = None) -> Loader:
    """The ``Loader`` of a dataset of preference pairs, KTO rows or RL prompts (``sftdata
    prepare-pref`` / ``prepare-rl``): ``get_batch`` returns a ``PairBatch`` (docs/LOADER.md,
    "Pairs, KTO rows and RL prompts"). The order, resume state, audit log and ranks are
    those of ``make_loader`` over row ids; ``padding_free`` gives one row per batch with
    ``cu_seqlens`` instead of padded rows. A mixture file (``sftdata mix`` of pairs
    datasets) gives its members at their weights (padded rows; ``PairBatch.members`` says
    whose each row is). Other arguments as ``make_loader``."""
    if isinstance(cfg, dict):
        cfg = LoaderConfig.from_dict(cfg)
    if not isinstance(cfg, LoaderConfig):
        raise ConfigError(f"make_pair_loader needs a LoaderConfig (or a dict), got {type(cfg).__name__}")
    backend = resolve_backend(backend)
    rank, world_size = resolve_rank(rank, world_size)
    from .pairs import PairSource  # lazy: an SFT training process never loads the pair code

    mixture = is_mixture_file(dataset_dir)
    if mixture:
        from ..store.mixture import open_mixture  # lazy: the mixture code loads only for a mixture file
        from .mixture import PairMixtureSource, mixture_config  # lazy: the mixture code loads only for a mixture

        om = open_mixture(dataset_dir, token_dtype=cfg.token_dtype)
        datasets = om.datasets
        for ds in datasets:
            require_row_kind(ds, "make_pair_loader")
        cfg = mixture_config(cfg, om)  # the mixture file fixes the seed
    else:
        root = dataset_path(dataset_dir)  # a path, a file:// URL, or an object-store URL (fetched into the cache)
        if not root.is_dir():
            raise DatasetError(f"dataset folder {root} does not exist; create it with "
                               f"`sftdata prepare-pref ... --output-dir {root}`")
        datasets = [open_dataset(root, token_dtype=cfg.token_dtype)]
    for ds in datasets:
        if tokenizer is not None:
            check_tokenizer(ds.root, ds.metadata, ds.tokenizer_state, tokenizer)
        check_value_ranges(ds.root, ds.metadata, ds.tokenizer_state)
    source = (PairMixtureSource(cfg, om, world_size, padding_free=padding_free) if mixture
              else PairSource(cfg, datasets[0], world_size, padding_free=padding_free))
    adir = audit_dir if audit_dir is not None else cfg.audit_dir
    audit = AuditLog(adir) if adir is not None and rank == 0 else None
    return Loader(cfg, source, backend=backend, device=device, rank=rank, world_size=world_size, audit=audit)
