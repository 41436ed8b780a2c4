"""docs/INTEROP.md's examples run as written: the `sftdata` commands, then every Python block
(Trainer, SFTTrainer, a plain loop and its resume, reading the export), each section in its own
namespace, in a scratch folder holding the repo's sample_data/ and configs/."""

from __future__ import annotations

import os
import re
import shlex

import numpy as np
import orjson
import pytest
from typer.testing import CliRunner

from sftdata.cli import app
from sftdata.replay.dataset import replay_order
from tests.helpers.paths import ROOT

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("trl")
pytest.importorskip("datasets")
pytest.importorskip("pyarrow")
DOC = ROOT / "docs" / "INTEROP.md"
BLOCK = re.compile(r"^```(\w+)\n(.*?)^```", re.S | re.M)


def sections(text: str) -> list[tuple[str, list[tuple[str, str]]]]:
    """(heading, [(language, code), ...]) of every section from "## The examples" on."""
    text = text[text.index("## The examples"):]
    out = []
    for part in filter(None, re.split(r"^(?=##+ )", text, flags=re.M)):
        heading = part.splitlines()[0]
        out.append((heading, BLOCK.findall(part)))
    return out


def run_commands(code: str) -> None:
    for line in code.splitlines():
        words = shlex.split(line, comments=True)
        if not words:
            continue
        assert words[0] == "sftdata", line
        r = CliRunner().invoke(app, words[1:])
        assert r.exit_code == 0, (line, r.output)


@pytest.fixture(scope="module")
def namespaces(tmp_path_factory):
    work = tmp_path_factory.mktemp("docs")
    for name in ("sample_data", "configs"):
        (work / name).symlink_to(ROOT / name)
    old = os.getcwd()
    os.chdir(work)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    ran = {}
    try:
        for heading, blocks in sections(DOC.read_text(encoding="utf-8")):
            ns: dict = {"__name__": "__doc_example__"}
            for lang, code in blocks:
                if lang == "bash":
                    run_commands(code)
                elif lang == "python":
                    exec(compile(code, f"{DOC.name}: {heading}", "exec"), ns)  # noqa: S102
            ran[heading] = ns
    finally:
        os.chdir(old)
    return work, ran


def test_every_example_section_ran(namespaces):
    _, ran = namespaces
    headings = [h for h in ran if h.startswith("### ")]
    assert len(headings) == 4, headings
    assert ran["### `transformers.Trainer`, packed rows, padding-free, in sftdata's order"]["trainer"].state.global_step == 3
    ns = ran["### TRL `SFTTrainer` on the packed export, TRL's own collator"]
    assert ns["trainer"].state.global_step == 3 and ns["trainer"].data_collator.padding_free is True


def test_the_pairs_export_example_writes_trls_columns(namespaces):
    work, _ = namespaces
    first = orjson.loads((work / "exports/pref/train.jsonl").read_bytes().splitlines()[0])
    assert list(first) == ["row", "record", "prompt_ids", "chosen_ids", "rejected_ids", "chosen_mask", "rejected_mask"]


def test_the_trainer_example_trains_in_the_order_replay_order_lists(namespaces):
    work, ran = namespaces
    ns = ran["### `transformers.Trainer`, packed rows, padding-free, in sftdata's order"]
    sampler = ns["trainer"]._get_train_sampler()
    for step in range(3):
        rows = replay_order(work / "data/chat_sft_packed", ns["cfg"], step=step).columns
        assert sorted(set(rows["row"].tolist())) == sorted(sampler.step_ids(step).tolist())


def test_the_plain_loop_resumes_at_the_saved_step(namespaces):
    work, ran = namespaces
    ns = ran["### A plain PyTorch loop, episodes, resumable"]
    sampler, step = ns["sampler"], ns["step"]
    assert step == 8 and sampler.start_step == 8 and sampler.epoch == 1  # 31 episodes: 7 batches of 4 an epoch
    sampler.set_epoch(ns["epoch"])
    first = list(sampler)[:4]
    assert first == replay_order(work / "data/chat_sft", ns["cfg"], step=8).columns["episode"].tolist()
    batch = next(iter(ns["loader"]))
    want = ns["ds"][first[0]]["input_ids"]
    assert batch["input_ids"][0, :want.size].numpy().tolist() == want.tolist()
    assert np.isfinite(ns["loss"].item())
