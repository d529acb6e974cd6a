"""OpenAI's Responses API (POST /v1/responses and its stored responses) over the engine's chat.

protocol.py types a body (validation and its /openapi.json part); request.py builds the GenerateRequest
from it; objects.py builds the response object; events.py writes the exact event stream; store.py keeps
responses in SQLite; routes.py serves them.
"""

from .routes import RESPONSES_ROUTE, register_responses
from .store import (DEFAULT_MAX_AGE_S, DEFAULT_MAX_RESPONSES, IN_MEMORY, ResponseStore, StoreError, StoreLimits,
                    default_store_dir)

__all__ = ["RESPONSES_ROUTE", "register_responses", "ResponseStore", "StoreError", "StoreLimits", "default_store_dir",
           "DEFAULT_MAX_AGE_S", "DEFAULT_MAX_RESPONSES", "IN_MEMORY"]
