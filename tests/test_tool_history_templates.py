"""Earlier tool calls and results on a model whose chat template renders them itself (issue 52):
Qwen2.5's Hermes-style template, which wraps calls in `<tool_call>` and results in `<tool_response>`.
The turn that asks for the final answer carries no `tools`, yet the template must still get the calls
and results as calls and results, not the text the engine writes for templates that know no tools
(which it then wrapped a second time). Seen as the shim's /tokenize then /detokenize show the prompt,
on the default model served with that template (`--chat-template`)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from common import MODEL
from conftest import STARTUP_TIMEOUT_S
from launcher.stack import Stack

pytestmark = pytest.mark.model

# Qwen2.5-Instruct's chat template (its tool parts as released), on the same ChatML tokens SmolLM2 has.
HERMES_TEMPLATE = """\
{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}{%- else %}{{- 'You are a helpful assistant.' }}{%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}{{- "\\n" }}{{- tool | tojson }}{%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}{{- '\\n' + message.content }}{%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}{{- tool_call.name }}{{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}{{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}{{- '<|im_start|>user' }}{%- endif %}
        {{- '\\n<tool_response>\\n' }}{{- message.content }}{{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}{{- '<|im_end|>\\n' }}{%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}
"""

RESULT = '{"temperature": 22, "sky": "clear"}'
HISTORY = [
    {"role": "user", "content": "What is the weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": RESULT},
]


@pytest.fixture(scope="module")
def hermes_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    template = tmp_path_factory.mktemp("template") / "hermes.jinja"
    template.write_text(HERMES_TEMPLATE)
    with Stack(engine_args=["--chat-template", str(template)], startup_timeout=STARTUP_TIMEOUT_S) as running:
        yield running


def prompt_of(stack: Stack, messages: list[dict]) -> str:
    """The prompt the engine makes of `messages`: /tokenize's ids, back through /detokenize."""
    with httpx.Client(base_url=stack.shim_url, timeout=120) as http:
        tokenized = http.post("/tokenize", json={"model": MODEL, "messages": messages})
        assert tokenized.status_code == 200, tokenized.text
        detokenized = http.post("/detokenize", json={"model": MODEL, "tokens": tokenized.json()["tokens"]})
        assert detokenized.status_code == 200, detokenized.text
    return detokenized.json()["prompt"]


def test_calls_and_results_reach_the_template_as_such_without_tools_in_the_request(hermes_stack: Stack) -> None:
    prompt = prompt_of(hermes_stack, HISTORY)
    call = '<tool_call>\n{"name": "get_weather", "arguments": ' + json.dumps({"city": "Paris"}) + '}\n</tool_call>'
    assert prompt.count("<tool_call>") == 1 and call in prompt, prompt
    assert prompt.count("<tool_response>") == 1, prompt
    assert f"<|im_start|>user\n<tool_response>\n{RESULT}\n</tool_response><|im_end|>" in prompt, prompt
