"""Generated agent data: every record repeats a long system prompt and a few tool schemas
from a small pool, then a short user question, tool calls and their results (the shape
of real tool-calling datasets, where repeated text holds most of the tokens)."""

from __future__ import annotations

import json
import random

WORDS = ("order refund account shipping address payment verify customer policy product return exchange "
         "status cancel confirm email zip code price stock warehouse delivery tracking").split()


def _sentence(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n)).capitalize() + "."


def tool_pool(rng: random.Random, n: int = 12) -> list[dict]:
    return [{"type": "function", "function": {
        "name": f"tool_{i}", "description": _sentence(rng, rng.randint(8, 30)),
        "parameters": {"type": "object", "properties": {
            f"arg_{j}": {"type": rng.choice(["string", "integer"]), "description": _sentence(rng, rng.randint(3, 9))}
            for j in range(rng.randint(1, 4))}, "required": ["arg_0"]}}} for i in range(n)]


def agent_records(n: int, seed: int = 0, system_words: int = 300, pool: int = 12) -> list[dict]:
    """``n`` OpenAI-format tool records; a few distinct system prompts, 2-6 tools each."""
    rng = random.Random(seed)
    tools = tool_pool(rng, pool)
    systems = [_sentence(rng, system_words) + "\n\n- " + _sentence(rng, 20) for _ in range(3)]
    out = []
    for i in range(n):
        chosen = rng.sample(tools, rng.randint(2, 6))
        msgs = [{"role": "system", "content": rng.choice(systems)},
                {"role": "user", "content": f"Question {i}: " + _sentence(rng, rng.randint(3, 12))}]
        for k in range(rng.randint(1, 3)):
            fn = rng.choice(chosen)["function"]
            cid = f"call_{i}_{k}"
            msgs.append({"role": "assistant", "tool_calls": [{"id": cid, "type": "function", "function": {
                "name": fn["name"], "arguments": json.dumps({"arg_0": rng.randint(0, 10**6)})}}]})
            result = _sentence(rng, 40) if rng.random() < 0.5 else "Result: " + _sentence(rng, 5)
            msgs.append({"role": "tool", "tool_call_id": cid, "content": result})
        msgs.append({"role": "assistant", "content": _sentence(rng, rng.randint(5, 25))})
        out.append({"tools": chosen, "messages": msgs})
    return out
