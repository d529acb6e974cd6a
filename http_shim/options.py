"""The shim's command line: every flag, each with an environment variable (flags win).

The variables are CONDUIT_<FLAG> (clients/cli.py), except the older names kept here:
CONDUIT_HEARTBEAT_S, CONDUIT_REQUEST_TIMEOUT_S, CONDUIT_DRAIN_S, and CONDUIT_API_KEYS (plus
CONDUIT_API_KEY, one key) for --api-key.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence

from clients.http_proxy import proxy_url
from clients.replicas import split_addresses

from conduit_common.cli import EnvArgumentParser, prog_name
from conduit_common.logs import LOG_FORMATS
from conduit.v1.contract import (ENGINE_TOKEN_ENV, KEEPALIVE_TIME_S, KEEPALIVE_TIMEOUT_S, MAX_N, MAX_STOP_STRINGS,
                                 MIN_PING_INTERVAL_S, keepalive_options)

from .app import DEFAULT_MAX_BODY_BYTES, ShimConfig
from .auth import KEY_ENV, KEYS_ENV, collect_keys
from .cors import CorsPolicy, normal_origin
from .batches import DEFAULT_MAX_IN_FLIGHT as DEFAULT_BATCH_IN_FLIGHT
from .files import DEFAULT_MAX_FILE_BYTES, DEFAULT_MAX_STORE_BYTES, FileLimits
from .retrieval import DEFAULT_RETRIEVAL_MODEL
from .limits import DEFAULT_LIMITS, RequestLimits
from .mcp import (ALLOWED_URLS_ENV, ALLOWED_URLS_FLAG, DEFAULT_CALL_TIMEOUT_S, DEFAULT_MAX_RESULT_CHARS,
                  DEFAULT_REQUEST_TIMEOUT_S, McpConfig)
from .mcp.allowlist import AllowedUrls
from .responses import DEFAULT_MAX_AGE_S, DEFAULT_MAX_RESPONSES, IN_MEMORY, StoreLimits
from .routing import (DEFAULT_BALANCE_ABS, DEFAULT_BALANCE_REL, DEFAULT_POLICY, DEFAULT_PREFIX_VIEW, POLICIES,
                      PREFIX_VIEWS, RoutingConfig)
from .server import DEFAULT_DRAIN_S, DEFAULT_MAX_CONNECTIONS, DEFAULT_READ_TIMEOUT_S

DEFAULT_ENGINE = "127.0.0.1:50051"
# A browser's Origin header: scheme, host and an optional port, nothing after.
_ORIGIN = re.compile(r"[a-z][a-z0-9+.-]*://[^/\s?#]+", re.IGNORECASE)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The flags and variables, checked: a bad value ends the program with a usage error (exit 2).
    `engine` becomes the list of addresses, `keepalive` the engine channels' options, `config` the ShimConfig."""
    parser = build_parser()
    args = parser.parse_args(argv)
    args.engine = split_addresses(args.engine or [DEFAULT_ENGINE])
    try:
        args.keepalive = keepalive_options(args.engine_keepalive, args.engine_keepalive_timeout)
    except ValueError as error:
        parser.error(f"--engine-keepalive, --engine-keepalive-timeout: {error}")
    args.config = shim_config(parser, args)
    return args


