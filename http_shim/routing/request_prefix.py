"""A request's prompt as the router's two prefix views name it: text blocks (prefix.py) and token blocks
(kv_index.py). The token ids come from an engine's Tokenize, which renders a chat through Generate's own
code: exact, where a tokenizer and template in the shim would not be (the engine's own tool prompt is
model-specific code). One call per request at most, only when the router has a choice to make; a request
it fails for is routed by text.
"""

from __future__ import annotations

import logging

from clients.engine_client import EngineClient, Metadata
from clients.errors import ConduitError
from conduit.v1 import engine_pb2 as pb

from .kv_index import token_blocks
from .prefix import BLOCK_CHARS, chained_blocks, namespace, prompt_text

log = logging.getLogger("http_shim.routing")

TOKENIZE_TIMEOUT_S = 2.0
# Shorter prompts are placed by load alone (as the text view does under one block): their prefill is cheap,
# and their blocks, mostly the template's own, would draw a burst of them to the first replica holding it.
MIN_PROMPT_TOKENS = 256


class RequestPrefix:
    def __init__(self, model: str, request: pb.GenerateRequest, metadata: Metadata = ()) -> None:
        self.model = model
        self.request = request
        self.metadata = metadata
        text = prompt_text(request)
        self.chars = len(text)
        self.text = chained_blocks(text, BLOCK_CHARS, namespace(model))  # apart per model: an adapter's too
        self._ids: list[int] | None = None
        self._asked = False

    def token_ids(self, client: EngineClient) -> list[int] | None:
        """The prompt's token ids (asked of `client` once); None when it could not tell."""
        if not self._asked:
            self._asked = True
            kind = self.request.WhichOneof("input")
            if kind == "chat":
                asked = pb.TokenizeRequest(model=self.model, chat=self.request.chat, constraint=self.request.constraint)
            elif kind == "text":
                asked = pb.TokenizeRequest(model=self.model, text=self.request.text)
            else:  # token ids are the ids
                self._ids = list(self.request.token_ids.ids)
                return self._ids
            try:
                self._ids = list(client.tokenize(request=asked, timeout=TOKENIZE_TIMEOUT_S,
                                                 metadata=self.metadata).token_ids)
            except ConduitError as error:  # a bad request fails in Generate, with its own error
                log.info("tokenize for routing failed (%s): routed by text", error.code.name)
        return self._ids

    def token_blocks(self, client: EngineClient, block_size: int, lora_name: str = "") -> list[int] | None:
        """The prompt's token blocks (under the LoRA adapter `lora_name`, "" for a base model); none for a
        prompt under MIN_PROMPT_TOKENS; None when unknown."""
        if self.chars < MIN_PROMPT_TOKENS // 2:  # not asked: a token is nearly always a character or more (the template
            return []  # would have to add over MIN_PROMPT_TOKENS / 2 tokens of its own)
        ids = self.token_ids(client)
        if ids is None:
            return None
        return token_blocks(ids, block_size, lora_name) if len(ids) >= MIN_PROMPT_TOKENS else []
