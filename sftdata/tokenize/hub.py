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
            raise TokenizerError(f"cannot fetch the tokenizer of the Hub model {repo}{at}: {type(e).__name__}: "
                                 f"{e}".rstrip()) from None
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
