"""Reads a multipart/form-data upload as it arrives (werkzeug's sans-IO decoder over the raw WSGI
input), streaming the `file` part into the store and keeping the other fields (small: capped), so a
file of any size costs no memory and a too-large one is refused at the byte that crosses the limit."""

from __future__ import annotations

from dataclasses import dataclass, field

from flask import request
from werkzeug.datastructures import Headers
from werkzeug.exceptions import RequestEntityTooLarge
from werkzeug.http import parse_options_header
from werkzeug.sansio.multipart import Data, Epilogue, Field, File, MultipartDecoder, NeedData

from ..connection import ABANDON_BODY_KEY, READ_DONE_KEY, request_timeout_error
from ..errors import APIError, invalid
from .store import FileStore, TooLarge, Upload

MAX_FIELD_BYTES = 4096  # purpose, expires_after[...]: a few words
READ_PIECE = 64 * 1024


@dataclass
class ReceivedUpload:
    fields: dict[str, str] = field(default_factory=dict)
    filename: str | None = None
    upload: Upload | None = None


def _too_large(message: str) -> APIError:
    request.environ[ABANDON_BODY_KEY] = True  # the rest is not read: the connection cannot carry another request
    return APIError(413, message, "invalid_request_error", "file", "file_too_large", {"Connection": "close"})


def receive_upload(files: FileStore) -> ReceivedUpload:
    """The form's fields and the `file` part streamed into an Upload (uncommitted: the caller commits or
    aborts it). Raises a 400 for a body that is not such a form, a 413 past a limit (nothing kept)."""
    mimetype, options = parse_options_header(request.headers.get("Content-Type", ""))
    if mimetype != "multipart/form-data" or "boundary" not in options:
        raise invalid("Uploads must be multipart/form-data with a 'file' part and a 'purpose' field.", "file")
    length = request.content_length
    if length is not None and length > files.limits.max_file_bytes + 64 * 1024:
        raise _too_large(f"The upload is larger than this server's limit of {files.limits.max_file_bytes} bytes "
                         "per file.")
    # No memory cap in the decoder: it counts its whole buffer, a piece of the file included; fields are
    # capped below, and the file streams out as it comes.
    decoder = MultipartDecoder(options["boundary"].encode())
    received = ReceivedUpload()
    current: str | None = None  # the field being read, or "\0file" while the file streams
    value = bytearray()
    wsgi_input = request.environ["wsgi.input"]
    try:
        while True:
            event = decoder.next_event()
            if isinstance(event, NeedData):
                try:
                    piece = wsgi_input.read(READ_PIECE)
                except TimeoutError:
                    request.environ[ABANDON_BODY_KEY] = True
                    raise request_timeout_error() from None
                decoder.receive_data(piece or None)
            elif isinstance(event, File) and event.name == "file" and received.upload is None:
                received.filename = _basename(event.filename, event.headers)
                received.upload = files.begin_upload()
                current = "\0file"
            elif isinstance(event, (Field, File)):
                current, value = event.name, bytearray()
            elif isinstance(event, Data):
                if current == "\0file":
                    received.upload.write(event.data)
                elif current is not None:
                    value += event.data
                    if len(value) > MAX_FIELD_BYTES:
                        raise ValueError("a form field past its cap")
                    if not event.more_data:
                        received.fields[current] = value.decode("utf-8", "replace")
            elif isinstance(event, Epilogue):
                break
    except TooLarge as error:
        if received.upload is not None:
            received.upload.abort()
        raise _too_large(str(error)) from None
    except (RequestEntityTooLarge, ValueError):  # a field past its cap; a malformed body
        if received.upload is not None:
            received.upload.abort()
        raise invalid("The multipart/form-data body could not be read.", "file") from None
    except BaseException:
        if received.upload is not None:
            received.upload.abort()
        raise
    request.environ.get(READ_DONE_KEY, lambda: None)()
    return received


def _basename(filename: str | None, headers: Headers) -> str:
    """The name the client gave, without any folder (never a path on this server)."""
    name = (filename or "").replace("\\", "/").rsplit("/", 1)[-1]
    return name or "upload"