def shim_config(parser: argparse.ArgumentParser, args: argparse.Namespace) -> ShimConfig:
    """The ShimConfig the flags give; bad values end the program with a usage error."""
    if args.max_body_bytes < 1:
        parser.error("--max-body-bytes must be positive")
    if args.batch_max_in_flight < 1:
        parser.error("--batch-max-in-flight must be positive")
    if args.read_timeout < 0 or args.max_connections < 1:
        parser.error("--read-timeout must be >= 0 and --max-connections positive")
    for origin in args.cors_allow_origin:
        if origin != "*" and not _ORIGIN.fullmatch(origin):
            parser.error(f"--cors-allow-origin {origin!r}: an origin is scheme://host[:port] with no path, or *")
    try:  # each part checks its own values (ValueError, SecretError included)
        return ShimConfig(
            engine=args.engine[0] if len(args.engine) == 1 else args.engine,
            heartbeat_s=args.heartbeat_interval,
            request_timeout_s=args.request_timeout or None,
            # environ={}: the parser has already read the key variables into --api-key.
            api_keys=collect_keys(args.api_key, args.api_key_file, environ={}),
            max_body_bytes=args.max_body_bytes,
            limits=RequestLimits(max_tokens=args.max_tokens_limit or None, max_n=args.max_n, max_stop=args.max_stop,
                                 max_messages=args.max_messages, max_prompt_chars=args.max_prompt_chars),
            cors=CorsPolicy(tuple(normal_origin(origin) for origin in args.cors_allow_origin)),
            responses_store_dir=args.responses_store_dir,
            responses_store_limits=StoreLimits(args.responses_store_max, args.responses_store_max_age),
            routing=RoutingConfig(args.routing, args.routing_balance_abs, args.routing_balance_rel,
                                  args.routing_prefix_view),
            files_limits=FileLimits(args.files_max_bytes, args.files_store_max_bytes),
            retrieval_model=args.retrieval_model,
            mcp=mcp_config(parser, args),
            batch_max_in_flight=args.batch_max_in_flight,
        )
    except ValueError as error:
        parser.error(str(error))


def mcp_config(parser: argparse.ArgumentParser, args: argparse.Namespace) -> McpConfig:
    allowed = AllowedUrls.of(args.mcp_allowed_urls)  # a bad entry: a ValueError naming it (a usage error)
    if args.mcp_call_timeout <= 0 or args.mcp_request_timeout <= 0 or args.mcp_max_result_chars < 1:
        parser.error("--mcp-call-timeout, --mcp-request-timeout and --mcp-max-result-chars must be positive")
    return McpConfig(tuple(str(p) for p in allowed.prefixes), args.mcp_call_timeout, args.mcp_request_timeout,
                     args.mcp_max_result_chars)


def build_parser() -> EnvArgumentParser:
    parser = EnvArgumentParser(prog=prog_name("conduit-shim", "http_shim"),
                               description="Conduit's OpenAI-compatible HTTP API, in front of one or more engines.")
    parser.add_argument("--engine", action="append", default=[], metavar="ADDRESS",
                        help="engine gRPC address HOST:PORT, or dns:///NAME:PORT for every replica behind a name; "
                             "repeat it or give A,B for several engines (replicas of a model, or other models); "
                             f"default {DEFAULT_ENGINE}")
    parser.add_argument("--engine-proxy", type=_engine_proxy, metavar="URL", default=None,
                        help="HTTP CONNECT proxy http://[USER:PASSWORD@]HOST:PORT for the engine channels (hosts that "
                             "no_grpc_proxy or no_proxy lists still go direct); default none: engine channels ignore "
                             "grpc_proxy, https_proxy and http_proxy")
    parser.add_argument("--host", default="127.0.0.1", help="where HTTP listens")
    parser.add_argument("--port", type=int, default=8000, help="HTTP port; 0 picks a free port")
    parser.add_argument("--heartbeat-interval", type=float, metavar="S", default=5.0, env="CONDUIT_HEARTBEAT_S",
                        help="seconds of stream silence before an SSE keep-alive comment, which is also how a "
                             "departed client is noticed")
    parser.add_argument("--request-timeout", type=float, metavar="S", default=0.0, env="CONDUIT_REQUEST_TIMEOUT_S",
                        help="deadline of each generation in seconds; 0 means none")
    parser.add_argument("--log-level", default="INFO", help="Python logging level")
    add_hardening_args(parser)
    add_engine_security_args(parser)
    add_engine_keepalive_args(parser)
    add_responses_store_args(parser)
    add_routing_args(parser)
    add_mcp_args(parser)
    return parser


def add_mcp_args(parser: EnvArgumentParser) -> None:
    """Which MCP servers the Responses API's mcp tool may reach, and its limits (docs/mcp.md)."""
    group = parser.add_argument_group("remote MCP tools (docs/mcp.md)")
    group.add_argument(ALLOWED_URLS_FLAG, action="append", default=[], metavar="URLS", env=ALLOWED_URLS_ENV,
                       help="URL prefixes of the MCP servers the mcp tool may reach, comma-separated or repeated "
                            "(http://127.0.0.1:8931/,https://mcp.example.com/tools); compared as scheme, host, port "
                            "and whole path segments; default none: the mcp tool is refused (400)")
    group.add_argument("--mcp-call-timeout", type=float, metavar="S", default=DEFAULT_CALL_TIMEOUT_S,
                       help="seconds one MCP listing or call may take, connecting included (else it fails, and the "
                            "response goes on)")
    group.add_argument("--mcp-request-timeout", type=float, metavar="S", default=DEFAULT_REQUEST_TIMEOUT_S,
                       help="seconds all of one response's MCP listings and calls may take together")
    group.add_argument("--mcp-max-result-chars", type=int, metavar="N", default=DEFAULT_MAX_RESULT_CHARS,
                       help="longest tool output kept and shown to the model; the rest is cut, with a note")


