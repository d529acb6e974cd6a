"""Reasoning parsers: the thinking kept apart from the answer, token by token, on real tokenizers and
templates of two DeepSeek families (tests/reasoning_tokenizers.py) and on Mistral's markers as text."""

from __future__ import annotations

import json

import pytest

from conduit.v1 import engine_pb2 as pb
from engine_service.core.events import FinishReason
from engine_service.core.params import InvalidRequest
from engine_service.text import prompts, reasoning
from engine_service.text.output import OutputProcessor
from engine_service.text.reasoning import FORMATS, Phase, ReasoningSplitter, ReasoningTokens
from engine_service.text.tools import ToolSpec
from reasoning_tokenizers import r1_distill_tokenizer, v4_tokenizer

THINK = FORMATS["deepseek_r1"]
# Tests that load a real model's tokenizer (seconds each, the first time) run with the model tier.
real_tokenizer = pytest.mark.model


def split(fmt, phase, pieces):
    splitter = ReasoningSplitter(fmt, phase)
    thinking = answer = ""
    for piece in pieces:
        t, a = splitter.feed(piece)
        thinking, answer = thinking + t, answer + a
    t, a = splitter.flush()
    return thinking + t, answer + a, splitter.phase


@pytest.mark.parametrize("fmt", [FORMATS["deepseek_r1"], FORMATS["mistral"]])
def test_markers_split_at_every_character(fmt):
    text = f"{fmt.start}\nSix times seven.\n{fmt.end}\n\nIt is 42."
    for size in (1, 2, 3, len(text)):
        pieces = [text[i:i + size] for i in range(0, len(text), size)]
        assert split(fmt, Phase.UNDECIDED, pieces) == ("Six times seven.\n", "It is 42.", Phase.ANSWER)


def test_output_started_inside_the_thinking_has_only_the_end_marker():
    assert split(THINK, Phase.THINKING, ["Hmm, ", "<", "/thi", "nk>", "\n\nYes."]) == ("Hmm, ", "Yes.", Phase.ANSWER)


def test_thinking_cut_off_is_all_thinking_and_no_answer():
    assert split(THINK, Phase.UNDECIDED, ["<think>", "still going </th"]) == ("still going </th", "", Phase.THINKING)


def test_an_answer_without_thinking_is_all_answer():
    # As written, leading spaces included: a model that does not think answers as it did before.
    assert split(THINK, Phase.UNDECIDED, ["  <th", "is is not a marker"]) == ("", "  <this is not a marker",
                                                                                Phase.ANSWER)
    assert split(THINK, Phase.UNDECIDED, [" <thi"]) == ("", " <thi", Phase.UNDECIDED)
    assert split(THINK, Phase.ANSWER, ["<think>kept</think>"]) == ("", "<think>kept</think>", Phase.ANSWER)


@real_tokenizer
def test_families_detected_from_real_templates():
    assert reasoning.detect(r1_distill_tokenizer().chat_template) is FORMATS["deepseek_r1"]
    assert reasoning.detect(v4_tokenizer().chat_template) is FORMATS["deepseek_r1"]
    assert reasoning.detect("{{ messages }}") is None
    assert reasoning.detect("{% if enable_thinking %}<think>{% endif %}") is FORMATS["qwen3"]
    assert reasoning.detect("[THINK]{{ m }}[/THINK]") is FORMATS["mistral"]
    assert reasoning.choose("none", r1_distill_tokenizer().chat_template) is None
    assert reasoning.choose("mistral", None) is FORMATS["mistral"]


def chat(effort: str = "", kwargs: str = "") -> pb.ChatInput:
    return pb.ChatInput(messages=[pb.ChatMessage(role="user", content="What is 6 x 7?")],
                        reasoning_effort=effort, chat_template_kwargs=kwargs)


def start_of(tokenizer, chat_input: pb.ChatInput) -> Phase:
    ids = prompts.prompt_ids(tokenizer, pb.GenerateRequest(chat=chat_input))
    return reasoning.starting_phase(THINK, tokenizer.decode(ids[-16:]))


