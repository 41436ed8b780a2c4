"""A generated chat corpus for benchmarks: deterministic, realistic shapes.

Multi-turn conversations (1-6 pairs, a system prompt in 40%), message lengths drawn
from a lognormal, text built from English words, numbers, punctuation and some code.
"""

from __future__ import annotations

import random
from pathlib import Path

import orjson

WORDS = (
    "the of and to in is you that it he was for on are as with his they at be this have from or one had by "
    "word but not what all were we when your can said there use an each which she do how their if will up "
    "other about out many then them these so some her would make like him into time has look two more write "
    "go see number no way could people my than first water been call who oil its now find long down day did "
    "get come made may part model training data loss mask token assistant user system function result value "
    "error file line question answer because however therefore example python numpy array tensor batch"
).split()
CODE = [
    "def f(x):\n    return x * 2\n",
    "for i in range(10):\n    print(i)\n",
    "SELECT name, count(*) FROM users GROUP BY name;",
    "import numpy as np\na = np.zeros((3, 4))\n",
]


def _text(rng: random.Random, mean_words: float) -> str:
    n = max(1, int(rng.lognormvariate(0, 0.8) * mean_words))
    out = []
    for i in range(n):
        r = rng.random()
        if r < 0.04:
            out.append(str(rng.randint(0, 100000)))
        elif r < 0.05:
            out.append("\n" + rng.choice(CODE))
        else:
            w = rng.choice(WORDS)
            out.append(w.capitalize() if i == 0 or r > 0.97 else w)
        if rng.random() < 0.08:
            out[-1] += rng.choice([",", ".", "?", "!", ":"])
    return " ".join(out)


def conversation(rng: random.Random) -> dict:
    msgs = []
    if rng.random() < 0.4:
        msgs.append({"role": "system", "content": _text(rng, 20)})
    for _ in range(rng.randint(1, 6)):
        msgs.append({"role": "user", "content": _text(rng, 40)})
        msgs.append({"role": "assistant", "content": _text(rng, 120)})
    return {"messages": msgs}


WORK = Path(__file__).resolve().parent / "_work"  # generated inputs, kept between runs


def generated_corpus(mb: float) -> Path:
    """``_work/corpus_{mb}mb.jsonl``, the generated chat corpus (seed 0), written once."""
    WORK.mkdir(exist_ok=True)
    path = WORK / f"corpus_{mb:g}mb.jsonl"
    if not path.exists():
        write_corpus(path, int(mb * 1e6), seed=0)
    return path


def write_corpus(path: Path, target_bytes: int, seed: int = 0) -> int:
    """Write JSONL conversations until ``target_bytes``; return the record count."""
    rng = random.Random(seed)
    n = size = 0
    with open(path, "wb") as f:
        while size < target_bytes:
            line = orjson.dumps(conversation(rng)) + b"\n"
            f.write(line)
            size += len(line)
            n += 1
    return n


def message_texts(path: Path) -> list[str]:
    """Every message text of a corpus, in order (the reference tokenises exactly these)."""
    texts = []
    with open(path, "rb") as f:
        for line in f:
            for m in orjson.loads(line)["messages"]:
                texts.append(m["content"])
    return texts


# -- real conversation text -------------------------------------------------------------
# A non-English share for the real-text corpus: sentences in several scripts, combined at
# random into user and assistant turns (the public files in ../shared/data are English).
FOREIGN = (
    "Pouvez-vous m'aider à réserver un vol pour Lyon la semaine prochaine ?",
    "Bien sûr, voici les horaires disponibles et les tarifs correspondants.",
    "Wie spät ist es in Tokio, wenn es in Berlin zwölf Uhr mittags ist?",
    "Die Rechnung wurde gestern verschickt; bitte prüfen Sie Ihren Posteingang.",
    "¿Cuál es la diferencia entre una lista y una tupla en Python?",
    "Las tuplas son inmutables, mientras que las listas se pueden modificar.",
    "Какая погода будет завтра в Москве и стоит ли брать зонт?",
    "Завтра ожидается небольшой дождь, температура около десяти градусов.",
    "请帮我把这段话翻译成英文，并解释其中的语法。",
    "这个函数返回一个列表，其中包含所有满足条件的元素。",
    "明日の会議は午後三時からに変更になりました。資料を準備してください。",
    "このエラーは、ファイルが存在しない場合に発生します。",
    "이 문장을 더 자연스럽게 고쳐 주실 수 있나요?",
    "هل يمكنك أن تشرح لي كيف تعمل الشبكات العصبية؟",
    "यह प्रोग्राम इनपुट फ़ाइल को पढ़ता है और परिणाम लिखता है।",
    "Bu fonksiyon, verilen listedeki en büyük sayıyı döndürür.",
)


