"""Constrained decoding with llguidance: JSON object / JSON Schema / regex / Lark grammar.

A request's constraint compiles once to a grammar; each choice gets its own matcher,
which masks the logits before sampling and consumes each sampled token. When the
grammar is complete the matcher allows only EOS, so the choice ends by itself.
"""

from __future__ import annotations

import json
import threading
from typing import TYPE_CHECKING

import llguidance
import torch

from conduit.v1 import engine_pb2 as pb
from engine_service.core.params import InvalidRequest
from engine_service.text.json_schemas import JSON_OPTIONS, closed_objects
from engine_service.text.tools import ToolSpec

if TYPE_CHECKING:  # transformers loads only where a model does (the fast tests need neither)
    from transformers import PreTrainedTokenizerBase


# Shifts that read each bit of the matcher's 32-bit mask words.
_BIT_POSITIONS = torch.arange(32, dtype=torch.int32)


class GrammarCompiler:
    """Builds grammars and matchers for one tokenizer (the llguidance tokenizer is built lazily, once)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, vocab_size: int) -> None:
        self._hf_tokenizer = tokenizer
        self._vocab_size = vocab_size
        self._ll_tokenizer: llguidance.LLTokenizer | None = None
        self._lock = threading.Lock()

    @property
    def ll_tokenizer(self) -> llguidance.LLTokenizer:
        with self._lock:
            if self._ll_tokenizer is None:
                import llguidance.hf  # here: it imports transformers, which only a loaded model needs

                self._ll_tokenizer = llguidance.hf.from_tokenizer(self._hf_tokenizer, n_vocab=self._vocab_size)
            return self._ll_tokenizer

    def special_tokens(self, texts: tuple[str, ...]) -> dict[str, int]:
        """The texts that are each one special token to llguidance (which counts every added token,
        Qwen's `<tool_call>` among them, as special and matches no grammar text to it), by id."""
        found: dict[str, int] = {}
        for text in texts:
            ids = self._hf_tokenizer.encode(text, add_special_tokens=False)
            if len(ids) == 1 and self.ll_tokenizer.is_special_token(ids[0]):
                found[text] = ids[0]
        return found

    def grammar_for(self, constraint: pb.Constraint) -> str | None:
        kind = constraint.WhichOneof("kind")
        if kind is None or (kind == "json_object" and not constraint.json_object):
            return None
        if kind == "json_object":
            return json_schema_grammar({"type": "object"})
        if kind == "json_schema":
            try:
                schema = json.loads(constraint.json_schema)
            except ValueError as exc:
                raise InvalidRequest(f"json_schema is not valid JSON: {exc}", "constraint") from exc
            return json_schema_grammar(closed_objects(schema))
        if kind == "regex":
            return llguidance.LLMatcher.grammar_from_regex(constraint.regex)
        return llguidance.LLMatcher.grammar_from_lark(constraint.grammar)

    def validate(self, grammar: str) -> None:
        problem = self.problem(grammar)
        if problem is not None:
            raise InvalidRequest(f"the constraint is not a valid grammar: {problem}", "constraint")

    def problem(self, grammar: str) -> str | None:
        """Why the grammar engine refuses `grammar`, or None when it compiles."""
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, self.ll_tokenizer)
        return (messages[0] if messages else "unknown") if is_error else None

    def schema_problem(self, schema: object) -> str | None:
        """Why the grammar engine refuses a JSON Schema, or None when it compiles."""
        try:
            return self.problem(llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS))
        except ValueError as exc:
            return str(exc)

    def matcher(self, grammar: str, end_on_exit: bool = False, answer: str | None = None) -> "Matcher":
        """`end_on_exit`: see Matcher; `answer`: the answer's grammar alone, when `grammar` allows
        either tool calls or that answer (see Matcher)."""
        def follow(text: str) -> llguidance.LLMatcher:
            return llguidance.LLMatcher(self.ll_tokenizer, text, log_level=0)

        branches = None if answer is None else (follow(ToolSpec.calls_only(grammar)), follow(answer))
        return Matcher(follow(grammar), self.ll_tokenizer.eos_token if end_on_exit else None, branches)


