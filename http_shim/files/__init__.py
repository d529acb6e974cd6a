"""OpenAI's Files API (/v1/files): files uploaded for vector stores (purpose `assistants`, `user_data`)
and batches (`batch`). store.py keeps them (disk + SQLite, or memory), upload.py streams an upload in
within the limits, protocol.py types the fields, routes.py serves them per tenant."""

from .routes import FILES_ROUTE, file_not_found, register_files
from .store import DEFAULT_MAX_FILE_BYTES, DEFAULT_MAX_STORE_BYTES, FileLimits, FileStore, TooLarge

__all__ = ["FILES_ROUTE", "file_not_found", "register_files", "FileLimits", "FileStore", "TooLarge",
           "DEFAULT_MAX_FILE_BYTES", "DEFAULT_MAX_STORE_BYTES"]
