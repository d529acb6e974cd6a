"""What one sequence's sampled tokens become: text with stop strings held back, a reasoning
model's thinking kept apart from its answer, tool calls (read from the answer only), and the
chunk events that carry them out. The engine feeds each token to the sequence's OutputProcessor
and learns whether (and why) the sequence finished; the processor also says whether the grammar
applies yet (only from the answer on) and which token a thinking budget forces next."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING


from conduit_common.results import ToolCall
from engine_service.text.constraints import Matcher
from engine_service.text.detokenizer import IncrementalDetokenizer
from engine_service.text.reasoning import Phase, ReasoningSplitter, ReasoningTokens
from engine_service.core.events import ChunkEvent, FinishReason, TokenLogprob
from engine_service.text.stop_strings import StopStringMatcher
from engine_service.text.tool_parser import CALL_OPEN, ParsedCall, ReplySplitter
from engine_service.text.tools import CallStreamer, ToolCallDelta, ToolSpec

if TYPE_CHECKING:  # transformers loads only where a model does (the fast tests need neither)
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger(__name__)


class OutputProcessor:
    def __init__(self, *, index: int, prompt_ids: list[int], tokenizer: PreTrainedTokenizerBase,
                 stop_ids: set[int], eos_ids: list[int], stop_strings: list[str], min_tokens: int,
                 max_tokens: int, tools: ToolSpec | None, matcher: Matcher | None,
                 reasoning: ReasoningTokens | None = None, phase: Phase = Phase.UNDECIDED,
                 max_reasoning_tokens: int | None = None, call_markers: dict[int, str] | None = None) -> None:
        """`call_markers`: the tool-call tags that are special tokens, by id (see skipped_markers)."""
        self.index = index
        self._prompt_len = len(prompt_ids)
        self._tokenizer = tokenizer
        self._detokenizer = IncrementalDetokenizer(tokenizer, prompt_ids)
        self._stop_strings = StopStringMatcher(stop_strings)
        self._stop_ids = stop_ids
        self._eos_ids = eos_ids
        self._min_tokens = min_tokens
        self._max_tokens = max_tokens
        self._matcher = matcher
        self._tools = tools
        # A tool request's text is held while it may still be calls; forced calls stream as deltas.
        # Where no grammar rules the output, prose streams and tagged calls mix with it (`_reply`).
        self._may_call = tools is not None
        self._call_text = ""
        self._reply: ReplySplitter | None = None
        self._streamer = CallStreamer()
        self._found: list[ParsedCall] = []  # the calls `_reply` read so far
        self.num_tokens = 0
        self.matched_stop = ""
        self.tool_calls: list[ToolCall] = []
        # A reasoning model's thinking, split from the answer (None: the output is all answer).
        self._reasoning = reasoning
        self._splitter = ReasoningSplitter(reasoning.fmt, phase) if reasoning is not None else None
        self._budget = max_reasoning_tokens
        self.reasoning_tokens = 0  # output tokens up to and including the end marker
        self._undecided_tokens = 0  # tokens before the model showed whether it thinks
        self.forced: list[int] = []  # the end marker's tokens, once the thinking budget is spent
        self._check_budget()
        # Markers the detokenizer skips as special tokens, put back as text for the splits that read them.
        self._skipped = {**(reasoning.special_texts if reasoning is not None else {}),
                         **((call_markers or {}) if tools is not None else {})}
        # What the next chunk event carries; the chunks sealed before it (see _seal).
        self._sealed: list[ChunkEvent] = []
        self._token_start = (0, 0)  # where the current token's id and logprob start in the lists below
        self._text = ""
        self._thinking = ""
        self._ids: list[int] = []
        self._logprobs: list[TokenLogprob] = []
        self._tool_deltas: list[ToolCallDelta] = []

    def add(self, token: int, logprob: TokenLogprob | None) -> FinishReason | None:
        """Take one sampled token; returns the finish reason when it ends the sequence."""
        self.num_tokens += 1
        self._token_start = (len(self._ids), len(self._logprobs))
        self._ids.append(token)
        if self.forced:
            self.forced = self.forced[1:] if token == self.forced[0] else []
        if logprob is not None:
            self._logprobs.append(logprob)
        if token in self._stop_ids and self.num_tokens > self._min_tokens - 1:
            self.matched_stop = "" if token in self._eos_ids else self._tokenizer.decode([token])
            return self._finish(FinishReason.STOP)
        if self._matcher is not None and self.answering:
            self._matcher.consume(token)
        text = self._detokenizer.add(token)
        text += self._skipped.get(token, "")
        text, matched = self._stop_strings.feed(text)
        self._output(text, counted=True)
        if matched is not None:
            self.matched_stop = matched
            return self._finish(FinishReason.STOP, flush=False)  # text after a stop string is dropped
        if self._matcher is not None and self._matcher.done:
            return self._finish(FinishReason.STOP)
        if self.num_tokens >= self._max_tokens:
            return self._finish(FinishReason.LENGTH)
        return None

    def chunks(self) -> list[ChunkEvent]:
        """The text, tokens and tool-call pieces since the last call, as chunks in the order written
        (a chunk's text comes before its calls); none when nothing is new."""
        chunks, self._sealed = self._sealed, []
        if self._ids:
            chunks.append(ChunkEvent(self.index, self._text, self._ids, self._logprobs, self._prompt_len,
                                     self.num_tokens, tool_calls=self._tool_deltas, reasoning=self._thinking))
            self._text, self._ids, self._logprobs, self._tool_deltas, self._thinking = "", [], [], [], ""
        return chunks

    def _seal(self) -> None:
        """Closes the chunk being gathered before the current token, whose text follows a call: text
        goes out in a later chunk than the calls before it, with the ids and logprobs of its tokens."""
        ids, logprobs = self._token_start
        self._sealed.append(ChunkEvent(self.index, self._text, self._ids[:ids], self._logprobs[:logprobs],
                                       self._prompt_len, self.num_tokens - (len(self._ids) - ids),
                                       tool_calls=self._tool_deltas, reasoning=self._thinking))
        self._text, self._tool_deltas, self._thinking = "", [], ""
        self._ids, self._logprobs, self._token_start = self._ids[ids:], self._logprobs[logprobs:], (0, 0)

    @property
    def answering(self) -> bool:
        """Whether the output is in its answer, where a grammar applies (thinking is free)."""
        return self._splitter is None or self._splitter.phase is Phase.ANSWER

    def _output(self, text: str, counted: bool = False) -> None:
        """Text of the output: thinking apart, the answer on to tool-call and prose handling.
        `counted`: the text of one new token, which counts as reasoning where it thinks."""
        if self._splitter is None:
            self._emit(text)
            return
        before = self._splitter.phase
        thinking, answer = self._splitter.feed(text)
        self._thinking += thinking
        if answer:
            self._emit(answer)
        if counted:
            self._count(before)

    def _count(self, before: Phase) -> None:
        """Count the token just fed as reasoning or not; spend the thinking budget."""
        now = self._splitter.phase
        if before is Phase.THINKING:
            self.reasoning_tokens += 1
        elif before is Phase.UNDECIDED:
            if now is Phase.UNDECIDED:
                self._undecided_tokens += 1
            elif self._splitter.thought:
                self.reasoning_tokens += self._undecided_tokens + 1
        self._check_budget()

    def _check_budget(self) -> None:
        """Past the budget, force the end marker: its tokens end within the budget, so a budget of
        N reports exactly N reasoning tokens (at least the marker's own)."""
        if (self._budget is not None and not self.forced and self._splitter is not None
                and self._splitter.phase is Phase.THINKING
                and self.reasoning_tokens + len(self._reasoning.end_ids) >= self._budget):
            self.forced = list(self._reasoning.end_ids)

    def _emit(self, text: str) -> None:
        if self._reply is not None:
            self._take(self._reply.feed(text))
            return
        if not self._may_call:
            self._text += text
            return
        self._call_text += text
        if self._tools.forced:
            self._tool_deltas += self._streamer.feed(self._tools.parse(self._call_text, truncated=True) or [])
        answering = self._matcher is not None and self._matcher.branch == "answer"
        # Without a grammar (which allows calls only at the start, and nothing after them), tagged calls
        # are read block by block as prose goes around them.
        free = self._matcher is None and not self._tools.forced
        if (answering or not self._tools.may_be_call(self._call_text)
                or (free and self._call_text.lstrip().startswith(CALL_OPEN))):
            self._may_call = False
            text, self._call_text = self._call_text, ""
            if free:
                self._reply = ReplySplitter(self._tools.tools)
                self._take(self._reply.feed(text))
            else:
                self._text += text

    def _take(self, pieces: list[str | ParsedCall]) -> None:
        """The reply's prose and calls, in order: prose as text, each call as its deltas (only the first
        call where parallel calls are off, as ToolSpec.parse keeps one)."""
        for piece in pieces:
            if isinstance(piece, str):
                if self._tool_deltas:
                    self._seal()
                self._text += piece
            elif self._tools.parallel or not self._found:
                self._found.append(piece)
                self._tool_deltas += self._streamer.feed(self._found)
        self.tool_calls = [ToolCall(self._streamer.ids[k], call.name, call.arguments)
                           for k, call in enumerate(self._found)]

    def _finish(self, reason: FinishReason, flush: bool = True) -> FinishReason:
        if flush:
            tail, matched = self._stop_strings.feed(self._detokenizer.flush())
            self._output(tail if matched else tail + self._stop_strings.flush())
        if self._splitter is not None:
            thinking, answer = self._splitter.flush()
            self._thinking += thinking
            if answer:
                self._emit(answer)
        if self._reply is not None:
            self._take(self._reply.finish(truncated=reason is FinishReason.LENGTH))
            self._reply = None
            if self._found and all(call.complete for call in self._found):
                reason = FinishReason.TOOL_CALLS
            return reason
        if self._may_call:
            reason = self._resolve_calls(reason)
        return reason

    def _resolve_calls(self, reason: FinishReason) -> FinishReason:
        """The held text as tool calls (a last one cut off keeps its partial arguments), or as text."""
        # Forced output is calls by construction, so any cut (max_tokens, a stop string) truncates one.
        truncated = self._tools.forced or reason is FinishReason.LENGTH
        # A grammar of calls or an answer knows which the output took: an answer is never read as calls.
        answered = self._matcher is not None and self._matcher.branch == "answer"
        calls = None if answered else self._tools.parse(self._call_text, truncated)
        if calls is None:
            if self._tools.forced:
                log.warning("forced tool-call output did not parse; returned as text: %r", self._call_text[:200])
            self._text += self._call_text
        else:
            if calls and all(call.complete for call in calls):
                reason = FinishReason.TOOL_CALLS
            self._tool_deltas += self._streamer.feed(calls)
            self.tool_calls = [ToolCall(self._streamer.ids[k], c.name, c.arguments) for k, c in enumerate(calls)]
        self._call_text = ""
        self._may_call = False
        return reason
