"""The serving manifest (``serving.json``): what an inference config needs so that it
matches what the data trained. Pure: built from ``tokenizer_state.json`` (a dict), the
pad id and the BOS policy; the store writes it beside the data.

::

    {"format": "sftdata-serving", "version": 1,
     "chat_format": "template",                      # or "markers" (sftdata's chat markers)
     "template": {"name": "model", "source": "model", "sha256": "..."},   # None for markers
     "marker_rule": None,                            # markers: how a reply is delimited
     "generation_prompt": "<|start_header_id|>assistant<|end_header_id|>\\n\\n",
     "stop_ids": [128009], "stop_strings": ["<|eot_id|>"],
     "pad_id": 128004, "pad_string": "<|finetune_right_pad_id|>", "pad_is_stop": false,
     "bos": {"policy": "template", "id": 128000, "string": "<|begin_of_text|>"},
     "add_special_tokens": false,
     "generation_config": {"eos_token_id": [128009], "pad_token_id": 128004, "bos_token_id": 128000},
     "tokenizer": {"kind": "hf-tokenizers", "name": "...", "sha256": "..."}}

A template that closes no last reply (GLM ends a reply with the next role's token) gets a
stop token appended after it at prepare time: ``template.appended_stop`` names it, and it
is among ``stop_ids`` (the one difference between the data and the template's render).

BOS policy: ``template`` (the chat template writes BOS itself: tokenize the rendered
prompt with ``add_special_tokens=False``, never add a second one) or ``none`` (no BOS:
sftdata's chat markers, or a template that writes none).
"""

from __future__ import annotations

import logging

import numpy as np

from ..errors import UsageError
from ..tokenize import is_hf_state
from .loss_rule import LossRule, rule_from_state
from .stops import rule_stop_ids, rule_trains_stop, serving_stop_ids

SERVING_FORMAT = "sftdata-serving"
SERVING_VERSION = 1
BOS_POLICIES = ("template", "none")
ALLOW_PAD_FLAG = "--allow-pad-as-stop"
log = logging.getLogger("sftdata.prepare")


def token_strings(state: dict) -> dict[int, str]:
    """id -> string of every special or added token a tokenizer state names."""
    out: dict[int, str] = {}
    if is_hf_state(state):
        for key in ("added_tokens", "special_tokens"):
            out.update({int(i): s for s, i in (state.get(key) or {}).items()})
        return out
    for key in ("special_tokens", "base_special_tokens"):  # the base encoding's own string wins: what decoding gives
        out.update({int(i): s for s, i in (state.get(key) or {}).items()})
    return out


def pad_is_stop_warning(pad_id: int, stops: tuple[int, ...], strings: dict[int, str]) -> str:
    """What a pad id that is also a stop id risks, and the remedy (one line)."""
    names = ", ".join(f"{strings.get(i, '?')} ({i})" for i in stops)
    return (f"the pad id {pad_id} ({strings.get(pad_id, '?')}) is also the end-of-turn token the model learns to "
            f"stop with ({names}): the dataset's own labels (its loss mask, exported labels) train it, but a "
            f"trainer that masks labels equal to the pad id would never train the stop token, and an inference "
            f"config with the pad id among its stop ids may end completions wrongly. Train with sftdata's loss "
            f"mask, or set pad_token in the tokenizer's tokenizer_config.json to a token the template never writes "
            f"(Llama 3: <|finetune_right_pad_id|>); {ALLOW_PAD_FLAG} silences this warning")


def check_pad_not_stop(rule: LossRule, pad_id: int, allow: bool, strings: dict[int, str] | None = None) -> str | None:
    """Refuse (``UsageError``) a rule whose end-of-turn token goes untrained. A pad id that
    is one of the stop ids is accepted (every sftdata output carries its labels explicitly):
    the warning to give is returned, None when there is none or ``allow``
    (``--allow-pad-as-stop``) silences it."""
    strings = strings or {}
    stops = rule_stop_ids(rule)
    names = ", ".join(f"{strings.get(i, '?')} ({i})" for i in stops)
    if not rule_trains_stop(rule):
        raise UsageError(f"the chat template's {{% generation %}} blocks leave the end-of-turn token {names} "
                         f"outside the trained reply, so the model would never learn to stop. Put the end-of-turn "
                         f"token inside the {{% generation %}} block, or use a template without generation blocks")
    if pad_id in stops and not allow:
        return pad_is_stop_warning(pad_id, stops, strings)
    return None