def _engine_proxy(value: str) -> str:
    """--engine-proxy's value, checked (a usage error in the clients' words)."""
    try:
        return proxy_url(value)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def add_routing_args(parser: EnvArgumentParser) -> None:
    """How calls are spread over several replicas of a model (http_shim/routing/)."""
    group = parser.add_argument_group("routing over replicas (several --engine addresses or a dns:/// name)")
    group.add_argument("--routing", choices=POLICIES, default=DEFAULT_POLICY,
                       help="cache_aware: a request goes where its prompt's prefix was sent (its prefill is "
                            "cached there) unless that replica is loaded well beyond the least loaded; "
                            "least_load: fewest running and waiting requests; round_robin: each in turn")
    group.add_argument("--routing-balance-abs", type=int, metavar="N", default=DEFAULT_BALANCE_ABS,
                       help="cache_aware leaves a prefix's replica when it has more than N requests more than "
                            "the least loaded ...")
    group.add_argument("--routing-balance-rel", type=float, metavar="X", default=DEFAULT_BALANCE_REL,
                       help="... and more than X times as many")
    group.add_argument("--routing-prefix-view", choices=PREFIX_VIEWS, default=DEFAULT_PREFIX_VIEW,
                       help="what cache_aware knows of each replica's cache: kv_events, the engines' own KV events "
                            "(exact; each prompt tokenized by an engine) where every replica publishes them, else "
                            "text; text, the prompt text this shim sent each replica (approximate, no call)")


def add_responses_store_args(parser: EnvArgumentParser) -> None:
    """Where the Responses API keeps stored responses (http_shim/responses/store.py), and how many."""
    group = parser.add_argument_group("responses store")
    group.add_argument("--responses-store-dir", metavar="DIR", default=None,
                       help="folder of the SQLite file holding stored responses (one per shim; shims do not share "
                            f"it); {IN_MEMORY} keeps them in memory only (lost at exit), '' keeps none; "
                            "default $XDG_STATE_HOME/conduit (~/.local/state/conduit)")
    group.add_argument("--responses-store-max", type=int, metavar="N", default=DEFAULT_MAX_RESPONSES,
                       help="most stored responses; the oldest are evicted first")
    group.add_argument("--responses-store-max-age", type=float, metavar="S", default=DEFAULT_MAX_AGE_S,
                       help="seconds a stored response is kept (default 30 days)")
    group.add_argument("--files-max-bytes", type=int, metavar="N", default=DEFAULT_MAX_FILE_BYTES,
                       help="largest file /v1/files accepts (413 past it, checked while the upload streams); files "
                            "live in the store folder's files/ (in memory with :memory:; no Files API with '')")
    group.add_argument("--retrieval-model", metavar="MODEL", default=DEFAULT_RETRIEVAL_MODEL,
                       help="the served embedding model that vector stores and the file_search tool embed with; "
                            "auto: all-MiniLM-L6-v2 when served (make run-stack), else the first served model "
                            "whose engine embeds")
    group.add_argument("--files-store-max-bytes", type=int, metavar="N", default=DEFAULT_MAX_STORE_BYTES,
                       help="most bytes of all files together")
    group.add_argument("--batch-max-in-flight", type=int, metavar="N", default=DEFAULT_BATCH_IN_FLIGHT,
                       help="Batch API requests (all batches together) in the engines at once, at batch priority "
                            "(docs/batches.md); batches live in the store folder's batches.sqlite3")


