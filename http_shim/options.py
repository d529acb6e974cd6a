"""The shim's hardening flags (keys, limits, drain, logs), kept apart from __main__'s engine flags.

Every flag has an environment variable (CONDUIT_...) for containers; flags win.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from conduit.v1.contract import MAX_N, MAX_STOP_STRINGS

from .app import DEFAULT_MAX_BODY_BYTES
from .auth import KEYS_ENV, KeyFileError, collect_keys
from clients.logs import LOG_FORMATS
from .openai_to_proto import DEFAULT_LIMITS, RequestLimits
from .server import DEFAULT_DRAIN_S


def add_hardening_args(parser: argparse.ArgumentParser) -> None:
    env = os.environ.get
    parser.add_argument(
        "--api-key",
        action="append",
        default=[],
        help=f"require 'Authorization: Bearer KEY' on /v1 routes; repeatable (also env {KEYS_ENV}, comma-separated)",
    )
    parser.add_argument(
        "--api-key-file",
        action="append",
        default=[p for p in [env("CONDUIT_API_KEY_FILE")] if p],
        help="file of accepted keys, one per line (blank lines and # comments ignored); repeatable",
    )
    parser.add_argument(
        "--max-body-bytes",
        type=int,
        default=int(env("CONDUIT_MAX_BODY_BYTES", str(DEFAULT_MAX_BODY_BYTES))),
        help="larger request bodies get 413",
    )
    limit = DEFAULT_LIMITS
    parser.add_argument(
        "--max-tokens-limit",
        type=int,
        default=int(env("CONDUIT_MAX_TOKENS_LIMIT", "0")),
        help="largest max_tokens / max_completion_tokens accepted; 0: what the context leaves",
    )
    parser.add_argument(
        "--max-n", type=int, default=int(env("CONDUIT_MAX_N", str(limit.max_n))), help=f"largest n and best_of (<= {MAX_N})"
    )
    parser.add_argument(
        "--max-stop",
        type=int,
        default=int(env("CONDUIT_MAX_STOP", str(limit.max_stop))),
        help=f"most stop strings (<= {MAX_STOP_STRINGS})",
    )
    parser.add_argument(
        "--max-messages", type=int, default=int(env("CONDUIT_MAX_MESSAGES", str(limit.max_messages))), help="most chat messages"
    )
    parser.add_argument(
        "--max-prompt-chars",
        type=int,
        default=int(env("CONDUIT_MAX_PROMPT_CHARS", str(limit.max_prompt_chars))),
        help="most characters of prompt text (chat: contents, tool calls and tools; completions: prompts)",
    )
    parser.add_argument(
        "--drain-seconds",
        type=float,
        default=float(env("CONDUIT_DRAIN_S", str(DEFAULT_DRAIN_S))),
        help="on SIGTERM/SIGINT, how long running generations may finish before they are cut",
    )
    parser.add_argument(
        "--log-format", choices=LOG_FORMATS, default=env("CONDUIT_LOG_FORMAT", "text"), help="json: one object per line"
    )


def hardening_config(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, Any]:
    """ShimConfig fields from the flags; bad values end the program with a usage error."""
    try:
        keys = collect_keys(args.api_key, args.api_key_file)
        limits = RequestLimits(
            max_tokens=args.max_tokens_limit or None,
            max_n=args.max_n,
            max_stop=args.max_stop,
            max_messages=args.max_messages,
            max_prompt_chars=args.max_prompt_chars,
        )
    except (KeyFileError, ValueError) as error:
        parser.error(str(error))
    if args.max_body_bytes < 1:
        parser.error("--max-body-bytes must be positive")
    return {"api_keys": keys, "max_body_bytes": args.max_body_bytes, "limits": limits}
