"""verify --retokenize's drift check under a model's own chat template: the template is
learned again from the text tokenizer_state.json records, and a template engine that now
renders otherwise is caught."""

from __future__ import annotations

from sftdata.prepare import PrepareOptions, prepare
from sftdata.prepare.rerender import rerender_records
from sftdata.template import PRESETS, chat_template
from sftdata.verify import verify
from tests.helpers.data import chat, write_jsonl
from tests.helpers.templates import TOKENS, train_tokenizer


def test_a_template_dataset_renders_alike_until_the_template_engine_changes(tmp_path, monkeypatch):
    specials, bos, eos, extra = TOKENS["chatml"]
    folder = train_tokenizer(tmp_path / "tok", specials, bos, eos, extra, {"pad_token": "<|endoftext|>"})
    template = tmp_path / "chat.jinja"
    template.write_text(PRESETS["chatml"], encoding="utf-8")
    src = write_jsonl(tmp_path / "in.jsonl", [chat(f"Hello {i}!", f"It is 18C in Paris {i}.") for i in range(6)])
    prepare([src], tmp_path / "ds", PrepareOptions(tokenizer=str(folder), chat_template=str(template)))
    template.write_text("{{ 'another template now at this path' }}", encoding="utf-8")  # the recorded text is used
    r = verify(tmp_path / "ds", retokenize_episodes=6, rerender=rerender_records)
    assert r.ok and (r.drift["episodes"], r.drift["differ"]) == (6, 0), [str(p) for p in r.problems]
    real = chat_template.render

    def render(*args, **kw):  # the template engine now writes "Paris" as "paris"
        out = real(*args, **kw)
        return type(out)(**{**out.__dict__, "text": out.text.replace("Paris", "paris")})

    monkeypatch.setattr(chat_template, "render", render)
    r = verify(tmp_path / "ds", retokenize_episodes=6, rerender=rerender_records)
    assert [p.check for p in r.problems] == ["drift"] and r.drift["differ"] == 6
    assert r.problems[0].message.startswith(f"input record {src}:line 1 ")