def _foreign_text(rng: random.Random, sentences: int) -> str:
    return " ".join(rng.choice(FOREIGN) for _ in range(max(1, sentences)))


def _records_of(path: Path) -> list[bytes]:
    """The records of one JSONL or JSON-array file, each as its compact JSON line."""
    data = path.read_bytes()
    if path.suffix == ".json":
        return [orjson.dumps(r) for r in orjson.loads(data)]
    return [line for line in data.splitlines() if line.strip()]


TEXT_ROLES = {"system", "developer", "user", "human", "assistant", "gpt", "tool", "observation", "function"}


def _tag_tools(tools, tag: str):
    """Tool schemas with ``tag`` after each description (a list, or its JSON text)."""
    if isinstance(tools, str):
        try:
            return orjson.dumps(_tag_tools(orjson.loads(tools), tag)).decode() if tools.strip() else tools
        except orjson.JSONDecodeError:
            return tools
    if not isinstance(tools, list):
        return tools
    out = []
    for t in tools:
        if isinstance(t, dict):
            t = dict(t)
            fn = t.get("function") if isinstance(t.get("function"), dict) else t
            if fn is not t:
                fn = t["function"] = dict(fn)
            if isinstance(fn.get("description"), str):
                fn["description"] += tag
        out.append(t)
    return out


def tag_record(line: bytes, copy: int) -> bytes:
    """The record with `` (copy N)`` after every message text, system string and tool
    description, so that no text of one copy of the files equals a text of another: a memo
    then reuses only what repeats within the files themselves (calls and their arguments,
    which hold JSON, are left as they are)."""
    tag = f" (copy {copy})"
    obj = orjson.loads(line)
    if not isinstance(obj, dict):
        return line
    if isinstance(obj.get("system"), str):
        obj["system"] += tag
    for key in ("tools", "functions"):
        if key in obj:
            obj[key] = _tag_tools(obj[key], tag)
    for key, role_key, text_key in (("messages", "role", "content"), ("conversations", "from", "value")):
        msgs = obj.get(key)
        if not isinstance(msgs, list):
            continue
        for m in msgs:
            if isinstance(m, dict) and str(m.get(role_key, m.get("role"))).lower() in TEXT_ROLES:
                for k in (text_key, "content"):
                    if isinstance(m.get(k), str) and m[k].strip():
                        m[k] += tag
                        break
    return orjson.dumps(obj)


