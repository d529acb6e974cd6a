"""Validated, defaulted per-request parameters.

The dataclass defaults are the one implementation of the defaults engine.proto documents
(convert.py leaves unset proto fields to them); the ranges come from conduit.v1.contract,
which the HTTP shim checks against too.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from conduit.v1.contract import LOGIT_BIAS_RANGE, MAX_N, MAX_STOP_STRINGS, MAX_TOP_LOGPROBS, SAMPLING_RANGES


class InvalidRequest(ValueError):
    """Bad input: mapped to INVALID_ARGUMENT. `param` is the request field at fault, as a proto
    path ("sampling.top_p"; "input" for whichever input oneof is set); `code` a machine-readable kind."""

    def __init__(self, message: str, param: str = "", code: str = "") -> None:
        super().__init__(message)
        self.param = param
        self.code = code


class QueueFull(Exception):
    """The engine's waiting queue is at its limit: mapped to RESOURCE_EXHAUSTED."""


class Draining(Exception):
    """The engine is shutting down and takes no new requests: mapped to UNAVAILABLE."""


@dataclass
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] = field(default_factory=dict)
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def needs_penalties(self) -> bool:
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0

    @property
    def needs_filters(self) -> bool:
        return self.top_p < 1.0 or self.top_k > 0 or self.min_p > 0.0

    def validate(self, vocab_size: int) -> None:
        for name, allowed in SAMPLING_RANGES.items():
            _check(getattr(self, name) in allowed, f"{name} must be in {allowed}", f"sampling.{name}")
        _check(self.top_k >= 0, "top_k must be >= 0", "sampling.top_k")
        for token, bias in self.logit_bias.items():
            _check(0 <= token < vocab_size, f"logit_bias token id {token} is outside the vocabulary (size {vocab_size})",
                   "sampling.logit_bias")
            _check(bias in LOGIT_BIAS_RANGE, f"logit_bias for token {token} must be in {LOGIT_BIAS_RANGE}",
                   "sampling.logit_bias")


@dataclass
class StoppingParams:
    max_tokens: int | None = None
    min_tokens: int = 0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False

    def validate(self, vocab_size: int) -> None:
        _check(self.max_tokens is None or self.min_tokens <= self.max_tokens, "min_tokens must be <= max_tokens", "stopping.min_tokens")
        _check(len(self.stop) <= MAX_STOP_STRINGS, f"at most {MAX_STOP_STRINGS} stop strings", "stopping.stop")
        _check(all(self.stop), "stop strings must not be empty", "stopping.stop")
        for token in self.stop_token_ids:
            _check(0 <= token < vocab_size, f"stop token id {token} is outside the vocabulary (size {vocab_size})",
                   "stopping.stop_token_ids")


@dataclass
class RequestParams:
    sampling: SamplingParams
    stopping: StoppingParams
    n: int = 1
    logprobs: bool = False
    top_logprobs: int = 0
    echo: bool = False

    @property
    def wants_prompt_logprobs(self) -> bool:
        return self.echo and self.logprobs

    def validate(self, vocab_size: int) -> None:
        _check(1 <= self.n <= MAX_N, f"n must be in [1, {MAX_N}]", "n")
        _check(0 <= self.top_logprobs <= MAX_TOP_LOGPROBS, f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}]", "top_logprobs")
        _check(self.top_logprobs == 0 or self.logprobs, "top_logprobs needs logprobs", "top_logprobs")
        max_tokens = self.stopping.max_tokens
        _check(max_tokens is None or max_tokens >= 1 or (max_tokens == 0 and self.echo),
               "max_tokens must be >= 1 (0 only with echo, to score the prompt)", "stopping.max_tokens")
        self.sampling.validate(vocab_size)
        self.stopping.validate(vocab_size)


def _check(ok: bool, message: str, param: str) -> None:
    if not ok:
        raise InvalidRequest(message, param)
