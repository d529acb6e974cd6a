"""A request's prompt as the router's two prefix views name it: text blocks (prefix.py) and token blocks
(kv_index.py, matched against what the engines' KV events say they hold).

The engines' events name blocks of token ids, and the shim holds no tokenizer or chat template. The
exact ids come from an engine's Tokenize, which renders a chat (tools, tool choice, answer format)
through the same code as Generate: one unary call per request, asked only when the router has a
choice to make (two replicas or more that publish events) and at most once per request (not again
on a retry elsewhere). The other way, a tokenizer in the shim from the engine's GetTokenizer files
and the chat template rendered here, would not be exact: Conduit's engine adds its own tool prompt
(and answer-format instructions) for templates that know none, and that model-specific code belongs
to the engine (DESIGN.md), so the shim's blocks would differ from the engine's whenever tools or a
format are in play. The call costs about a millisecond on loopback plus the engine's tokenization
(measured in benchmarks/RESULTS.md, `make bench-routing`); a request it fails for is routed by text.
"""

from __future__ import annotations

import logging

from clients.engine_client import EngineClient, Metadata
from clients.errors import ConduitError
from conduit.v1 import engine_pb2 as pb

from .kv_index import token_blocks
from .prefix import prompt_text, text_blocks

log = logging.getLogger("http_shim.routing")

TOKENIZE_TIMEOUT_S = 2.0
# Shorter prompts are placed by load alone, as the text view places inputs under one text block: their
# prefill is cheap, and their blocks are mostly the chat template's boilerplate (a default system
# prompt), which would otherwise draw every short request of a burst to the first replica holding it.
MIN_PROMPT_TOKENS = 256


def tokenize_request(model: str, request: pb.GenerateRequest) -> pb.TokenizeRequest | None:
    """The Tokenize call that gives `request`'s prompt ids; None for token ids (they are the ids)."""
    kind = request.WhichOneof("input")
    if kind == "chat":
        return pb.TokenizeRequest(model=model, chat=request.chat, constraint=request.constraint)
    if kind == "text":
        return pb.TokenizeRequest(model=model, text=request.text)
    return None


class RequestPrefix:
    def __init__(self, model: str, request: pb.GenerateRequest, metadata: Metadata = ()) -> None:
        self.model = model
        self.request = request
        self.metadata = metadata
        text = prompt_text(request)
        self.chars = len(text)
        self.text = text_blocks(text)
        self._ids: list[int] | None = None
        self._asked = False

    def token_ids(self, client: EngineClient) -> list[int] | None:
        """The prompt's token ids (asked of `client` once); None when it could not tell."""
        if not self._asked:
            self._asked = True
            asked = tokenize_request(self.model, self.request)
            if asked is None:
                self._ids = list(self.request.token_ids.ids)
            else:
                try:
                    self._ids = list(client.tokenize(request=asked, timeout=TOKENIZE_TIMEOUT_S,
                                                     metadata=self.metadata).token_ids)
                except ConduitError as error:  # a bad request fails in Generate, with its own error
                    log.info("tokenize for routing failed (%s): routed by text", error.code.name)
        return self._ids

    def token_blocks(self, client: EngineClient, block_size: int) -> list[int] | None:
        """The prompt's token blocks; none for a prompt under MIN_PROMPT_TOKENS; None when unknown."""
        if self.chars < MIN_PROMPT_TOKENS // 2:  # not asked: a token is nearly always a character or more (the template
            return []  # would have to add over MIN_PROMPT_TOKENS / 2 tokens of its own)
        ids = self.token_ids(client)
        if ids is None:
            return None
        return token_blocks(ids, block_size) if len(ids) >= MIN_PROMPT_TOKENS else []