def write_real_corpus(path: Path, source: Path, target_bytes: int, foreign_share: float = 0.1,
                      seed: int = 0, distinct_copies: bool = False) -> int:
    """JSONL of the records of ``source`` (a file, or a folder of .json/.jsonl files), cycled
    until ``target_bytes``, plus about ``foreign_share`` of the bytes as non-English
    conversations; return the record count. Deterministic for a seed. ``distinct_copies``:
    every copy after the first has its texts tagged (``tag_record``), so the corpus repeats
    only what the files repeat themselves; ``target_bytes`` 0: the files once."""
    files = sorted(p for p in source.iterdir() if p.suffix in (".json", ".jsonl")) if source.is_dir() else [source]
    records = [r for f in files for r in _records_of(f)]
    if not records:
        raise SystemExit(f"no records in {source}")
    target_bytes = target_bytes or int(sum(len(r) + 1 for r in records) / (1 - foreign_share))
    rng = random.Random(seed)
    n = size = foreign = taken = 0
    with open(path, "wb") as f:
        while size < target_bytes:
            if foreign < foreign_share * size:
                msgs = []
                for _ in range(rng.randint(1, 4)):
                    msgs.append({"role": "user", "content": _foreign_text(rng, rng.randint(1, 4))})
                    msgs.append({"role": "assistant", "content": _foreign_text(rng, rng.randint(2, 12))})
                line = orjson.dumps({"messages": msgs})
                foreign += len(line) + 1
            else:
                if distinct_copies:  # each record once per copy, in order
                    copy, i = divmod(taken, len(records))
                    line = tag_record(records[i], copy) if copy else records[i]
                    taken += 1
                else:
                    line = records[n % len(records)]
            f.write(line + b"\n")
            size += len(line) + 1
            n += 1
    return n


# -- agent data ---------------------------------------------------------------------------
def _schema(rng: random.Random, i: int) -> dict:
    props = {f"{rng.choice(WORDS)}_{j}": {"type": rng.choice(["string", "integer", "boolean"]),
                                          "description": _text(rng, 12)} for j in range(rng.randint(1, 6))}
    return {"type": "function", "function": {"name": f"{rng.choice(WORDS)}_{rng.choice(WORDS)}_{i}",
                                             "description": _text(rng, 40),
                                             "parameters": {"type": "object", "properties": props,
                                                            "required": sorted(props)[:1]}}}


def agent_record(rng: random.Random, system: str, pool: list[dict], i: int, text_scale: float = 1.0) -> dict:
    """One agent record: the system prompt, 5-20 tools of the pool, a short user turn, 1-4
    tool calls with short results, and a short answer (``text_scale`` times longer each)."""
    tools = rng.sample(pool, rng.randint(5, 20))
    msgs = [{"role": "system", "content": system},
            {"role": "user", "content": _text(rng, 12 * text_scale)}]
    for k in range(rng.randint(1, 4)):
        fn = rng.choice(tools)["function"]
        args = {p: (rng.randint(0, 9999) if v["type"] == "integer" else rng.choice(WORDS))
                for p, v in list(fn["parameters"]["properties"].items())[:2]}
        cid = f"call_{i}_{k}"
        msgs.append({"role": "assistant", "tool_calls": [{"id": cid, "type": "function", "function": {
            "name": fn["name"], "arguments": orjson.dumps(args).decode()}}]})
        msgs.append({"role": "tool", "tool_call_id": cid, "content": _text(rng, 15 * text_scale)})
    msgs.append({"role": "assistant", "content": _text(rng, 30 * text_scale)})
    return {"tools": tools, "messages": msgs}


def write_agent_corpus(path: Path, target_bytes: int, seed: int = 0, system_words: int = 2000,
                       pool_size: int = 40, text_scale: float = 1.0) -> int:
    """JSONL agent records until ``target_bytes``: one system prompt of about 2,000 tokens
    (``system_words`` words), tools drawn from a pool of ``pool_size`` schemas, turns
    ``text_scale`` times the default length (more: a smaller repeated share); return the
    record count."""
    rng = random.Random(seed)
    system = "\n\n".join(" ".join(rng.choice(WORDS) for _ in range(system_words // 10)).capitalize() + "."
                         for _ in range(10))
    pool = [_schema(rng, i) for i in range(pool_size)]
    n = size = 0
    with open(path, "wb") as f:
        while size < target_bytes:
            line = orjson.dumps(agent_record(rng, system, pool, n, text_scale)) + b"\n"
            f.write(line)
            size += len(line)
            n += 1
    return n


def identical(a: Path, b: Path) -> bool:
    """The two folders hold the same files with the same bytes."""
    import filecmp

    fa = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    fb = sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    return fa == fb and all(filecmp.cmp(a / f, b / f, shallow=False) for f in fa)
