"""Built-in chat templates, written by us from each model family's documented format.

Each renders ``messages`` (system, user, assistant with ``tool_calls``, tool results) and
``tools``, as Hugging Face templates do. Use a model folder's own template (``model``)
when you train that model: these presets are for tokenizers that ship none, and for
tests. ``gemma`` writes tool calls as the ```tool_code``` / ```tool_output``` blocks of
Google's function-calling guide (Gemma has no tool tokens).

=========  ============================================================================
llama3     ``<|start_header_id|>ROLE<|end_header_id|>\\n\\n`` text ``<|eot_id|>``; calls as
           ``{"name": ..., "parameters": {...}}``; results in an ``ipython`` turn. Its
           tool format is its own, not Meta's Llama 3.1 one (whose template puts the
           tools in the first user turn and a dated system header first): for Llama
           3.1+, use Meta's template (the folder's own)
chatml     Qwen2/2.5: ``<|im_start|>ROLE\\n`` text ``<|im_end|>\\n``; calls in
           ``<tool_call>`` tags, results as ``<tool_response>`` in a user turn
qwen3      chatml plus reasoning: the turns after the last user message carry a
           ``<think>`` block (empty when there is no reasoning), earlier ones drop it;
           not prefix-stable
mistral    ``[INST] user[/INST] reply</s>``; the system text joins the LAST user
           message and ``[AVAILABLE_TOOLS]`` precede it (not prefix-stable); calls after
           ``[TOOL_CALLS]``, results in ``[TOOL_RESULTS]``
gemma      ``<start_of_turn>user|model\\n`` text ``<end_of_turn>\\n``; the system text
           opens the first user turn
=========  ============================================================================
"""

from __future__ import annotations

LLAMA3 = r"""{{- bos_token }}
{%- if messages and messages[0].role == 'system' %}
{%- set system = messages[0].content | trim %}
{%- set rest = messages[1:] %}
{%- else %}
{%- set system = '' %}
{%- set rest = messages %}
{%- endif %}
{%- if system or tools %}
{{- '<|start_header_id|>system<|end_header_id|>\n\n' + system }}
{%- if tools %}
{%- if system %}{{- '\n\n' }}{%- endif %}
{{- 'You have access to the following functions. To call a function, respond with JSON of the form '
    '{"name": function name, "parameters": dictionary of argument name and its value}. Do not use variables.' }}
{%- for tool in tools %}
{{- '\n\n' + (tool | tojson(indent=4)) }}
{%- endfor %}
{%- endif %}
{{- '<|eot_id|>' }}
{%- endif %}
{%- for message in rest %}
{%- if message.role == 'assistant' %}
{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' + (message.content | trim) }}
{%- for call in message.tool_calls or [] %}
{%- if (message.content | trim) or not loop.first %}{{- '\n' }}{%- endif %}
{{- '{"name": "' + call.function.name + '", "parameters": ' + (call.function.arguments | tojson) + '}' }}
{%- endfor %}
{{- '<|eot_id|>' }}
{%- elif message.role == 'tool' %}
{{- '<|start_header_id|>ipython<|end_header_id|>\n\n' + (message.content | trim) + '<|eot_id|>' }}
{%- elif message.role == 'user' %}
{{- '<|start_header_id|>user<|end_header_id|>\n\n' + (message.content | trim) + '<|eot_id|>' }}
{%- else %}
{{- raise_exception('llama3: unexpected role ' + message.role + ' after the first message') }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
"""

_CHATML_SYSTEM = r"""{%- if tools %}
{{- '<|im_start|>system\n' }}
{%- if messages and messages[0].role == 'system' %}{{- messages[0].content + '\n\n' }}{%- endif %}
{{- '# Tools\n\nYou may call one or more functions to assist with the user query.\n\n'
    'You are provided with function signatures within <tools></tools> XML tags:\n<tools>' }}
{%- for tool in tools %}
{{- '\n' + (tool | tojson) }}
{%- endfor %}
{{- '\n</tools>\n\nFor each function call, return a json object with function name and arguments within '
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n'
    '</tool_call><|im_end|>\n' }}
{%- elif messages and messages[0].role == 'system' %}
{{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
"""

_CHATML_TOOL_RESULT = r"""{%- elif message.role == 'tool' %}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}
{{- '\n<tool_response>\n' + message.content + '\n</tool_response>' }}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\n' }}{%- endif %}
"""

CHATML = _CHATML_SYSTEM + r"""{%- for message in messages %}
{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}
{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
{%- elif message.role == 'assistant' %}
{{- '<|im_start|>assistant' }}
{%- if message.content or not message.tool_calls %}{{- '\n' + message.content }}{%- endif %}
{%- for call in message.tool_calls or [] %}
{{- '\n<tool_call>\n{"name": "' + call.function.name + '", "arguments": ' + (call.function.arguments | tojson)
    + '}\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\n' }}
""" + _CHATML_TOOL_RESULT + r"""{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|im_start|>assistant\n' }}
{%- endif %}
"""

