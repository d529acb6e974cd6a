"""Protobuf <-> engine types. The only place that knows both."""

from __future__ import annotations

import math
from typing import Any

from google.protobuf.message import Message

from conduit.v1 import engine_pb2 as pb
from conduit.v1.contract import FINISH_REASONS

from engine_service.text.detokenizer import TokenTable
from engine_service.core.params import RequestParams, SamplingParams, StoppingParams
from engine_service.core.events import ChunkEvent, Event, FinalEvent, PromptEvent, TokenLogprob


def _set_optional_fields(message: Message) -> dict[str, Any]:
    """The `optional` fields the message sets, by name; unset ones keep params.py's defaults."""
    return {f.name: getattr(message, f.name) for f in message.DESCRIPTOR.fields
            if f.has_presence and message.HasField(f.name)}


def request_params(req: pb.GenerateRequest) -> RequestParams:
    s, t = req.sampling, req.stopping
    sampling = SamplingParams(**_set_optional_fields(s), logit_bias=dict(s.logit_bias))
    stopping = StoppingParams(**_set_optional_fields(t), min_tokens=t.min_tokens, stop=list(t.stop),
                              stop_token_ids=list(t.stop_token_ids), ignore_eos=t.ignore_eos)
    return RequestParams(
        sampling=sampling,
        stopping=stopping,
        **({"n": req.n} if req.HasField("n") else {}),
        logprobs=req.logprobs,
        top_logprobs=req.top_logprobs,
        echo=req.echo,
    )


class EventEncoder:
    """Engine events -> GenerateResponse messages for one request."""

    def __init__(self, request_id: str, table: TokenTable, echo: bool, decode) -> None:
        self.decode = decode  # token ids -> text
        self.request_id = request_id
        self.table = table
        self.echo = echo
        self.cached_tokens = 0  # from the PromptEvent, which comes first; repeated in every count

    def encode(self, event: Event) -> pb.GenerateResponse | None:
        if isinstance(event, PromptEvent):
            self.cached_tokens = event.cached_tokens
            info = pb.PromptInfo(prompt_tokens=len(event.prompt_ids), cached_tokens=event.cached_tokens)
            if self.echo:
                info.prompt_token_ids.extend(event.prompt_ids)
                info.prompt_text = self.decode(event.prompt_ids)
            if event.prompt_logprobs is not None:
                for token_id, lp in zip(event.prompt_ids, event.prompt_logprobs):
                    info.prompt_logprobs.append(self._logprob(lp) if lp else self._bare(token_id))
            return pb.GenerateResponse(request_id=self.request_id, prompt=info)
        if isinstance(event, ChunkEvent):
            chunk = pb.Chunk(index=event.index, text=event.text, token_ids=event.token_ids,
                             prompt_tokens=event.prompt_tokens, completion_tokens=event.completion_tokens,
                             cached_tokens=self.cached_tokens, reasoning_text=event.reasoning)
            chunk.logprobs.extend(self._logprob(lp) for lp in event.logprobs)
            for delta in event.tool_calls:
                chunk.tool_calls.append(pb.ToolCallDelta(index=delta.index, id=delta.id, name=delta.name,
                                                         arguments=delta.arguments))
            return pb.GenerateResponse(request_id=self.request_id, chunk=chunk)
        if isinstance(event, FinalEvent):
            if event.finish_reason.abnormal:  # the servicer ends the call with a status instead
                return None
            return pb.GenerateResponse(request_id=self.request_id, final=pb.Final(
                index=event.index, finish_reason=FINISH_REASONS[event.finish_reason.value],
                prompt_tokens=event.prompt_tokens, completion_tokens=event.completion_tokens,
                cached_tokens=self.cached_tokens, matched_stop=event.matched_stop,
                reasoning_tokens=event.reasoning_tokens,
                tool_calls=[pb.ToolCall(id=c.id, name=c.name, arguments=c.arguments) for c in event.tool_calls]))
        raise TypeError(event)

    def _logprob(self, lp: TokenLogprob) -> pb.TokenLogprob:
        text, raw = self.table.text_and_bytes(lp.token_id)
        out = pb.TokenLogprob(token_id=lp.token_id, token=text, logprob=lp.logprob, bytes=raw)
        for token_id, value in lp.top:
            t_text, t_raw = self.table.text_and_bytes(token_id)
            out.top_logprobs.append(pb.TopLogprob(token_id=token_id, token=t_text, logprob=value, bytes=t_raw))
        return out

    def _bare(self, token_id: int) -> pb.TokenLogprob:
        text, raw = self.table.text_and_bytes(token_id)
        return pb.TokenLogprob(token_id=token_id, token=text, logprob=math.nan, bytes=raw)