def json_schema_grammar(schema: dict | bool) -> str:
    if not isinstance(schema, (dict, bool)):
        raise InvalidRequest("a JSON schema must be an object", "constraint")
    try:
        return llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)
    except ValueError as exc:
        raise InvalidRequest(f"unsupported JSON schema: {exc}", "constraint") from exc


class Matcher:
    """One choice's position in its grammar.

    With `exit_token` (the forced tool-call grammar), wherever the grammar may end, the
    probability the model gives to leaving it (writing prose after its calls, say) goes to
    ending, instead of being spread over the allowed tokens: a model that is done calling is
    not pushed into another call.

    With `branches` (tool calls or an answer in a response format, on tool_choice auto), the
    first token is where the model chooses between calling and answering. The answer's start
    tokens are lifted so the best of them scores as the best token that starts no call, prose
    included: a greedy choice then answers exactly when the model's own first choice would not
    start a call. Masked alone, a model that means to answer in prose would mostly be pushed into a
    call, whose opening tag looks likelier than a JSON answer's `{`. The two `branches` (the calls'
    grammar alone, the answer's alone) follow the output after that too, so the matcher knows which
    one it took (`branch`), and an answer in the format is never read as a call."""

    def __init__(self, matcher: llguidance.LLMatcher, exit_token: int | None = None,
                 branches: tuple[llguidance.LLMatcher, llguidance.LLMatcher] | None = None) -> None:
        self._matcher = matcher
        self._exit_token = exit_token
        self._branches = branches
        self._alive = (True, True)  # whether the output so far fits the calls, the answer
        self._first = True  # the first token chooses between them

    def mask_logits(self, row: torch.Tensor) -> None:
        choosing = self._branches is not None and self._first
        original = row.clone() if self._exit_token is not None or choosing else None
        allowed = self._allowed(self._matcher, row.shape[-1])
        row.masked_fill_(~allowed, float("-inf"))
        end = self._exit_token
        if end is not None and end < row.shape[0] and row[end] > float("-inf"):
            leaving = torch.isneginf(row) & ~torch.isneginf(original)
            leaving[end] = True
            row[end] = torch.logsumexp(original[leaving], dim=0)
        if choosing:
            answer = self._allowed(self._branches[1], row.shape[-1]) & allowed
            if answer.any():
                # The best token that starts no call (prose included) lends its score to the answer.
                lift = original[answer | ~allowed].max() - original[answer].max()
                row[answer] += lift

    @staticmethod
    def _allowed(matcher: llguidance.LLMatcher, vocab: int) -> torch.Tensor:
        """The matcher's next-token mask as booleans over `vocab` logits. llguidance.torch would
        apply it with a torch.compile'd kernel: importing that costs every engine ~2 s at start
        (torch._dynamo), and the first constrained request a compile."""
        words = torch.zeros((vocab + 31) // 32, dtype=torch.int32)
        matcher.unsafe_compute_mask_ptr(words.data_ptr(), words.numel() * words.element_size())
        bits = (words.unsqueeze(-1) >> _BIT_POSITIONS) & 1  # bit i of word w: token 32w+i
        return bits.flatten()[:vocab].bool()

    def consume(self, token_id: int) -> None:
        self._matcher.consume_token(token_id)
        self._first = False
        if self._branches is not None:
            self._alive = tuple(alive and branch.consume_token(token_id)
                                for alive, branch in zip(self._alive, self._branches))

    @property
    def branch(self) -> str | None:
        """On tool calls or an answer: "calls" or "answer" once the output fits only that one; None
        while it fits both (an answer format that admits a call's shape) or where there is no choice."""
        if self._branches is None or self._alive[0] == self._alive[1]:
            return None
        return "calls" if self._alive[0] else "answer"

    @property
    def done(self) -> bool:
        return self._matcher.is_stopped()

    @property
    def error(self) -> str:
        return self._matcher.get_error() if self._matcher.is_error() else ""

    def fork(self) -> "Matcher":
        fork = Matcher(self._matcher.deep_copy(), self._exit_token,
                       None if self._branches is None else tuple(b.deep_copy() for b in self._branches))
        fork._alive, fork._first = self._alive, self._first
        return fork
