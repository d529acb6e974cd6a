"""GetTokenizer's answer: the served tokenizer's files as one zip, with its sha256, in chunks.

The files are written from the loaded tokenizer (so a --chat-template override is in them) with
the model's config beside it, whatever the model came from (a folder, a converted GGUF, a hub id).
Built once, off the event loop, on the first call; the gateway fetches it at registration.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

from smg_grpc_proto.generated import common_pb2

CHUNK_BYTES = 64 * 1024  # the gateway's own servicers send 64 KiB chunks


def build(tokenizer, model_config, generation_config=None) -> tuple[bytes, str]:
    """The zip's bytes and their sha256 hex digest."""
    with tempfile.TemporaryDirectory(prefix="conduit-tokenizer-") as folder:
        tokenizer.save_pretrained(folder)
        model_config.to_json_file(str(Path(folder) / "config.json"))
        if generation_config is not None:
            generation_config.to_json_file(str(Path(folder) / "generation_config.json"))
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
            for path in sorted(Path(folder).iterdir()):
                if path.is_file():
                    archive.write(path, path.name)
    data = buffer.getvalue()
    return data, hashlib.sha256(data).hexdigest()


class TokenizerZip:
    def __init__(self, tokenizer, model_config, generation_config=None) -> None:
        self._sources = (tokenizer, model_config, generation_config)
        self._built: tuple[bytes, str] | None = None
        self._lock = asyncio.Lock()

    async def chunks(self) -> Iterator[common_pb2.GetTokenizerChunk]:
        async with self._lock:  # callers during the first build wait for it
            if self._built is None:
                self._built = await asyncio.to_thread(build, *self._sources)
        data, digest = self._built
        return (common_pb2.GetTokenizerChunk(data=data[start:start + CHUNK_BYTES],
                                             sha256=digest if start + CHUNK_BYTES >= len(data) else "")
                for start in range(0, len(data), CHUNK_BYTES))