def check_state_stops(state: dict, allow_pad_as_stop: bool = False) -> None:
    """``check_pad_not_stop`` for the dataset ``state`` (``tokenizer_state.json``) describes,
    with the pad id its rule pads with: run by prepare before any record is read. A pad id
    that is also a stop id is logged as a warning (``sftdata`` logger)."""
    rule = rule_from_state(state)
    warning = check_pad_not_stop(rule, rule.pad_id, allow_pad_as_stop, token_strings(state))
    if warning is not None:
        log.warning(warning)


def serving_manifest(state: dict, rule: LossRule, pad_id: int, bos_policy: str, *,
                     generation_prompt: str | None = None) -> dict:
    """The ``serving.json`` of a dataset made with ``state`` (``tokenizer_state.json``),
    padded with ``pad_id``. ``generation_prompt``: what a template appends for a reply
    (default: the state's, or ``<|ASSISTANT|>`` for the chat markers)."""
    if bos_policy not in BOS_POLICIES:
        raise ValueError(f"bos policy must be one of {BOS_POLICIES}, not {bos_policy!r}")
    strings = token_strings(state)
    stops = list(serving_stop_ids(rule))
    template = is_hf_state(state)
    if template:
        ct = state.get("chat_template") or {}
        # an end-of-turn text that is no added token (a text marker): its ids are the stop's
        markers = [t for t in ct.get("end_texts") or [] if t not in strings.values()]
        missing = [i for i in stops if i not in strings]
        strings.update(dict(zip(missing, markers)) if len(markers) == len(missing) else {})
        tpl = {"name": ct.get("name"), "source": ct.get("source"), "sha256": ct.get("sha256")}
        if ct.get("appended_stop"):  # a stop the template writes after no last reply: sftdata appended it
            tpl["appended_stop"] = ct["appended_stop"]
        prompt = ct.get("generation_prompt") if generation_prompt is None else generation_prompt
        marker_rule = None
        tokenizer = {"kind": state.get("kind"), "name": state.get("name"), "sha256": state.get("file_sha256")}
        bos_id = state.get("bos_id") if bos_policy == "template" else None
    else:
        tpl = None
        prompt = "<|ASSISTANT|>" if generation_prompt is None else generation_prompt
        marker_rule = {"trained": "from <|ASSISTANT|> through its <|END|>, after a complete user or tool turn",
                       "assistant": "<|ASSISTANT|>", "end": "<|END|>"}
        tokenizer = {"kind": "tiktoken", "name": state.get("name"), "sha256": state.get("ranks_sha256")}
        bos_id = None
    bos = {"policy": bos_policy, "id": bos_id, "string": None if bos_id is None else strings.get(int(bos_id))}
    return {
        "format": SERVING_FORMAT, "version": SERVING_VERSION,
        "chat_format": "template" if template else "markers",
        "template": tpl, "marker_rule": marker_rule, "generation_prompt": prompt,
        "stop_ids": stops, "stop_strings": [strings.get(i) for i in stops],
        "pad_id": int(pad_id), "pad_string": strings.get(int(pad_id)), "pad_is_stop": int(pad_id) in stops,
        "bos": bos, "add_special_tokens": False,
        "generation_config": {"eos_token_id": stops if len(stops) > 1 else stops[0], "pad_token_id": int(pad_id),
                              "bos_token_id": bos_id},
        "tokenizer": tokenizer,
    }


def bos_policy_of(first_ids, bos_id: int | None) -> str | None:
    """``template`` when every episode's first id is BOS, ``none`` when none is (or the
    tokenizer has no BOS), None when some are and some are not."""
    first = np.asarray(first_ids)
    if bos_id is None or first.size == 0:
        return "none"
    hit = first == int(bos_id)
    return "template" if hit.all() else "none" if not hit.any() else None

