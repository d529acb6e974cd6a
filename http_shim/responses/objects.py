"""The Responses API's objects: output items, usage and the response itself (events.py writes them
as it streams; a whole answer is that stream's final object)."""

from __future__ import annotations

import time
from typing import Any

from conduit_common.results import Usage

from ..errors import APIError
from ..ids import new_id


def text_part(text: str, logprobs: list[dict[str, Any]], annotations: list[dict[str, Any]] | None = None,
              ) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": annotations or [], "logprobs": logprobs}


def message_item(item_id: str, status: str, content: list[dict[str, Any]]) -> dict[str, Any]:
    return {"id": item_id, "type": "message", "role": "assistant", "status": status, "content": content}


def reasoning_item(item_id: str, status: str, text: str | None, summarized: bool = False) -> dict[str, Any]:
    """A reasoning model's thinking, whole (`text`) or as it starts (None: its part follows).
    `summarized` (the request set reasoning.summary): no model writes a summary here, so the
    summary is the thinking itself, unabridged (LangChain, for one, reads only summaries)."""
    content = [] if text is None else [{"type": "reasoning_text", "text": text}]
    summary = [{"type": "summary_text", "text": text}] if summarized and text else []
    return {"id": item_id, "type": "reasoning", "summary": summary, "content": content, "encrypted_content": None,
            "status": status}


def function_call_item(item_id: str, call_id: str, name: str, arguments: str, status: str,
                       namespace: str | None = None) -> dict[str, Any]:
    item = {"id": item_id, "type": "function_call", "call_id": call_id, "name": name, "arguments": arguments,
            "status": status}
    return item if namespace is None else {**item, "namespace": namespace}


def usage_object(usage: Usage) -> dict[str, Any]:
    """Cached tokens come from the engine's prefix cache."""
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
    }


def error_object(error: APIError) -> dict[str, Any]:
    """`response.error`: OpenAI's codes name the kind of failure."""
    if error.status == 499:  # a cancel: its own code
        code = error.code or "cancelled"
    elif error.status == 429:
        code = "rate_limit_exceeded"
    else:
        code = "server_error" if error.status >= 500 else "invalid_prompt"
    return {"code": code, "message": error.message}


class ResponseSkeleton:
    """A response's fixed fields (id, creation time, the request's settings) and how to dress its state."""

    def __init__(self, response_id: str, model: str, echo: dict[str, Any],
                 namespaced: dict[str, tuple[str, str]] | None = None) -> None:
        """`namespaced`: the model's name of each function in a namespace -> (namespace, name)."""
        self.id = response_id
        self.created_at = int(time.time())
        self.model = model
        self.echo = echo
        self.namespaced = namespaced or {}

    @property
    def summarized(self) -> bool:
        """Whether the request asked for reasoning summaries (see reasoning_item)."""
        return bool((self.echo.get("reasoning") or {}).get("summary"))

    def call_name(self, model_name: str) -> tuple[str, str | None]:
        """(name, namespace) of a call the model named: a namespace's functions are NAMESPACE__NAME to it."""
        namespace, name = self.namespaced.get(model_name, (None, model_name))
        return name, namespace

    def build(self, status: str, output: list[dict[str, Any]], usage: dict[str, Any] | None = None,
              error: APIError | None = None) -> dict[str, Any]:
        response = {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "error": None if error is None else error_object(error),
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "output": output,
            "usage": usage,
            **self.echo,
            "model": self.model,
        }
        if status == "completed":
            response["completed_at"] = int(time.time())
        return response

    @classmethod
    def of(cls, response: dict[str, Any]) -> ResponseSkeleton:
        """The skeleton of a stored response (to replay its events)."""
        skeleton = cls(response["id"], response["model"], {})
        skeleton.created_at = response["created_at"]
        fixed = skeleton.build("completed", [])  # the fields a response has whatever its request
        skeleton.echo = {k: v for k, v in response.items() if k not in fixed}
        return skeleton
