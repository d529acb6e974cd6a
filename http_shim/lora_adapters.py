"""vLLM's routes for loading LoRA adapters at run time: POST /v1/load_lora_adapter {"lora_name", "lora_path"}
and POST /v1/unload_lora_adapter {"lora_name"}, answered as vLLM answers them (a plain-text 200 "Success: ...",
its error types), docs/lora.md.

The engines decide (they own the adapters and the filesystem: --allow-runtime-lora-updating, --lora-dirs);
the shim asks every engine (models.py) and lists them again at once, so /v1/models shows the change with no
delay. Under /v1, so the API keys guard them as any route there.
"""

from __future__ import annotations

from collections.abc import Callable

import grpc
from flask import Flask, Response

from clients.errors import ConduitError

from .context import ShimContext
from .errors import APIError
from .web import engine_metadata, read_body

# An engine from before LoadAdapter says only "Method not found!".
_NO_RPC = ("the engine does not load LoRA adapters at run time (it predates LoadAdapter): upgrade it, or start "
           "its adapters with --lora-modules")
# The engine's refusal -> (HTTP status, vLLM's error type, our code).
_REFUSALS = {
    grpc.StatusCode.UNIMPLEMENTED: (400, "BadRequestError", "lora_runtime_updating_off"),
    grpc.StatusCode.INVALID_ARGUMENT: (400, "BadRequestError", "invalid_lora_adapter"),
    grpc.StatusCode.FAILED_PRECONDITION: (400, "BadRequestError", "lora_runtime_updating_off"),
    grpc.StatusCode.PERMISSION_DENIED: (403, "PermissionDeniedError", "lora_path_not_allowed"),
    grpc.StatusCode.NOT_FOUND: (404, "NotFoundError", "lora_adapter_not_found"),
}


def register_lora_adapters(app: Flask, ctx: ShimContext) -> None:
    @app.post("/v1/load_lora_adapter")
    def load_lora_adapter() -> Response:
        body = read_body()
        name, path = _field(body, "lora_name"), _field(body, "lora_path")
        if not name or not path:
            raise APIError(400, "Both 'lora_name' and 'lora_path' must be provided.", "InvalidUserInput",
                           "lora_name" if not name else "lora_path")
        _engine_says(lambda: ctx.models.load_adapter(name, path, engine_metadata()))
        return Response(f"Success: LoRA adapter '{name}' added successfully.", 200, mimetype="text/plain")

    @app.post("/v1/unload_lora_adapter")
    def unload_lora_adapter() -> Response:
        name = _field(read_body(), "lora_name")
        if not name:
            raise APIError(400, "'lora_name' must be provided.", "InvalidUserInput", "lora_name")
        _engine_says(lambda: ctx.models.unload_adapter(name, engine_metadata()))
        return Response(f"Success: LoRA adapter '{name}' removed successfully.", 200, mimetype="text/plain")


def _field(body: dict, name: str) -> str:
    """A string field of the JSON body ("" when absent); 400 naming it when it is not a string."""
    value = body.get(name, "")
    if value is None:
        return ""
    if not isinstance(value, str):
        raise APIError(400, f"'{name}' must be a string.", "InvalidUserInput", name)
    return value


def _engine_says(call: Callable[[], None]) -> None:
    """The engines' refusal as vLLM's error (other failures: the shim's usual mapping)."""
    try:
        call()
    except ConduitError as error:
        if error.code not in _REFUSALS:
            raise
        status, kind, code = _REFUSALS[error.code]
        message = _NO_RPC if error.code == grpc.StatusCode.UNIMPLEMENTED else error.message
        raise APIError(status, message, kind, None, code) from None
