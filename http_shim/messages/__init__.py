"""Anthropic's Messages API (POST /v1/messages, /v1/messages/count_tokens) over the engine: docs/messages.md."""

from .routes import is_anthropic_request, register_messages

__all__ = ["is_anthropic_request", "register_messages"]
