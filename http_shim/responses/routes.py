"""The /v1/responses routes: create (whole or streamed), retrieve (also replayed as events),
delete, list input items, cancel.

Generation goes through the shared relay (drain, heartbeats, disconnect -> cancel, first answer
before the 200); answers go into the response store when `store` is on (store.py). Responses in
flight are known to this process only (for GET and cancel), as the store is this shim's own.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from flask import Flask, Response, after_this_request, request

from .. import sse
from ..context import ShimContext
from ..engine_stream import EngineStream
from ..errors import APIError, invalid
from ..web import json_response, read_body, request_id
from .events import CANCELLED_CODE, ResponseEvents, replay
from .objects import ResponseSkeleton, output_items, status_of, usage_object
from .request import ResponsesRequest, new_id, parse_responses, renamed
from .store import ResponseStore

log = logging.getLogger("http_shim")
RESPONSES_ROUTE = "/v1/responses"
NOT_OFFERED_HEADER = "Conduit-Tools-Not-Offered"  # hosted tool types accepted and not offered (request.py)
MAX_LIST_LIMIT = 100


@dataclass
class _InFlight:
    stream: EngineStream
    skeleton: ResponseSkeleton


def _not_found(response_id: str, param: str | None = None) -> APIError:
    return APIError(404, f"Response with id '{response_id}' not found.", "invalid_request_error", param, None)


def register_responses(app: Flask, ctx: ShimContext, store: ResponseStore | None) -> None:
    """`store` None: nothing is kept (every `store: true` answer is forgotten, chains are refused)."""
    in_flight: dict[str, _InFlight] = {}

    def stored(response_id: str, param: str | None = None):
        found = store.get(response_id) if store is not None else None
        if found is None:
            raise _not_found(response_id, param)
        return found

    @app.post(RESPONSES_ROUTE)
    def create_response() -> Response:
        body = read_body()
        inherited: list[dict[str, Any]] = []
        previous = body.get("previous_response_id")
        if previous is not None:
            if not isinstance(previous, str):
                raise invalid("'previous_response_id' must be a string.", "previous_response_id")
            prior = stored(previous, "previous_response_id")
            inherited = prior.context + prior.response["output"]
        parsed = parse_responses(body, request_id(), ctx.limits, inherited)
        if parsed.not_offered:
            @after_this_request
            def name_not_offered(answer: Response) -> Response:
                answer.headers[NOT_OFFERED_HEADER] = ", ".join(parsed.not_offered)
                return answer
        try:
            model, stream = ctx.relay.open(parsed.plan.model, parsed.plan.requests)
        except APIError as error:
            raise renamed(error) from None
        response_id = new_id("resp")
        skeleton = ResponseSkeleton(response_id, model, parsed.echo)

        def keep(response: dict[str, Any]) -> None:
            in_flight.pop(response_id, None)
            if parsed.store and store is not None:
                store.put(response, parsed.context)

        in_flight[response_id] = _InFlight(stream, skeleton)
        if parsed.stream:
            try:
                answer = ctx.relay.sse(stream, lambda: ResponseEvents(skeleton, parsed.logprobs, keep))
            except APIError as error:
                in_flight.pop(response_id, None)
                raise renamed(error) from None
            answer.call_on_close(lambda: in_flight.pop(response_id, None))
            return answer
        try:
            collected = ctx.relay.collect(stream)
        except APIError as error:
            in_flight.pop(response_id, None)
            if error.code != CANCELLED_CODE:
                raise renamed(error) from None
            cancelled = skeleton.build("cancelled", [])
            keep(cancelled)
            return json_response(cancelled)
        in_flight.pop(response_id, None)
        if collected is None:
            return Response(status=499)
        choice = collected.ranked(0, 1, 1)[0]
        response = skeleton.build(status_of(choice.finish_reason), output_items(choice, parsed.logprobs, skeleton),
                                  usage_object(collected.usage()))
        keep(response)
        return json_response(response)

    @app.get(f"{RESPONSES_ROUTE}/<response_id>")
    def get_response(response_id: str) -> Response:
        if response_id in in_flight:
            response = in_flight[response_id].skeleton.build("in_progress", [])
        else:
            response = stored(response_id).response
        if request.args.get("stream", "false").lower() != "true":
            return json_response(response)
        after = request.args.get("starting_after", "-1")
        if not after.lstrip("-").isdigit():
            raise invalid("'starting_after' must be an integer.", "starting_after")
        events = replay(response) if response["status"] != "in_progress" else []
        body = b"".join(e for k, e in enumerate(events) if k > int(after))
        return Response(body, 200, sse.HEADERS, content_type=sse.CONTENT_TYPE)

    @app.delete(f"{RESPONSES_ROUTE}/<response_id>")
    def delete_response(response_id: str) -> Response:
        if store is None or not store.delete(response_id):
            raise _not_found(response_id)
        return json_response({"id": response_id, "object": "response", "deleted": True})

    @app.get(f"{RESPONSES_ROUTE}/<response_id>/input_items")
    def list_input_items(response_id: str) -> Response:
        items = stored(response_id).context
        order = request.args.get("order", "desc")
        if order not in ("asc", "desc"):
            raise invalid(f"'order' must be 'asc' or 'desc', got '{order}'.", "order")
        limit_text = request.args.get("limit", "20")
        if not limit_text.isdigit() or not 1 <= int(limit_text) <= MAX_LIST_LIMIT:
            raise invalid(f"'limit' must be an integer between 1 and {MAX_LIST_LIMIT}.", "limit")
        ordered = items if order == "asc" else items[::-1]
        after = request.args.get("after")
        if after is not None:
            ids = [item.get("id") for item in ordered]
            if after not in ids:
                raise invalid(f"'after' names no input item of response '{response_id}'.", "after")
            ordered = ordered[ids.index(after) + 1:]
        page = ordered[: int(limit_text)]
        return json_response({"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
                        "last_id": page[-1]["id"] if page else None, "has_more": len(ordered) > len(page)})

    @app.post(f"{RESPONSES_ROUTE}/<response_id>/cancel")
    def cancel_response(response_id: str) -> Response:
        running = in_flight.pop(response_id, None)
        if running is None:
            status = stored(response_id).response["status"]
            raise invalid(f"Cannot cancel response '{response_id}': only a response in progress can be cancelled; "
                          f"this one is {status}.", None, "invalid_response_status")
        running.stream.interrupt(APIError(499, "The response was cancelled.", "invalid_request_error", None,
                                          CANCELLED_CODE))
        log.info("response %s cancelled", response_id)
        return json_response(running.skeleton.build("cancelled", []))
