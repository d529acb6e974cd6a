"""Protobuf <-> engine types. The only place that knows both."""

from __future__ import annotations

import math

from conduit.v1 import engine_pb2 as pb

from engine_service.detokenizer import TokenTable
from engine_service.params import RequestParams, SamplingParams, StoppingParams
from engine_service.sequence import (
    ChunkEvent,
    Event,
    FinalEvent,
    FinishReason,
    PromptEvent,
    TokenLogprob,
)

_FINISH = {
    FinishReason.STOP: pb.FINISH_REASON_STOP,
    FinishReason.LENGTH: pb.FINISH_REASON_LENGTH,
    FinishReason.TOOL_CALLS: pb.FINISH_REASON_TOOL_CALLS,
}


def request_params(req: pb.GenerateRequest) -> RequestParams:
    s, t = req.sampling, req.stopping
    sampling = SamplingParams(
        temperature=s.temperature if s.HasField("temperature") else 1.0,
        top_p=s.top_p if s.HasField("top_p") else 1.0,
        top_k=s.top_k if s.HasField("top_k") else 0,
        min_p=s.min_p if s.HasField("min_p") else 0.0,
        repetition_penalty=s.repetition_penalty if s.HasField("repetition_penalty") else 1.0,
        presence_penalty=s.presence_penalty if s.HasField("presence_penalty") else 0.0,
        frequency_penalty=s.frequency_penalty if s.HasField("frequency_penalty") else 0.0,
        logit_bias=dict(s.logit_bias),
        seed=s.seed if s.HasField("seed") else None,
    )
    stopping = StoppingParams(
        max_tokens=t.max_tokens if t.HasField("max_tokens") else None,
        min_tokens=t.min_tokens,
        stop=list(t.stop),
        stop_token_ids=list(t.stop_token_ids),
        ignore_eos=t.ignore_eos,
    )
    return RequestParams(
        sampling=sampling,
        stopping=stopping,
        n=req.n if req.HasField("n") else 1,
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

    def encode(self, event: Event) -> pb.GenerateResponse | None:
        if isinstance(event, PromptEvent):
            info = pb.PromptInfo(prompt_tokens=len(event.prompt_ids))
            if self.echo:
                info.prompt_token_ids.extend(event.prompt_ids)
                info.prompt_text = self.decode(event.prompt_ids)
            if event.prompt_logprobs is not None:
                for token_id, lp in zip(event.prompt_ids, event.prompt_logprobs):
                    info.prompt_logprobs.append(self._logprob(lp) if lp else self._bare(token_id))
            return pb.GenerateResponse(request_id=self.request_id, prompt=info)
        if isinstance(event, ChunkEvent):
            chunk = pb.Chunk(index=event.index, text=event.text, token_ids=event.token_ids,
                             prompt_tokens=event.prompt_tokens, completion_tokens=event.completion_tokens)
            chunk.logprobs.extend(self._logprob(lp) for lp in event.logprobs)
            for delta in event.tool_calls:
                chunk.tool_calls.append(pb.ToolCallDelta(index=delta.index, id=delta.id, name=delta.name,
                                                         arguments=delta.arguments))
            return pb.GenerateResponse(request_id=self.request_id, chunk=chunk)
        if isinstance(event, FinalEvent):
            if event.finish_reason is FinishReason.CANCELLED:
                return None
            return pb.GenerateResponse(request_id=self.request_id, final=pb.Final(
                index=event.index, finish_reason=_FINISH[event.finish_reason],
                prompt_tokens=event.prompt_tokens, completion_tokens=event.completion_tokens,
                matched_stop=event.matched_stop,
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
