"""Tool-call tags on real tokenizers: Qwen's vocabulary (DeepSeek-R1-Distill-Qwen's, see
tests/reasoning_tokenizers.py) has `<tool_call>` and `</tool_call>` as added tokens, which llguidance
treats as special and matches no grammar text to; SmolLM2 (the default model) spells them as text.
A tokenizer may also make them special tokens proper, which the detokenizer skips."""

from __future__ import annotations

import json

import pytest
import torch

from conduit.v1 import engine_pb2 as pb
from engine_service.model.loader import DEFAULT_MODEL_ID, resolve_model
from engine_service.text.constraints import GrammarCompiler
from engine_service.text.detokenizer import skipped_markers
from engine_service.text.output import OutputProcessor
from engine_service.text.tool_parser import CALL_TAGS
from engine_service.text.tools import ToolSpec
from reasoning_tokenizers import r1_distill_tokenizer

pytestmark = pytest.mark.model  # real tokenizers (seconds each, the first time)

CALL = '<tool_call>{"name": "f", "arguments": {"n": 7}}</tool_call>'


def forced_spec(mode: int = pb.ToolChoice.MODE_REQUIRED) -> ToolSpec:
    params = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    return ToolSpec.from_chat(pb.ChatInput(tools=[pb.Tool(name="f", parameters_json=json.dumps(params))],
                                           tool_choice=pb.ToolChoice(mode=mode), parallel_tool_calls=False))


def smollm2_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve_model(DEFAULT_MODEL_ID)[1])


def test_qwens_added_call_tags_are_tokens_in_the_forced_grammar_and_its_matcher_takes_them():
    tokenizer = r1_distill_tokenizer()
    grammars = GrammarCompiler(tokenizer, len(tokenizer))
    tags = grammars.special_tokens(CALL_TAGS)
    assert tags == {"<tool_call>": 151657, "</tool_call>": 151658}
    grammar = forced_spec().grammar(tag_tokens=tags)
    assert grammars.problem(grammar) is None
    matcher = grammars.matcher(grammar)
    for token in tokenizer.encode(CALL, add_special_tokens=False):  # the tags as one token each
        row = torch.zeros(len(tokenizer))
        matcher.mask_logits(row)
        assert row[token] == 0, f"token {token} masked"
        matcher.consume(token)
        assert not matcher.error, matcher.error
    assert matcher.done


def test_smollm2_spells_the_call_tags_as_text():
    tokenizer = smollm2_tokenizer()
    grammars = GrammarCompiler(tokenizer, len(tokenizer))
    assert grammars.special_tokens(CALL_TAGS) == {}
    assert skipped_markers(tokenizer, CALL_TAGS) == {}


def test_call_tags_the_detokenizer_skips_are_put_back_for_the_parser():
    tokenizer = smollm2_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": list(CALL_TAGS)})
    markers = skipped_markers(tokenizer, CALL_TAGS)
    assert sorted(markers.values()) == sorted(CALL_TAGS)
    # On auto, prose then a tagged call: without the tags the call would stay in the prose.
    output = OutputProcessor(index=0, prompt_ids=[], tokenizer=tokenizer, stop_ids={tokenizer.eos_token_id},
                             eos_ids=[tokenizer.eos_token_id], stop_strings=[], min_tokens=0, max_tokens=100,
                             tools=forced_spec(pb.ToolChoice.MODE_AUTO), matcher=None, call_markers=markers)
    text = ""
    for token in tokenizer.encode("Let me look. " + CALL, add_special_tokens=False):
        assert output.add(token, None) is None
        text += "".join(chunk.text for chunk in output.chunks())
    output.add(tokenizer.eos_token_id, None)
    text += "".join(chunk.text for chunk in output.chunks())
    assert text.strip() == "Let me look."
    assert [(call.name, json.loads(call.arguments)) for call in output.tool_calls] == [("f", {"n": 7})]
