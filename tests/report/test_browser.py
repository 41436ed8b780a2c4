"""The report as a person sees it: the page opened in headless Chromium (the Debian
package, driven by playwright) loads with no console error, draws every plot, highlights
exactly each sample episode's trained tokens, explains a token on hover, and is saved as
a screenshot. Skipped, saying why, where playwright or Chromium is missing.

Set SFTDATA_SCREENSHOTS=DIR to keep the screenshots."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest

from sftdata.chat.tokenizer import recorded_tokenizer
from sftdata.pack import PackOptions, pack
from sftdata.prepare import PrepareOptions, prepare
from sftdata.report import write_report
from sftdata.store import open_dataset
from tests.helpers.paths import ROOT
from tests.helpers.processes import SAFETY_S

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or "/usr/bin/chromium"
# no network on CI machines: nothing in the background may try to connect out
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]

pytest.importorskip("plotly", reason="the report extra (plotly) is not installed: pip install 'sftdata[report]'")
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (it is in the test extra: "
                                                             "pip install -e '.[test]')")
if not Path(CHROMIUM).is_file():
    pytest.skip(f"no Chromium at {CHROMIUM}: install the Debian package (apt-get install -y chromium)",
                allow_module_level=True)


@pytest.fixture(scope="module")
def browser():
    # the driver makes Chromium's profile, and Chromium its SingletonSocket, under TMPDIR: the
    # session's short temp folder when TMPDIR is too long for a Unix socket (tests/conftest.py)
    with pytest.MonkeyPatch.context() as env:
        env.setenv("TMPDIR", tempfile.gettempdir())
        p = sync_api.sync_playwright().start()
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)  # a fresh profile of its own
    try:
        yield b
    finally:
        b.close()
        p.stop()


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("browser")
    chat = tmp / "chat_sft"
    prepare([ROOT / "sample_data/chat.jsonl"], chat, PrepareOptions(val_split=0.1, workers=1))
    packed = tmp / "chat_sft_packed"
    pack(chat, packed, PackOptions(block_size=128))
    return chat, packed


def open_page(browser, path: Path, shot: Path):
    """The page, once every plot is drawn, and the console errors it logged."""
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    errors: list[str] = []
    page.on("console", lambda m: errors.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
    page.on("request", lambda r: errors.append(f"request: {r.url}") if not r.url.startswith(("file:", "data:"))
            else None)
    page.goto(path.as_uri())
    page.wait_for_selector("body[data-ready='1']", timeout=SAFETY_S * 1000)  # a safety net: it fails
    page.screenshot(path=str(shot), full_page=True)
    keep = os.environ.get("SFTDATA_SCREENSHOTS")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(keep) / shot.name)
    return page, errors


def check_plots(page, count: int) -> None:
    sizes = page.eval_on_selector_all(".plot[data-figure]", """divs => divs.map(d => {
        const svg = d.querySelector('.main-svg'); const r = svg ? svg.getBoundingClientRect() : null;
        return [d.dataset.figure, r ? r.width : 0, r ? r.height : 0,
                d.querySelectorAll('.bars .point, .scatterlayer .trace').length];
    })""")
    assert len(sizes) == count
    for name, w, h, marks in sizes:
        assert w > 300 and h > 150 and marks > 0, (name, w, h, marks)


def trained_text(ids, mask, tok) -> str:
    m = np.concatenate([[0], np.asarray(mask) != 0, [0]]).astype(np.int8)
    starts, ends = np.flatnonzero(np.diff(m) == 1), np.flatnonzero(np.diff(m) == -1)
    return "".join(tok.decode(np.asarray(ids)[a:b].tolist()) for a, b in zip(starts, ends))


def test_episodes_page(browser, datasets, tmp_path):
    chat, _ = datasets
    summary = write_report(chat, tmp_path / "report.html", sample=5, episodes=[2], block_size=64)
    page, errors = open_page(browser, tmp_path / "report.html", tmp_path / "report.png")
    assert errors == []
    assert (tmp_path / "report.png").stat().st_size > 10_000
    check_plots(page, summary.plots)
    ds = open_dataset(chat)
    tok, sp = recorded_tokenizer(ds.root, ds.tokenizer_state), ds.split("train")
    shown = page.eval_on_selector_all("details.sample", """ds => ds.map(d => [Number(d.dataset.episode),
        Array.from(d.querySelectorAll('.run.t')).map(e => e.textContent).join('')])""")
    assert [e for e, _ in shown] == [s["episode"] for s in summary.samples] and shown[0][0] == 2
    for episode, text in shown:
        ids, mask = sp.episode(episode)
        assert text == trained_text(ids, mask, tok) and text
    first = page.locator("details.sample .run.t .k").first
    first.hover()
    tip = page.locator("#tip")
    assert tip.is_visible()
    assert f"id {first.get_attribute('data-i')}" in tip.inner_text() and "trained (mask 1)" in tip.inner_text()
    swatch = page.locator(".legend .k").first  # the legend's marker swatch: a .k with no ids (was a TypeError)
    swatch.hover()
    assert swatch.inner_text() == "<|USER|>" and not tip.is_visible()
    assert errors == []


def test_packed_page(browser, datasets, tmp_path):
    _, packed = datasets
    summary = write_report(packed, tmp_path / "packed.html", sample=2, rows=[0])
    page, errors = open_page(browser, tmp_path / "packed.html", tmp_path / "packed.png")
    assert errors == []
    check_plots(page, summary.plots)
    row0 = page.locator("details.sample[data-row='0']")
    segments = row0.locator(".segment")
    assert segments.count() >= 2 and row0.locator(".boundary").count() == segments.count() - 1
    assert segments.first.bounding_box()["height"] > 20
