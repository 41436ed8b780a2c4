"""A prepare run's build key (``store.build_key``): planned before any input is read, to
find the target up to date (nothing is done) or to name what changed, then recorded in
the metadata from what was actually read.

Before the run each input is looked at (``sources.identity.look``: a stat, a URL's
version); only when the target records a build key are the inputs hashed, and an input
whose identity is the one recorded beside its sha256 is not read at all. Standard input
cannot be known before it is read, so a dataset made from it is never up to date.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..sources import Input, SourceInfo
from ..sources.identity import Looked, known_sha256, look, recordable
from ..sources.remote import url_protocol
from ..store.build_key import (
    BuildCheck,
    base_components,
    build_record,
    check_target,
    input_component,
    read_target,
    recorded_hashes,
    tokenizer_component,
)
from ..store.format import has_media

STDIN_NOTE = ("standard input (-) is read anew on every run, so a dataset made from it is never up to date (its "
              "content is known only once it has been read)")
MEDIA_NOTE = ("the dataset holds images or videos, whose files its build key does not cover (each is hashed only as "
              "it is read), so it is never up to date")


def eval_inputs(paths: Sequence[str]) -> list[Input]:
    """``--decontaminate`` files as inputs (their content is part of the key)."""
    return [Input(str(p), "url" if url_protocol(str(p)) else "file") for p in paths]


@dataclass
class PlannedBuild:
    """The inputs as looked at before the run, and the check of the target."""

    inputs: list[Input]
    looked: list[Looked]
    evals: list[Input]
    evals_looked: list[Looked]
    check: BuildCheck
    kind: str = "episodes"  # the build's kind in its key: "episodes" (prepare-chat/-tool), "pairs", "prompts"

    def record(self, infos: list[SourceInfo], state: dict, options: dict) -> dict:
        """The metadata's ``BUILD`` record, from the inputs as read (``infos``: their sha256)
        and each input's identity before and after the run."""
        inputs, identities = [], []
        for inp, info, before in zip(self.inputs, infos, self.looked):
            ident = None if inp.hub is not None else recordable(before, look(inp))  # the identity of what was read
            inputs.append(input_component(inp.given, info.sha256, ident if info.sha256 is None else None,
                                          inp.hub.commit if inp.hub is not None else None))
            if inp.kind != "stdin" and inp.hub is None:
                identities.append({"path": inp.name, "identity": ident})
        evals, recorded = [], recorded_hashes(self.check.target.metadata)
        for inp, before in zip(self.evals, self.evals_looked):
            sha, _ = known_sha256(inp, before, recorded.get(inp.name), self.check.target.written_ns)
            ident = recordable(before, look(inp))
            evals.append(input_component(inp.name, sha, ident))
            identities.append({"path": inp.name, "identity": ident})
        return build_record(components(inputs, evals, state, options, self.kind), identities)

    def planned(self, state: dict, options: dict) -> tuple[dict | None, str | None]:
        """The components of this run as far as they can be known before it (None, and why
        not), each input hashed unless its identity is the one recorded beside its sha256."""
        if any(i.kind == "stdin" for i in self.inputs):
            return None, STDIN_NOTE
        if has_media(self.check.target.metadata or {}):
            return None, MEDIA_NOTE
        recorded, written = recorded_hashes(self.check.target.metadata), self.check.target.written_ns
        inputs, evals = [], []
        for inp, looked in zip(self.inputs, self.looked):
            if inp.hub is not None:
                inputs.append(input_component(inp.given, None, commit=inp.hub.commit))
                continue
            sha, _ = known_sha256(inp, looked, recorded.get(inp.name), written)
            if sha is None and looked.identity is None:
                return None, (f"the input {inp.name} cannot be checked without reading it (a Parquet URL is read in "
                              f"part, and its store gives no version of it)")
            inputs.append(input_component(inp.name, sha, looked.identity))
        for inp, looked in zip(self.evals, self.evals_looked):
            sha, _ = known_sha256(inp, looked, recorded.get(inp.name), written)
            evals.append(input_component(inp.name, sha, looked.identity))
        return components(inputs, evals, state, options, self.kind), None


def components(inputs: list[dict], evals: list[dict], state: dict, options: dict, kind: str = "episodes") -> dict:
    """A prepare build's components (``store.build_key``); ``kind``: what the command builds."""
    out = {**base_components(kind), "inputs": inputs, "tokenizer": tokenizer_component(state),
           "options": options}
    return {**out, "evals": evals} if evals else out


def plan_build(output_dir, inputs: list[Input], eval_paths: Sequence[str], state: dict, options: dict,
               force: bool = False, kind: str = "episodes") -> PlannedBuild:
    """Look at the inputs and the target; hash the inputs only when the target records a
    build key to compare with. ``kind``: "episodes" (prepare-chat, prepare-tool), "pairs"
    (prepare-pref, KTO rows included) or "prompts" (prepare-rl)."""
    evals = eval_inputs(eval_paths)
    target = read_target(output_dir)
    plan = PlannedBuild(inputs, [look(i) for i in inputs], evals, [look(i) for i in evals], BuildCheck(None, target),
                       kind)
    plan.check = check_target(target, lambda: plan.planned(state, options), state, force)
    return plan