def add_hardening_args(parser: EnvArgumentParser) -> None:
    """Keys, limits, drain, log format."""
    parser.add_argument("--api-key", action="append", default=[], metavar="KEY",
                        env=(KEYS_ENV, KEY_ENV), env_adds=True,
                        help="require 'Authorization: Bearer KEY' on /v1 routes; repeatable")
    parser.add_argument("--api-key-file", action="append", default=[], metavar="PATH", env_adds=True,
                        help="file of accepted keys, one per line (blank lines and # comments ignored); repeatable; "
                             "a file without keys stops the shim at start")
    parser.add_argument("--max-body-bytes", type=int, metavar="N", default=DEFAULT_MAX_BODY_BYTES,
                        help="larger request bodies get 413, chunked ones too")
    limit = DEFAULT_LIMITS
    parser.add_argument("--max-tokens-limit", type=int, metavar="N", default=0,
                        help="largest max_tokens / max_completion_tokens accepted, and the limit of requests that set "
                             "neither; 0: what the context leaves")
    parser.add_argument("--max-n", type=int, metavar="N", default=limit.max_n,
                        help=f"largest n and best_of (<= {MAX_N})")
    parser.add_argument("--max-stop", type=int, metavar="N", default=limit.max_stop,
                        help=f"most stop strings (<= {MAX_STOP_STRINGS})")
    parser.add_argument("--max-messages", type=int, metavar="N", default=limit.max_messages, help="most chat messages")
    parser.add_argument("--max-prompt-chars", type=int, metavar="N", default=limit.max_prompt_chars,
                        help="most characters of prompt text (chat: message contents, names, tool-call arguments and "
                             "tool definitions; completions: prompts, a token-id prompt counting one per id)")
    parser.add_argument("--drain-seconds", type=float, metavar="S", default=DEFAULT_DRAIN_S, env="CONDUIT_DRAIN_S",
                        help="on SIGTERM/SIGINT, how long running generations may finish before they are cut")
    parser.add_argument("--read-timeout", type=float, metavar="S", default=DEFAULT_READ_TIMEOUT_S,
                        help="seconds a client may take to send a request's headers and body (else 408 and the "
                             "connection closes; idle keep-alive connections close too); responses, SSE streams "
                             "included, are not bounded; 0 means no bound")
    parser.add_argument("--max-connections", type=int, metavar="N", default=DEFAULT_MAX_CONNECTIONS,
                        help="connections served at once (each stream holds one); more wait to be accepted")
    parser.add_argument("--log-format", choices=LOG_FORMATS, default="text",
                        help="json: one object per line (ts, level, logger, msg, request_id: null for lines about "
                             "no request, exc: a traceback)")
    parser.add_argument("--cors-allow-origin", action="append", default=[], metavar="ORIGIN",
                        help="let web pages on ORIGIN (scheme://host[:port], or * for any, never with "
                             "credentials) call the API from a browser; repeatable; default none (CORS off)")


def add_engine_security_args(parser: EnvArgumentParser) -> None:
    """How the shim reaches an engine that requires a token and/or TLS (engine_service --auth-token, --tls-*)."""
    group = parser.add_argument_group("secured engine")
    group.add_argument("--engine-token", metavar="TOKEN", env=ENGINE_TOKEN_ENV,
                       help="sent as 'authorization: Bearer TOKEN' on every engine call")
    group.add_argument("--engine-tls-ca", metavar="PEM", help="TLS to the engine, verified with this CA's PEM")
    group.add_argument("--engine-tls-cert", metavar="PEM", help="mutual TLS: the shim's client certificate")
    group.add_argument("--engine-tls-key", metavar="PEM", help="its private key")


def add_engine_keepalive_args(parser: EnvArgumentParser) -> None:
    """How soon a dead or frozen engine's calls fail (conduit/v1/contract.py: keepalive)."""
    group = parser.add_argument_group("dead engines", "an engine that stops answering (host gone, process frozen) "
                                      "fails its calls within about keepalive + timeout seconds of its last message")
    group.add_argument("--engine-keepalive", type=float, metavar="S", default=KEEPALIVE_TIME_S,
                       help=f"seconds between keepalive pings to each engine (>= {MIN_PING_INTERVAL_S:g})")
    group.add_argument("--engine-keepalive-timeout", type=float, metavar="S", default=KEEPALIVE_TIMEOUT_S,
                       help="seconds a ping may go unanswered before the engine's connection is dropped and its "
                            "calls fail (those that answered nothing yet are tried on another replica)")
