"""A Hugging Face Hub model id as ``--tokenizer``: ``org/name`` or ``org/name@revision``,
resolved to a folder of the model's tokenizer files through ``huggingface_hub`` (the
``hf`` extra), from its cache first.

    >>> folder, hub = resolve_hub("Qwen/Qwen3-8B@main")
    >>> hub
    {'repo_id': 'Qwen/Qwen3-8B', 'revision': 'main', 'commit': 'b968826d...'}

Only the tokenizer's files are fetched (``HUB_FILES``: tokenizer.json, its configs, the chat
templates), never weights. The cache is ``HF_HUB_CACHE`` (huggingface_hub's default
otherwise). With ``HF_HUB_OFFLINE`` set, a model not in the cache is an error that names
the command downloading it. The commit the revision resolved to goes into
``tokenizer_state.json`` (``hub``), so a dataset names exactly the files it was made with.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from ..errors import TokenizerError

HUB_FILES = ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
             "chat_template.json", "additional_chat_templates/*.jinja", "chat_templates/*.jinja"]
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*(@[\w./-]+)?$")
_FILE_SUFFIXES = (".json", ".jinja", ".tiktoken", ".model", ".txt")
INSTALL_HINT = "pip install 'sftdata[hf]'"


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