QWEN3 = _CHATML_SYSTEM + r"""{%- set ns = namespace(last_query=-1) %}
{%- for message in messages %}
{%- if message.role == 'user' %}{%- set ns.last_query = loop.index0 %}{%- endif %}
{%- endfor %}
{%- for message in messages %}
{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}
{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
{%- elif message.role == 'assistant' %}
{%- set content = message.content %}
{%- set reasoning = '' %}
{%- if message.reasoning_content is string %}
{%- set reasoning = message.reasoning_content %}
{%- elif '</think>' in content %}
{%- set reasoning = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
{%- set content = content.split('</think>')[-1].lstrip('\n') %}
{%- endif %}
{%- if loop.index0 > ns.last_query and (loop.last or reasoning) %}
{{- '<|im_start|>assistant\n<think>\n' + reasoning.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
{%- else %}
{{- '<|im_start|>assistant\n' + content }}
{%- endif %}
{%- for call in message.tool_calls or [] %}
{%- if (loop.first and content) or not loop.first %}{{- '\n' }}{%- endif %}
{{- '<tool_call>\n{"name": "' + call.function.name + '", "arguments": ' }}
{%- if call.function.arguments is string %}
{{- call.function.arguments }}
{%- else %}
{{- call.function.arguments | tojson }}
{%- endif %}
{{- '}\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\n' }}
""" + _CHATML_TOOL_RESULT + r"""{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|im_start|>assistant\n' }}
{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\n\n</think>\n\n' }}{%- endif %}
{%- endif %}
"""

MISTRAL = r"""{%- if messages and messages[0].role == 'system' %}
{%- set system = messages[0].content %}
{%- set rest = messages[1:] %}
{%- else %}
{%- set system = '' %}
{%- set rest = messages %}
{%- endif %}
{%- set ns = namespace(last_user=-1) %}
{%- for message in rest %}
{%- if message.role == 'user' %}{%- set ns.last_user = loop.index0 %}{%- endif %}
{%- endfor %}
{{- bos_token }}
{%- for message in rest %}
{%- if message.role == 'user' %}
{%- if tools and loop.index0 == ns.last_user %}
{{- '[AVAILABLE_TOOLS] ' + (tools | tojson) + '[/AVAILABLE_TOOLS]' }}
{%- endif %}
{%- if system and loop.index0 == ns.last_user %}
{{- '[INST] ' + system + '\n\n' + message.content + '[/INST]' }}
{%- else %}
{{- '[INST] ' + message.content + '[/INST]' }}
{%- endif %}
{%- elif message.role == 'assistant' %}
{%- if message.tool_calls %}
{{- '[TOOL_CALLS] [' }}
{%- for call in message.tool_calls %}
{{- '{"name": "' + call.function.name + '", "arguments": ' + (call.function.arguments | tojson) }}
{%- if call.id %}{{- ', "id": "' + call.id + '"' }}{%- endif %}
{{- '}' }}
{%- if not loop.last %}{{- ', ' }}{%- endif %}
{%- endfor %}
{{- ']' + eos_token }}
{%- else %}
{{- ' ' + (message.content | trim) + eos_token }}
{%- endif %}
{%- elif message.role == 'tool' %}
{{- '[TOOL_RESULTS] {"content": ' + (message.content | tojson) }}
{%- if message.tool_call_id %}{{- ', "call_id": "' + message.tool_call_id + '"' }}{%- endif %}
{{- '}[/TOOL_RESULTS]' }}
{%- else %}
{{- raise_exception('mistral: unexpected role ' + message.role + ' after the first message') }}
{%- endif %}
{%- endfor %}
"""

GEMMA = r"""{{- bos_token }}
{%- if messages and messages[0].role == 'system' %}
{%- set prefix = (messages[0].content | trim) + '\n\n' %}
{%- set rest = messages[1:] %}
{%- else %}
{%- set prefix = '' %}
{%- set rest = messages %}
{%- endif %}
{%- if tools %}
{%- set prefix = prefix + 'You can call functions. To call one, write a Python call in a ```tool_code``` block, '
    'for example:\n```tool_code\nname(argument=value)\n```\nThe functions:\n' + (tools | tojson(indent=2)) + '\n\n' %}
{%- endif %}
{%- for message in rest %}
{%- if message.role == 'tool' %}
{%- if loop.first or rest[loop.index0 - 1].role != 'tool' %}{{- '<start_of_turn>user\n' }}{%- else %}{{- '\n' }}{%- endif %}
{{- '```tool_output\n' + (message.content | trim) + '\n```' }}
{%- if loop.last or rest[loop.index0 + 1].role != 'tool' %}{{- '<end_of_turn>\n' }}{%- endif %}
{%- elif message.role in ['user', 'assistant'] %}
{{- '<start_of_turn>' + ('model' if message.role == 'assistant' else 'user') + '\n' }}
{{- (prefix if loop.first else '') + (message.content | trim) }}
{%- if message.tool_calls %}
{%- if message.content | trim %}{{- '\n' }}{%- endif %}
{{- '```tool_code\n' }}
{%- for call in message.tool_calls %}
{{- call.function.name + '(' }}
{%- for key, value in call.function.arguments.items() %}
{{- key + '=' + (value | tojson) }}{%- if not loop.last %}{{- ', ' }}{%- endif %}
{%- endfor %}
{{- ')\n' }}
{%- endfor %}
{{- '```' }}
{%- endif %}
{{- '<end_of_turn>\n' }}
{%- else %}
{{- raise_exception('gemma: unexpected role ' + message.role + ' after the first message') }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<start_of_turn>model\n' }}
{%- endif %}
"""

PRESETS: dict[str, str] = {"llama3": LLAMA3, "chatml": CHATML, "qwen3": QWEN3, "mistral": MISTRAL, "gemma": GEMMA}

#: the special tokens each preset writes (a tokenizer used with it must have them)
PRESET_TOKENS: dict[str, tuple[str, ...]] = {
    "llama3": ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"),
    "chatml": ("<|im_start|>", "<|im_end|>"),
    "qwen3": ("<|im_start|>", "<|im_end|>"),
    "mistral": ("[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]",
                "[/TOOL_RESULTS]"),
    "gemma": ("<start_of_turn>", "<end_of_turn>"),
}
