"""OpenAI's generation routes: POST /v1/chat/completions and POST /v1/completions, whole or streamed."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

from flask import Flask, Response

from ..context import ShimContext
from ..web import json_response, read_body, request_id
from .request import GenerationPlan, parse_chat, parse_completion
from .response import (ChatStreamTranslator, Collector, CompletionStreamTranslator, OpenAIEvents, chat_response,
                       completion_response)

GENERATION_ROUTES = ("/v1/chat/completions", "/v1/completions")  # admitted (or refused) by the drain
_Build = Callable[[str, int, str, GenerationPlan, Collector], dict[str, Any]]


def register_openai(app: Flask, ctx: ShimContext) -> None:
    def generate(plan: GenerationPlan, response_id: str,
                 translator: type[ChatStreamTranslator] | type[CompletionStreamTranslator], build: _Build) -> Response:
        model, stream = ctx.relay.open(plan.model, plan.requests)
        created = int(time.time())
        if plan.stream:
            return ctx.relay.sse(stream, OpenAIEvents(translator(response_id, created, model, plan)))
        collected = Collector()
        if not ctx.relay.collect(stream, collected.add):
            return Response(status=499)
        return json_response(build(response_id, created, model, plan, collected))

    @app.post("/v1/chat/completions")
    def chat_completions() -> Response:
        plan = parse_chat(read_body(), request_id(), ctx.limits)
        return generate(plan, f"chatcmpl-{uuid.uuid4().hex}", ChatStreamTranslator, chat_response)

    @app.post("/v1/completions")
    def completions() -> Response:
        plan = parse_completion(read_body(), request_id(), ctx.limits)
        return generate(plan, f"cmpl-{uuid.uuid4().hex}", CompletionStreamTranslator, completion_response)
