"""vllm.grpc.engine.GenerateRequest (smg-grpc-proto) -> the engine's RequestParams and constraint.

The gateway fills the proto3 scalars with vLLM's defaults (top_p 1, repetition_penalty 1), but a
zero is also what a bare client leaves: as vLLM's own servicer does, 0 reads as "unset" where 0
is no valid value. What the engine cannot honour is refused with UNIMPLEMENTED (Unsupported),
what is out of range with INVALID_ARGUMENT (InvalidRequest), naming the proto field.
"""

from __future__ import annotations

import json

from llguidance.gbnf_to_lark import GbnfToLarkError, any_to_lark
from smg_grpc_proto.generated import vllm_engine_pb2 as vpb

from conduit.v1 import engine_pb2 as pb
from engine_service.core.params import InvalidRequest, RequestParams, SamplingParams, StoppingParams

ALL_LOGPROBS = -1  # vLLM's "every token's logprob"


class Unsupported(Exception):
    """A field the engine does not implement: mapped to UNIMPLEMENTED."""


def proto_field(param: str) -> str:
    """The vLLM proto's path for a RequestParams param path (params.py names conduit.v1's)."""
    head, _, tail = param.partition(".")
    if head in ("sampling", "stopping"):
        return f"sampling_params.{tail}"
    if head in ("n", "top_logprobs"):
        return {"n": "sampling_params.n", "top_logprobs": "sampling_params.logprobs"}[head]
    return {"input": "tokenized.input_ids", "constraint": "sampling_params.constraint"}.get(head, param)


def check_supported(request: vpb.GenerateRequest) -> None:
    """Raise Unsupported for what the request asks and the engine does not do."""
    sp = request.sampling_params
    refused = [name for name, asked in (
        ("mm_inputs", request.HasField("mm_inputs")),
        ("extra_mm_inputs", len(request.extra_mm_inputs) > 0),
        ("media_refs", request.HasField("media_refs")),
        ("kv_transfer_params", request.HasField("kv_transfer_params")),
        ("kv_transfer_params_json", request.HasField("kv_transfer_params_json")),
        ("data_parallel_rank", request.HasField("data_parallel_rank") and request.data_parallel_rank != 0),
        ("sampling_params.truncate_prompt_tokens", sp.HasField("truncate_prompt_tokens")),
        ("sampling_params.structural_tag", sp.WhichOneof("constraint") == "structural_tag"),
        ("sampling_params.logprobs=-1 (all)", sp.HasField("logprobs") and sp.logprobs == ALL_LOGPROBS),
        ("sampling_params.prompt_logprobs=-1 (all)",
         sp.HasField("prompt_logprobs") and sp.prompt_logprobs == ALL_LOGPROBS),
    ) if asked]
    if refused:
        raise Unsupported(f"this engine (Conduit) does not implement {', '.join(refused)}")
    if sp.HasField("logprobs") and sp.HasField("prompt_logprobs") and sp.logprobs != sp.prompt_logprobs:
        raise Unsupported("this engine (Conduit) gives prompt and output logprobs the same number of "
                          "alternatives: set sampling_params.logprobs and prompt_logprobs alike")


def request_params(sp: vpb.SamplingParams) -> RequestParams:
    """The engine's parameters; RequestParams.validate (at submit) checks their ranges."""
    for name in ("logprobs", "prompt_logprobs"):
        if sp.HasField(name) and getattr(sp, name) < 0:
            raise InvalidRequest(f"{name} must be >= 0 (or -1 for all, which this engine does not implement)",
                                 f"sampling.{name}")
    top = sp.logprobs if sp.HasField("logprobs") else sp.prompt_logprobs if sp.HasField("prompt_logprobs") else 0
    return RequestParams(
        sampling=SamplingParams(
            temperature=sp.temperature if sp.HasField("temperature") else 1.0,
            top_p=sp.top_p or 1.0, top_k=sp.top_k, min_p=sp.min_p,
            repetition_penalty=sp.repetition_penalty or 1.0,
            presence_penalty=sp.presence_penalty, frequency_penalty=sp.frequency_penalty,
            logit_bias={int(k): v for k, v in sp.logit_bias.items()},
            seed=sp.seed if sp.HasField("seed") else None),
        stopping=StoppingParams(
            max_tokens=sp.max_tokens if sp.HasField("max_tokens") else None, min_tokens=sp.min_tokens,
            stop=list(sp.stop), stop_token_ids=list(sp.stop_token_ids), ignore_eos=sp.ignore_eos),
        n=sp.n or 1,
        logprobs=sp.HasField("logprobs") or sp.HasField("prompt_logprobs"),
        top_logprobs=top,
        # Prompt logprobs come with echo in the engine; echo changes nothing else here.
        echo=sp.HasField("prompt_logprobs"),
    )


def constraint(sp: vpb.SamplingParams) -> pb.Constraint | None:
    """The vLLM constraint as conduit.v1's (which the engine's GrammarCompiler compiles)."""
    kind = sp.WhichOneof("constraint")
    if kind is None or (kind == "json_object" and not sp.json_object):
        return None
    if kind == "json_object":
        return pb.Constraint(json_object=True)
    if kind == "json_schema":
        return pb.Constraint(json_schema=sp.json_schema)
    if kind == "regex":
        return pb.Constraint(regex=sp.regex)
    if kind == "grammar":  # vLLM's is EBNF (GBNF); llguidance takes Lark, and converts GBNF to it
        try:
            return pb.Constraint(grammar=any_to_lark(sp.grammar))
        except GbnfToLarkError as exc:
            raise InvalidRequest(f"the grammar is not valid GBNF or Lark: {exc}", "constraint") from exc
    if kind == "choice":
        if not sp.choice.choices:
            raise InvalidRequest("choice needs at least one choice", "constraint")
        # A Lark rule of string literals (JSON escapes are Lark's): exactly one of the choices.
        return pb.Constraint(grammar="start: " + " | ".join(json.dumps(c) for c in sp.choice.choices))
    raise Unsupported(f"this engine (Conduit) does not implement the {kind} constraint")
