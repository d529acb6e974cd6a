"""An approximate view of which prompt prefixes each replica's KV cache holds, on the prompt's text: the
shim holds no tokenizer (nothing model-specific lives here), so it hashes the input in chained BLOCK_CHARS
blocks. Each replica remembers what it was sent, least recently used out, bounded by its cache's size and
aged out after MAX_AGE_S. It costs nothing per request and is right whenever this shim filled the cache;
the router uses it where an engine publishes no KV events (kv_index.py is the exact view).
"""

from __future__ import annotations

import json
import math
import time
from collections import OrderedDict
from itertools import takewhile

from conduit.v1 import engine_pb2 as pb

BLOCK_CHARS = 256
# Characters per token, to size a view from its cache's tokens: generous (English runs 4-6), since a view
# that forgets before the engine does moves prefixes for nothing; one remembering longer costs only a miss.
CHARS_PER_TOKEN = 8
# Before the engine reported its cache: room for this many blocks (about 130k tokens).
DEFAULT_CAPACITY_BLOCKS = 4096
# Prefixes not seen for this long are forgotten (the engine has likely evicted them under other load).
MAX_AGE_S = 600.0


def prompt_text(request: pb.GenerateRequest) -> str:
    """The request's input as text, in the order a chat template renders it (tools, then turns)."""
    kind = request.WhichOneof("input")
    if kind == "text":
        return request.text
    if kind == "token_ids":
        return ",".join(map(str, request.token_ids.ids))
    if kind != "chat":
        return ""
    parts = [json.dumps([[t.name, t.description, t.parameters_json] for t in request.chat.tools])
             if request.chat.tools else ""]
    for message in request.chat.messages:
        calls = "".join(f"{c.name}({c.arguments})" for c in message.tool_calls)
        parts.append(f"\x1e{message.role}\x1f{message.name}\x1f{message.content}{calls}")
    return "".join(parts)


def prefix_blocks(request: pb.GenerateRequest) -> list[int]:
    """Chained hashes of the input's whole BLOCK_CHARS blocks (a short input has none)."""
    return chained_blocks(prompt_text(request), BLOCK_CHARS)


def namespace(name: str) -> int:
    """Where a chain of blocks starts for a LoRA adapter `name` ("": the base model, 0): the same tokens under
    another adapter hold other keys and values, so their blocks must not match."""
    return hash(("lora", name)) if name else 0


def chained_blocks(items: str | tuple[int, ...], size: int, start: int = 0) -> list[int]:
    """Hashes of the whole `size`-long blocks of `items`, each chained to the one before (the first to
    `start`: namespace()): a block's hash stands for the whole prefix up to its end."""
    hashes, chained = [], start
    for start in range(0, len(items) - size + 1, size):
        chained = hash((chained, items[start:start + size]))
        hashes.append(chained)
    return hashes


class PrefixIndex:
    """The block hashes one replica was sent, least recently used first."""

    def __init__(self, capacity_blocks: int = DEFAULT_CAPACITY_BLOCKS, max_age_s: float = MAX_AGE_S) -> None:
        self.capacity = capacity_blocks
        self.max_age_s = max_age_s
        self._seen: OrderedDict[int, float] = OrderedDict()  # hash -> when last sent

    def __len__(self) -> int:
        return len(self._seen)

    def size_for_cache(self, num_blocks: int, block_size: int) -> None:
        """Bound the view by what the engine's cache holds (its report), in text blocks."""
        capacity = max(1, num_blocks * block_size * CHARS_PER_TOKEN // BLOCK_CHARS)
        if num_blocks and block_size and capacity != self.capacity:
            self.capacity = capacity
            self._evict(time.monotonic())

    def match(self, blocks: list[int]) -> int:
        """How many of `blocks`, from the first, this replica was sent (recently enough)."""
        oldest = time.monotonic() - self.max_age_s
        return len(list(takewhile(lambda block: self._seen.get(block, -math.inf) >= oldest, blocks)))

    def add(self, blocks: list[int]) -> None:
        now = time.monotonic()
        for block in blocks:
            self._seen[block] = now
            self._seen.move_to_end(block)
        self._evict(now)

    def clear(self) -> None:
        self._seen.clear()

    def _evict(self, now: float) -> None:
        while self._seen and (len(self._seen) > self.capacity
                              or next(iter(self._seen.values())) < now - self.max_age_s):
            self._seen.popitem(last=False)