@real_tokenizer
def test_where_the_output_starts_follows_the_template_and_the_effort():
    # DeepSeek-R1's distill template leaves <think> to the model; V3.1's opens it or closes it.
    assert start_of(r1_distill_tokenizer(), chat()) is Phase.UNDECIDED
    assert start_of(r1_distill_tokenizer(), chat("none")) is Phase.UNDECIDED  # nothing to switch off
    assert start_of(v4_tokenizer(), chat("high")) is Phase.THINKING
    assert start_of(v4_tokenizer(), chat("none")) is Phase.ANSWER
    assert start_of(v4_tokenizer(), chat()) is Phase.ANSWER  # the template's default: no thinking
    assert start_of(v4_tokenizer(), chat("none", '{"thinking": true}')) is Phase.THINKING  # kwargs win


@real_tokenizer
@pytest.mark.parametrize("effort,kwargs,param", [("max", "", "chat.reasoning_effort"),
                                                 ("", "[1]", "chat.chat_template_kwargs"),
                                                 ("", "{", "chat.chat_template_kwargs"),
                                                 ("", '{"messages": []}', "chat.chat_template_kwargs")])
def test_bad_reasoning_inputs_name_their_field(effort, kwargs, param):
    with pytest.raises(InvalidRequest) as caught:
        prompts.prompt_ids(v4_tokenizer(), pb.GenerateRequest(chat=chat(effort, kwargs)))
    assert caught.value.param == param


def processor(tokenizer, phase, *, max_tokens=200, budget=None, tools=None):
    fmt = reasoning.detect(tokenizer.chat_template)
    return OutputProcessor(index=0, prompt_ids=[], tokenizer=tokenizer, stop_ids={tokenizer.eos_token_id},
                           eos_ids=[tokenizer.eos_token_id], stop_strings=[], min_tokens=0, max_tokens=max_tokens,
                           tools=tools, matcher=None, reasoning=ReasoningTokens.of(fmt, tokenizer), phase=phase,
                           max_reasoning_tokens=budget)


def run(output: OutputProcessor, ids: list[int]):
    """Feeds `ids` as sampled tokens (a forced token replaces the scripted one, as the sampler's
    mask makes it); returns the chunks' thinking and answer, the finish reason and the ids fed."""
    thinking = answer = ""
    reason, fed = None, []
    for token in ids:
        token = output.forced[0] if output.forced else token
        fed.append(token)
        reason = output.add(token, None)
        for chunk in output.chunks():
            thinking, answer = thinking + chunk.reasoning, answer + chunk.text
        if reason is not None:
            break
    return thinking, answer, reason, fed


@real_tokenizer
@pytest.mark.parametrize("make", [r1_distill_tokenizer, v4_tokenizer])
def test_real_tokens_thinking_then_answer(make):
    tokenizer = make()
    ids = tokenizer.encode("<think>\nSix sevens are 42.\n</think>\n\nThe answer is 42.", add_special_tokens=False)
    ids.append(tokenizer.eos_token_id)
    output = processor(tokenizer, Phase.UNDECIDED)
    thinking, answer, reason, _ = run(output, ids)
    assert (thinking, answer, reason) == ("Six sevens are 42.\n", "The answer is 42.", FinishReason.STOP)
    end = ids.index(tokenizer.convert_tokens_to_ids("</think>"))
    assert output.reasoning_tokens == end + 1  # up to and including the end marker


@real_tokenizer
def test_thinking_cut_by_max_tokens_has_no_answer():
    tokenizer = r1_distill_tokenizer()
    ids = tokenizer.encode("<think>\nLet me count the ways, one by one, slowly.", add_special_tokens=False)
    output = processor(tokenizer, Phase.UNDECIDED, max_tokens=6)
    thinking, answer, reason, _ = run(output, ids)
    assert reason is FinishReason.LENGTH and answer == "" and thinking.startswith("Let me")
    assert output.reasoning_tokens == 6


