"""Hugging Face Hub datasets pinned to a commit: ``hf://datasets/ORG/NAME@REV/PATH``.

A revision (a branch, a tag, or none: ``main``) moves; a commit does not. Every run
resolves each ``hf://datasets/`` argument's revision to the commit it names now (once per
repository and revision), reads the files at that commit (``@<commit>`` in the URL it
opens), and records both: the sources in the metadata say ``revision`` and ``commit``,
and the build key holds the commit, so a branch that moved rebuilds and one that did not
is up to date without a byte read. A revision that is already a commit (40 hex digits)
is used as it is, with no call to the Hub.

    >>> pin_hub_url("hf://datasets/org/chats@main/train.jsonl")
    ('hf://datasets/org/chats@3f9a.../train.jsonl', HubPin(repo='org/chats', revision='main', commit='3f9a...'))
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import unquote

from ..errors import InputError
from ..util.urls import EXTRA

HUB_URL = re.compile(r"^hf://datasets/(?P<repo>[^/@]+/[^/@]+)(?:@(?P<rev>[^/]*))?(?P<rest>/.*)?$")
COMMIT = re.compile(r"^[0-9a-f]{40}$")
DEFAULT_REVISION = "main"


@dataclass(frozen=True)
class HubPin:
    """A Hub dataset's revision as asked (``revision``: as written in the URL, "" for none)
    and the commit it resolved to."""

    repo: str  # ORG/NAME
    revision: str
    commit: str

    def given(self, url: str) -> str:
        """``url`` (pinned to the commit) as the user named it: with the revision asked."""
        return url.replace(f"@{self.commit}", f"@{self.revision}" if self.revision else "", 1)

    def as_dict(self) -> dict:
        return {"revision": self.revision or DEFAULT_REVISION, "commit": self.commit}


def hub_commit(repo: str, revision: str) -> str:
    """The commit ``revision`` of dataset ``repo`` names now, asked of the Hub
    (``huggingface_hub``, the ``cloud`` extra)."""
    try:
        from huggingface_hub import HfApi
    except ImportError:
        raise InputError(f"hf://datasets/{repo}: reading Hub datasets needs huggingface_hub: pip install "
                         f"'sftdata[{EXTRA}]' (or pip install huggingface_hub)") from None
    try:
        sha = HfApi().dataset_info(repo, revision=revision).sha
    except Exception as e:
        raise InputError(f"hf://datasets/{repo}@{revision}: the revision cannot be resolved to a commit "
                         f"({type(e).__name__}: {e}); check the dataset's name and revision and the network, or "
                         f"name the commit itself (@ and its 40 hex digits)") from None
    if not isinstance(sha, str) or not COMMIT.match(sha):
        raise InputError(f"hf://datasets/{repo}@{revision}: the Hub answered {sha!r}, not a commit")
    return sha


def pin_hub_url(url: str, resolved: dict[tuple[str, str], str] | None = None) -> tuple[str, HubPin] | None:
    """``url`` pinned to the commit its revision names now, and the pin; None for a URL that
    is not an ``hf://datasets/`` one. ``resolved``: commits already asked for in this run,
    by (repo, revision), filled as it goes."""
    m = HUB_URL.match(url)
    if m is None:
        return None
    repo, rev, rest = m.group("repo"), m.group("rev") or "", m.group("rest") or ""
    wanted = unquote(rev) or DEFAULT_REVISION  # a branch with a slash is written %2F in the URL
    if COMMIT.match(wanted):
        commit = wanted
    else:
        cache = resolved if resolved is not None else {}
        if (repo, wanted) not in cache:
            cache[(repo, wanted)] = hub_commit(repo, wanted)
        commit = cache[(repo, wanted)]
    return f"hf://datasets/{repo}@{commit}{rest}", HubPin(repo, rev, commit)
