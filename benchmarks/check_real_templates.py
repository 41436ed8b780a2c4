#!/usr/bin/env python3
"""Real data under real templates, as a user runs it: ``prepare-chat`` / ``prepare-tool``
(the CLI, one process per file) with model folders built from the template zoo
(tests/helpers/zoo.py) or given, over the public files of ../shared/data; then every kept
episode is compared with transformers' ``apply_chat_template`` of its record.

    python benchmarks/check_real_templates.py [--data DIR] [--models qwen3,llama-3.1,...]
                                              [--model NAME=FOLDER ...] [--out DIR] [--json]

The reference is built here, from the file's own record, independently of sftdata's
readers: what a transformers user passes (ShareGPT ``from``/``value`` and glaive's
``function_call``/``observation`` turned into OpenAI messages, a call-only message given
``content: ""``, each tool result the name of the call it answers, a bare function schema
wrapped as ``{"type": "function", "function": ...}``, null values dropped, arguments as the
template takes them: ``tool_arguments`` in the dataset's tokenizer_state.json). A record
sftdata repaired is compared with the same record repaired here, by the documented rule,
one step at a time (trailing non-assistant and empty turns dropped, then same-role turns
merged, then a leading assistant turn dropped): the first reference that equals the
episode names the repair. A kept episode equal to none of them is a difference.

For each kept episode the trained tokens are checked too: one trained run per assistant
reply that answers someone (a reply before any user turn or tool result is never trained;
per episode when the record is served one reply per episode), each ending with an
end-of-turn id of the stored rule, holding the reply's text and each call's name; and
``sftdata verify`` runs on each dataset.

Per (template, file): records read, kept, rejected by reason, repairs, and the comparison.
The zoo's folders name no pad token (their pad is the EOS, which some templates end turns
with), so every run passes ``--allow-pad-as-stop``: it changes no token, only what the
loader pads with.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ["TOKENIZERS_PARALLELISM"] = "false"

import argparse  # noqa: E402
import copy  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from collections import Counter  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from sftdata.store import open_dataset  # noqa: E402

CHAT_FILES = ("kto_en_demo.json", "dummy_conversation.json")
TOOL_FILES = ("glaive_toolcall_en_demo.json", "datagen-ToolUse-FineTuneSupervised-valid.jsonl",
              "stock_toolcall_validation.jsonl")
MODELS = ("qwen3", "llama-3.1", "gemma-2", "gemma-4", "mistral-small-3.2", "mistral-nemo", "glm-4.6", "gpt-oss",
          "deepseek-v3.1")
ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system",
         "function_call": "assistant", "observation": "tool", "tool": "tool", "function": "tool"}


def read_file(path: Path) -> list[dict]:
    text = path.read_text(encoding="utf-8")
    return json.loads(text) if text.lstrip().startswith("[") else [json.loads(x) for x in text.splitlines() if x.strip()]


# ---------------------------------------------------------------- the reference messages

def _args(raw, style: str):
    if style == "dict":
        return json.loads(raw) if isinstance(raw, str) else raw
    return raw if isinstance(raw, str) else json.dumps(raw, ensure_ascii=False)


def reference(record: dict, style: str) -> tuple[list[dict], list | None, dict]:
    """(messages, tools, chat_template_kwargs) as a transformers user passes them."""
    tools = record.get("tools")
    if isinstance(tools, str):
        tools = json.loads(tools) if tools.strip() else None
    if tools:
        tools = [t if isinstance(t, dict) and "function" in t else {"type": "function", "function": t} for t in tools]
    else:
        tools = None
    msgs: list[dict] = []
    if "messages" in record:
        src = copy.deepcopy(record["messages"])
    else:
        src = []
        if record.get("system"):
            src.append({"role": "system", "content": record["system"]})
        for m in record["conversations"]:
            role = ROLES[m["from"]]
            if m["from"] == "function_call":
                fn = json.loads(m["value"])
                fns = fn if isinstance(fn, list) else [fn]
                src.append({"role": "assistant", "content": "", "tool_calls": [
                    {"type": "function", "function": {"name": f["name"], "arguments": f.get("arguments", {})}}
                    for f in fns]})
            else:
                src.append({"role": role, "content": m["value"]})
    pending: list[tuple] = []
    for m in src:
        m = {k: v for k, v in m.items() if v is not None and k not in ("weight", "train")}
        if m["role"] == "assistant" and "tool_calls" in m:
            m.setdefault("content", "")
            for c in m["tool_calls"]:
                c["function"]["arguments"] = _args(c["function"]["arguments"], style)
                pending.append((c.get("id"), c["function"]["name"]))
        if m["role"] == "tool" and "name" not in m and pending:
            at = next((i for i, (cid, _) in enumerate(pending) if cid and cid == m.get("tool_call_id")), 0)
            m["name"] = pending.pop(at)[1]
        msgs.append(m)
    return msgs, tools, record.get("chat_template_kwargs") or {}


def _empty(m: dict) -> bool:
    return m["role"] != "tool" and not (m.get("content") or "").strip() and not m.get("tool_calls")


def candidates(msgs: list[dict]):
    """The record as given, then repaired one documented step at a time: (name, messages)."""
    yield "as given", msgs
    last = max((i for i, m in enumerate(msgs) if m["role"] == "assistant"), default=-1)
    cut = [m for m in msgs[:last + 1] if not _empty(m)]
    yield "trailing/empty turns dropped", cut
    merged: list[dict] = []
    for m in cut:
        p = merged[-1] if merged else None
        if p and p["role"] == m["role"] and m["role"] in ("user", "assistant") and not p.get("tool_calls"):
            a, b = p.get("content") or "", m.get("content") or ""
            p = dict(p, content=a + "\n\n" + b if a and b else a or b)
            if m.get("tool_calls"):
                p["tool_calls"] = m["tool_calls"]
            merged[-1] = p
        else:
            merged.append(dict(m))
    yield "merged same-role turns", merged
    first = next((i for i, m in enumerate(merged) if m["role"] in ("user", "tool")), 0)
    lead = [m for i, m in enumerate(merged) if not (i < first and m["role"] == "assistant")]
    yield "leading assistant dropped", lead


# ---------------------------------------------------------------- one model, one file

def hf_ids(hf, msgs, tools, variables) -> list[int] | None:
    try:
        return list(hf.apply_chat_template(msgs, tools=tools, tokenize=True, return_dict=False, **variables))
    except Exception:  # noqa: BLE001 - the template's own errors, as transformers raises them
        return None


def check(folder: Path, data: Path, out: Path, command: str, hf, extra: list[str]) -> dict:
    """Run the CLI, then compare every kept episode with transformers' render of its record."""
    cmd = [sys.executable, "-m", "sftdata", command, str(data), "-o", str(out), "--tokenizer", str(folder),
           "--force", "--json", "--allow-pad-as-stop", *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    row: dict = {"file": data.name, "command": command}
    if proc.returncode != 0:
        row["refused"] = (proc.stderr.strip().splitlines() or ["?"])[-1][:300]
        return row
    meta = json.loads((out / "dataset_metadata.json").read_text())
    state = json.loads((out / "tokenizer_state.json").read_text())
    style = state.get("tool_arguments", {}).get("style", "dict")
    rule = state["mask_rule"]
    end_ids = set(rule["end_ids"])
    variables = dict(state["chat_template"].get("variables") or {})
    stop = state["chat_template"].get("appended_stop")
    stop_id = None
    if stop:
        stop_id = hf.convert_tokens_to_ids(stop)
    counts = meta["counts"]
    rejects = Counter(json.loads(x)["reason"] for x in (out / "rejects.jsonl").read_text().splitlines() if x.strip())
    row.update(read=counts["records_read"], episodes=counts["episodes"], rejected=dict(sorted(rejects.items())),
               repaired=dict(sorted(counts.get("repaired", {}).items())),
               reasoning_ignored=counts["turns"].get("reasoning_ignored_by_template", 0),
               per_reply_records=counts.get("per_reply_records", 0))
    records = read_file(data)
    split = open_dataset(out).split("train")
    by_record: dict[int, list[int]] = {}
    for i, r in enumerate(split.sources.tolist()):
        by_record.setdefault(r, []).append(i)
    row["kept"] = len(by_record)
    matched: Counter = Counter()
    differ: list[str] = []
    mask_bad: list[str] = []
    stopped = 0
    for r, eps in sorted(by_record.items()):
        record = records[r]
        msgs, tools, kwargs = reference(record, style)
        v = {**variables, **kwargs}
        got = [(np.asarray(split.episode(i)[0]).tolist(), np.asarray(split.episode(i)[1]).astype(bool)) for i in eps]
        hit = None
        for name, cand in candidates(msgs):
            asst = [k for k, m in enumerate(cand) if m["role"] == "assistant"]
            prefixes = [cand] if len(eps) == 1 else [cand[:k + 1] for k in asst]
            if len(prefixes) != len(eps):
                continue
            refs = [hf_ids(hf, p, tools, v) for p in prefixes]
            if any(x is None for x in refs):
                continue
            ok, st = True, 0
            for (ids, _), ref in zip(got, refs):
                if ids == ref:
                    continue
                if stop_id is not None and ids == ref + [stop_id]:
                    st += 1
                    continue
                ok = False
                break
            if ok:
                hit = (name, cand, prefixes)
                stopped += st
                break
        if hit is None:
            differ.append(f"record {r}")
            continue
        matched[hit[0]] += 1
        name, cand, prefixes = hit
        for (ids, mask), p in zip(got, prefixes):
            asked = next((i for i, m in enumerate(p) if m["role"] in ("user", "tool")), len(p))
            # a reply before any user turn or tool result answers no one: never trained (issue 41)
            trained = [m for m in p[asked:] if m["role"] == "assistant"] if len(eps) == 1 else [p[-1]]
            edges = np.flatnonzero(np.diff(np.concatenate([[0], mask.astype(np.int8), [0]]))).reshape(-1, 2)
            problem = None
            if len(edges) != len(trained):
                problem = f"{len(edges)} trained runs for {len(trained)} replies"
            else:
                for (a, b), m in zip(edges, trained):
                    text = hf.decode(ids[a:b])
                    if ids[b - 1] not in end_ids and not (stop_id is not None and ids[b - 1] == stop_id):
                        problem = "a trained run does not end with an end-of-turn id"
                    elif (m.get("content") or "").strip() and m["content"].strip() not in text \
                            and json.dumps(m["content"].strip())[1:-1] not in text:
                        problem = "a reply's text is not in its trained run"
                    elif any(c["function"]["name"] not in text for c in m.get("tool_calls", ())):
                        problem = "a call's name is not in its trained run"
                    if problem:
                        break
            if problem:
                mask_bad.append(f"record {r}: {problem}")
    verified = subprocess.run([sys.executable, "-m", "sftdata", "verify", str(out)], capture_output=True, text=True,
                              cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    row.update(identical=sum(matched.values()), identical_as=dict(matched), differ=len(differ),
               differ_first=differ[:5], appended_stop=stopped, mask_problems=len(mask_bad),
               mask_first=mask_bad[:5], verify="OK" if verified.returncode == 0 else
               (verified.stdout.strip().splitlines() or ["failed"])[-1][:200])
    return row


def model_folders(names: list[str], given: dict[str, str], tmp: Path) -> dict[str, tuple[Path, list[str]]]:
    """Each model's folder and the --template-var options its zoo entry needs."""
    from tests.helpers.zoo import zoo_model  # lazy: only for zoo names (imports pytest)

    out = {}
    for name in names:
        if name in given:
            out[name] = (Path(given[name]), [])
            continue
        model = zoo_model(tmp, name)
        opts = [x for k, v in model.entry.variables.items() for x in ("--template-var", f"{k}={json.dumps(v)}")]
        out[name] = (model.folder, opts)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=str(ROOT.parent / "shared" / "data"), help="folder of the real files")
    ap.add_argument("--models", default=",".join(MODELS), help="zoo template names (tests/helpers/zoo.py)")
    ap.add_argument("--model", action="append", default=[], help="NAME=FOLDER: a model folder of your own")
    ap.add_argument("--files", default=",".join(CHAT_FILES + TOOL_FILES), help="file names in --data")
    ap.add_argument("--out", default=str(HERE / "_work" / "real_templates"), help="where the datasets go")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    import transformers

    given = dict(x.split("=", 1) for x in a.model)
    names = [n for n in a.models.split(",") if n] + [n for n in given if n not in a.models.split(",")]
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    folders = model_folders(names, given, out / "models")
    rows = []
    for name, (folder, extra) in folders.items():
        hf = transformers.AutoTokenizer.from_pretrained(str(folder))
        for f in a.files.split(","):
            command = "prepare-tool" if f in TOOL_FILES else "prepare-chat"
            row = {"model": name, **check(folder, Path(a.data) / f, out / f"{name}__{f}", command, hf, extra)}
            rows.append(row)
            print(json.dumps(row, ensure_ascii=False) if a.json else
                  f"{name:18} {f:48} " + ("REFUSED " + row["refused"] if "refused" in row else
                  f"read {row['read']} kept {row['kept']} identical {row['identical']} differ {row['differ']} "
                  f"verify {row['verify']} "
                  f"mask {row['mask_problems']} rejected {row['rejected']} repaired {row['repaired']} "
                  f"as {row['identical_as']} stop {row['appended_stop']} ignored {row['reasoning_ignored']} "
                  f"per-reply {row['per_reply_records']} {row['differ_first'] or ''} {row['mask_first'] or ''}"),
                  flush=True)


if __name__ == "__main__":
    main()