@real_tokenizer
@pytest.mark.parametrize("budget", [1, 2, 5])
def test_budget_ends_the_thinking_at_exactly_n_tokens(budget):
    tokenizer = v4_tokenizer()  # its template opens the thinking: the output starts inside it
    endless = tokenizer.encode(" and so on" * 20, add_special_tokens=False)
    answer_ids = tokenizer.encode("Done.", add_special_tokens=False) + [tokenizer.eos_token_id]
    output = processor(tokenizer, Phase.THINKING, budget=budget)
    # The scripted model thinks without end; past the budget it follows with its answer.
    thinking, _, _, fed = run(output, endless[:budget - 1] + [0] + answer_ids)
    assert fed[budget - 1] == tokenizer.convert_tokens_to_ids("</think>")
    assert output.reasoning_tokens == budget
    assert thinking == tokenizer.decode(endless[:budget - 1])


@real_tokenizer
def test_tool_calls_are_read_from_the_answer_only():
    tokenizer = r1_distill_tokenizer()
    tools = ToolSpec.from_chat(pb.ChatInput(tools=[pb.Tool(name="add", parameters_json="{}")]))
    text = ('<think>I could write <tool_call>{"name": "add", "arguments": {}}</tool_call> here.</think>\n\n'
            '<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>')
    ids = tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]
    output = processor(tokenizer, Phase.UNDECIDED, tools=tools)
    thinking, answer, reason, _ = run(output, ids)
    assert reason is FinishReason.TOOL_CALLS and answer == ""
    assert "<tool_call>" in thinking
    assert [(c.name, json.loads(c.arguments)) for c in output.tool_calls] == [("add", {"a": 1})]


@real_tokenizer
def test_markers_that_are_special_tokens_are_found_by_their_ids():
    """Magistral's [THINK]/[/THINK] are control tokens, which the detokenizer skips: the split must
    still see them. Here V4's tokenizer with its think tokens made special stands in for one."""
    from reasoning_tokenizers import V4_PACKAGE, package_file
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(package_file(V4_PACKAGE, "tokenizer.json")),
                                        eos_token="<｜end▁of▁sentence｜>")
    tokenizer.add_special_tokens({"additional_special_tokens": ["<think>", "</think>"]})
    tokenizer.chat_template = "<think></think>"
    ids = tokenizer.encode("<think>Hmm.</think>Yes.", add_special_tokens=False) + [tokenizer.eos_token_id]
    assert tokenizer.decode(ids[:1], skip_special_tokens=True) == ""
    output = processor(tokenizer, Phase.UNDECIDED)
    assert run(output, ids)[:2] == ("Hmm.", "Yes.")


@real_tokenizer
@pytest.mark.parametrize("kwargs", ['{"continue_final_message": true}', '{"tokenize": true}'])
def test_template_kwargs_that_clash_with_the_renderer_are_refused_not_crashed(kwargs):
    with pytest.raises(InvalidRequest) as caught:
        prompts.prompt_ids(v4_tokenizer(), pb.GenerateRequest(chat=chat("", kwargs)))
    assert caught.value.param == "chat.chat_template_kwargs"


def test_effort_maps_onto_the_switches_a_template_reads():
    variables = reasoning.template_variables(
        "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}"
        "{{ reasoning_effort }}{% for m in messages %}{{ m.content }}{% endfor %}")
    assert {"enable_thinking", "reasoning_effort", "messages"} <= variables
    assert reasoning.template_kwargs(variables, "none") == {"enable_thinking": False, "reasoning_effort": "none"}
    assert reasoning.template_kwargs(variables, "low") == {"enable_thinking": True, "reasoning_effort": "low"}
    assert reasoning.template_kwargs({"thinking"}, "minimal") == {"thinking": False}
    assert reasoning.template_kwargs({"messages"}, "high") == {}  # DeepSeek-R1's: no switch
