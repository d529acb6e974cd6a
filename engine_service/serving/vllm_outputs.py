"""The engine's events -> vllm.grpc.engine.GenerateResponse messages (smg-grpc-proto), as vLLM's
own servicer shapes them, which is what the Shepherd gateway reads:

- streamed: per choice, chunks of the new token ids (`completion_tokens` is the chunk's own count:
  the gateway adds them up for a vLLM worker), then a `complete` with the finish reason, the
  matched stop and the last chunk's ids again;
- not streamed: one `complete` per choice with all its ids and logprobs.
Counts of prompt and cached tokens ride on every message; prompt logprobs on each choice's first.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from smg_grpc_proto.generated import vllm_engine_pb2 as vpb

from engine_service.core.events import ChunkEvent, Event, FinalEvent, FinishReason, PromptEvent, TokenLogprob


@dataclass
class _Choice:
    ids: list[int] = field(default_factory=list)  # all (not streamed) or the last chunk's (streamed)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    started: bool = False


def output_logprobs(logprobs: list[TokenLogprob], with_top: bool) -> vpb.OutputLogProbs:
    out = vpb.OutputLogProbs(token_logprobs=[lp.logprob for lp in logprobs],
                             token_ids=[lp.token_id for lp in logprobs])
    if with_top:
        for lp in logprobs:
            out.top_logprobs.append(vpb.TopLogProbs(values=[v for _, v in lp.top], token_ids=[t for t, _ in lp.top]))
    return out


def input_logprobs(prompt_ids: list[int], logprobs: list[TokenLogprob | None], with_top: bool) -> vpb.InputLogProbs:
    out = vpb.InputLogProbs(token_ids=prompt_ids)
    for lp in logprobs:
        out.token_logprobs.append(vpb.InputTokenLogProb() if lp is None else vpb.InputTokenLogProb(value=lp.logprob))
        if with_top:
            out.top_logprobs.append(vpb.TopLogProbs() if lp is None else vpb.TopLogProbs(
                values=[v for _, v in lp.top], token_ids=[t for t, _ in lp.top]))
    return out


class VllmEncoder:
    """One Generate call's messages. `logprobs`: output logprobs wanted; `top`: alternatives each."""

    def __init__(self, stream: bool, logprobs: bool, top: int, stop_token_ids: list[int]) -> None:
        self.stream = stream
        self.logprobs = logprobs
        self.with_top = top > 0
        self.stop_token_ids = set(stop_token_ids)
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.prompt_logprobs: vpb.InputLogProbs | None = None
        self.choices: dict[int, _Choice] = {}

    def encode(self, event: Event) -> vpb.GenerateResponse | None:
        if isinstance(event, PromptEvent):
            self.prompt_tokens, self.cached_tokens = len(event.prompt_ids), event.cached_tokens
            if event.prompt_logprobs is not None:
                self.prompt_logprobs = input_logprobs(event.prompt_ids, event.prompt_logprobs, self.with_top)
            return None
        choice = self.choices.setdefault(event.index, _Choice())
        if isinstance(event, ChunkEvent):
            return self._chunk(event, choice)
        if isinstance(event, FinalEvent):
            return self._complete(event, choice)
        raise TypeError(event)

    def _chunk(self, event: ChunkEvent, choice: _Choice) -> vpb.GenerateResponse | None:
        if not self.stream:
            choice.ids += event.token_ids
            choice.logprobs += event.logprobs
            return None
        choice.ids = list(event.token_ids)
        choice.logprobs = list(event.logprobs)
        chunk = vpb.GenerateStreamChunk(token_ids=event.token_ids, prompt_tokens=self.prompt_tokens,
                                        completion_tokens=len(event.token_ids), cached_tokens=self.cached_tokens,
                                        index=event.index)
        if self.logprobs and event.logprobs:
            chunk.output_logprobs.CopyFrom(output_logprobs(event.logprobs, self.with_top))
        if not choice.started and self.prompt_logprobs is not None:
            chunk.input_logprobs.CopyFrom(self.prompt_logprobs)
        choice.started = True
        return vpb.GenerateResponse(chunk=chunk)

    def _complete(self, event: FinalEvent, choice: _Choice) -> vpb.GenerateResponse:
        reason = "abort" if event.finish_reason is FinishReason.CANCELLED else event.finish_reason.value  # vLLM's word
        complete = vpb.GenerateComplete(output_ids=choice.ids, finish_reason=reason,
                                        prompt_tokens=self.prompt_tokens, completion_tokens=event.completion_tokens,
                                        cached_tokens=self.cached_tokens, index=event.index)
        if event.finish_reason is FinishReason.STOP:
            last = choice.ids[-1] if choice.ids else None
            if last in self.stop_token_ids:
                complete.matched_token_id = last
            elif event.matched_stop:  # a stop string (an EOS matches nothing, as in vLLM)
                complete.matched_stop_str = event.matched_stop
        if self.logprobs and choice.logprobs:
            complete.output_logprobs.CopyFrom(output_logprobs(choice.logprobs, self.with_top))
        if self.prompt_logprobs is not None and not self.stream:
            complete.input_logprobs.CopyFrom(self.prompt_logprobs)
        return vpb.GenerateResponse(complete=complete)
