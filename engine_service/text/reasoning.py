"""Reasoning models: which thinking markers a model writes, and the streaming split of its output
into thinking and answer.

A family is known by its markers (<think>...</think> for DeepSeek-R1 and its distills, Qwen3 and
QwQ; [THINK]...[/THINK] for Magistral), found in the model's chat template (a GGUF file's template
comes with it) or named by the engine's --reasoning-parser flag. Where a request's output starts
is read from its rendered prompt, since templates differ: DeepSeek-R1's newer template opens
`<think>` itself (the output starts inside the thinking and only the end marker appears), Qwen3's
with enable_thinking=false writes an empty block (the output is all answer), others leave the
model to open the block (or not) itself.

gpt-oss's channels (analysis, final) are not done here: its output is not marker-delimited text
but harmony messages, and deserves its own parser.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from conduit.v1.contract import REASONING_EFFORTS
from engine_service.text.detokenizer import skipped_markers

if TYPE_CHECKING:  # transformers loads only where a model does (the fast tests need neither)
    from transformers import PreTrainedTokenizerBase


@dataclass(frozen=True)
class ReasoningFormat:
    name: str
    start: str  # the marker that opens the thinking
    end: str  # the marker that closes it; the answer follows


THINK_TAGS = ("<think>", "</think>")
FORMATS = {
    "deepseek_r1": ReasoningFormat("deepseek_r1", *THINK_TAGS),
    "qwen3": ReasoningFormat("qwen3", *THINK_TAGS),
    "mistral": ReasoningFormat("mistral", "[THINK]", "[/THINK]"),
}
PARSER_CHOICES = ("auto", "none", *FORMATS)
# reasoning_effort values that ask for no thinking, where a template can switch it off.
EFFORTS_WITHOUT_THINKING = ("none", "minimal")
EFFORTS = REASONING_EFFORTS


def detect(chat_template: str | None) -> ReasoningFormat | None:
    """The family whose markers the template writes, or None (a model that does not reason)."""
    if not chat_template:
        return None
    if "[/THINK]" in chat_template:
        return FORMATS["mistral"]
    if "</think>" in chat_template or "<think>" in chat_template:
        return FORMATS["qwen3"] if "enable_thinking" in chat_template else FORMATS["deepseek_r1"]
    return None


def choose(parser: str, chat_template: str | None) -> ReasoningFormat | None:
    """--reasoning-parser: auto (from the template), none, or a family by name."""
    if parser == "auto":
        return detect(chat_template)
    if parser == "none":
        return None
    return FORMATS[parser]


def template_kwargs(variables: set[str], effort: str) -> dict[str, object]:
    """reasoning_effort as the template's own switches (`variables`: what the template reads):
    Qwen3's enable_thinking, DeepSeek-V3.1's thinking, gpt-oss's reasoning_effort."""
    thinking = effort not in EFFORTS_WITHOUT_THINKING
    kwargs: dict[str, object] = {}
    if "enable_thinking" in variables:
        kwargs["enable_thinking"] = thinking
    if "thinking" in variables:
        kwargs["thinking"] = thinking
    if "reasoning_effort" in variables:
        kwargs["reasoning_effort"] = effort
    return kwargs


class Phase(enum.Enum):
    UNDECIDED = "undecided"  # the model may open a thinking block first
    THINKING = "thinking"
    ANSWER = "answer"


def starting_phase(fmt: ReasoningFormat, prompt: str) -> Phase:
    """Where the output starts, from the rendered prompt's end: inside the thinking when the
    template opened it, in the answer when it wrote a closed (empty) block, else undecided."""
    tail = prompt.rstrip()
    if tail.endswith(fmt.start):
        return Phase.THINKING
    if tail.endswith(fmt.end):
        return Phase.ANSWER
    return Phase.UNDECIDED


class ReasoningSplitter:
    """Streaming split of output text into (thinking, answer). A marker split across tokens is held
    until it completes or cannot; newlines after the start marker and whitespace between the end
    marker and the answer are dropped."""

    def __init__(self, fmt: ReasoningFormat, phase: Phase) -> None:
        self.fmt = fmt
        self.phase = phase
        self.thought = False  # a thinking block was entered (so the output has reasoning)
        self._held = ""
        self._answer_started = phase is Phase.ANSWER
        self._thinking_started = False
        if phase is Phase.THINKING:
            self.thought = True

    def feed(self, text: str) -> tuple[str, str]:
        reasoning, answer = "", ""
        text = self._held + text
        self._held = ""
        while text:
            if self.phase is Phase.UNDECIDED:
                stripped = text.lstrip()
                if stripped.startswith(self.fmt.start):
                    self.phase, self.thought = Phase.THINKING, True
                    text = stripped[len(self.fmt.start):]
                    continue
                if not stripped or self.fmt.start.startswith(stripped):
                    self._held = text  # whitespace, or the start marker's beginning
                    return reasoning, answer
                self.phase, self._answer_started = Phase.ANSWER, True
            if self.phase is Phase.THINKING:
                if not self._thinking_started:  # the newline after the start marker is no thought
                    text = text.lstrip("\n")
                    if not text:
                        return reasoning, answer
                    self._thinking_started = True
                at = text.find(self.fmt.end)
                if at < 0:
                    keep = _partial_suffix(text, self.fmt.end)
                    reasoning += text[:len(text) - keep]
                    self._held = text[len(text) - keep:]
                    return reasoning, answer
                reasoning += text[:at]
                text = text[at + len(self.fmt.end):]
                self.phase = Phase.ANSWER
                continue
            if not self._answer_started:
                text = text.lstrip()
                if not text:
                    return reasoning, answer
                self._answer_started = True
            answer += text
            text = ""
        return reasoning, answer

    def flush(self) -> tuple[str, str]:
        """The held text at the end: a partial end marker was thinking, undecided text answer."""
        held, self._held = self._held, ""
        if self.phase is Phase.THINKING:
            return held, ""
        return "", held


def _partial_suffix(text: str, marker: str) -> int:
    """The length of the longest end of `text` that begins `marker`."""
    for size in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0


@dataclass
class ReasoningTokens:
    """A format's markers as the tokenizer sees them: the end marker's ids (what a thinking budget
    forces), and the markers that are special tokens (a detokenizer that skips specials drops
    them: their text is put back so the split sees them)."""

    fmt: ReasoningFormat
    end_ids: list[int]
    special_texts: dict[int, str]

    @classmethod
    def of(cls, fmt: ReasoningFormat, tokenizer: PreTrainedTokenizerBase) -> "ReasoningTokens":
        special = skipped_markers(tokenizer, (fmt.start, fmt.end))
        return cls(fmt, tokenizer.encode(fmt.end, add_special_tokens=False), special)


_VARIABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def template_variables(chat_template: str | None) -> set[str]:
    """The names a Jinja chat template reads from its context (its kwargs among them)."""
    if not chat_template:
        return set()
    from jinja2 import Environment, meta
    from jinja2.exceptions import TemplateSyntaxError

    try:
        return set(meta.find_undeclared_variables(Environment().parse(chat_template)))
    except TemplateSyntaxError:  # an extension's syntax: fall back to the names that appear
        return set(_VARIABLE.findall(chat_template))
