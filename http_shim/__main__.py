"""Entry point: `python -m http_shim --engine HOST:PORT --host 127.0.0.1 --port 8000`."""

# gevent must patch the standard library, and grpc must learn to yield to gevent, before anything
# else imports socket, threading or grpc.
from gevent import monkey

monkey.patch_all()

import grpc.experimental.gevent  # noqa: E402

grpc.experimental.gevent.init_gevent()

if __name__ == "__main__":
    # As early as gevent allows: a launcher killed meanwhile must not leave this shim running.
    from clients.lifetime import die_with_parent

    die_with_parent()

import argparse  # noqa: E402
import os  # noqa: E402
from collections.abc import Callable, Sequence  # noqa: E402

from clients.engine_client import EngineClient  # noqa: E402
from clients.replicas import split_addresses  # noqa: E402
from conduit.v1.contract import ENGINE_TOKEN_ENV  # noqa: E402

from .app import ENGINE_CHANNEL_OPTIONS, ShimConfig, create_app  # noqa: E402
from clients.logs import configure_logging  # noqa: E402
from .options import add_hardening_args, hardening_config  # noqa: E402
from .server import serve  # noqa: E402


def _parse_args() -> argparse.Namespace:
    env = os.environ.get
    parser = argparse.ArgumentParser(prog="python -m http_shim", description=__doc__)
    parser.add_argument("--engine", action="append", metavar="ADDRESS",
                        help="engine gRPC address HOST:PORT, or dns:///NAME:PORT for every replica behind a name; "
                             "repeat it or give A,B for several engines (replicas of a model, or other models); "
                             "env CONDUIT_ENGINE, default 127.0.0.1:50051")
    parser.add_argument("--host", default=env("CONDUIT_HOST", "127.0.0.1"))
    parser.add_argument("--port", type=int, default=int(env("CONDUIT_PORT", "8000")), help="0 picks a free port")
    parser.add_argument(
        "--heartbeat-interval",
        type=float,
        default=float(env("CONDUIT_HEARTBEAT_S", "5")),
        help="seconds of stream silence before an SSE keep-alive comment",
    )
    parser.add_argument(
        "--request-timeout",
        type=float,
        default=float(env("CONDUIT_REQUEST_TIMEOUT_S", "0")),
        help="deadline of each generation in seconds; 0 means none",
    )
    parser.add_argument("--log-level", default=env("CONDUIT_LOG_LEVEL", "INFO"))
    add_hardening_args(parser)  # keys, limits, drain, log format (options.py)
    _add_engine_security_args(parser)
    args = parser.parse_args()
    args.engine = split_addresses(args.engine or [env("CONDUIT_ENGINE", "127.0.0.1:50051")])
    args.hardening = hardening_config(parser, args)
    return args


def _add_engine_security_args(parser: argparse.ArgumentParser) -> None:
    """How the shim reaches an engine that requires a token and/or TLS (engine_service --auth-token, --tls-*)."""
    env = os.environ.get
    group = parser.add_argument_group("secured engine")
    group.add_argument("--engine-token", default=env(ENGINE_TOKEN_ENV),
                       help=f"sent as 'authorization: Bearer TOKEN' on every engine call (env {ENGINE_TOKEN_ENV})")
    group.add_argument("--engine-tls-ca", default=env("CONDUIT_ENGINE_TLS_CA"),
                       help="TLS to the engine, verified with this CA's PEM (env CONDUIT_ENGINE_TLS_CA)")
    group.add_argument("--engine-tls-cert", default=env("CONDUIT_ENGINE_TLS_CERT"),
                       help="mutual TLS: the shim's client certificate (env CONDUIT_ENGINE_TLS_CERT)")
    group.add_argument("--engine-tls-key", default=env("CONDUIT_ENGINE_TLS_KEY"),
                       help="its private key (env CONDUIT_ENGINE_TLS_KEY)")


def _engine_connector(args: argparse.Namespace) -> Callable[[str | Sequence[str]], EngineClient]:
    """Makes the shim's engine clients (one per model group), all with the engine flags' security."""

    def connect(target: str | Sequence[str]) -> EngineClient:
        return EngineClient(target, options=ENGINE_CHANNEL_OPTIONS, token=args.engine_token or None,
                            tls_ca=args.engine_tls_ca, tls_cert=args.engine_tls_cert, tls_key=args.engine_tls_key)

    return connect


def main() -> None:
    args = _parse_args()
    configure_logging(args.log_level, args.log_format)
    config = ShimConfig(
        engine=args.engine[0] if len(args.engine) == 1 else args.engine,
        heartbeat_s=args.heartbeat_interval,
        request_timeout_s=args.request_timeout or None,
        **args.hardening,
    )

    def listening(port: int) -> None:
        print(f"http_shim listening on http://{args.host}:{port} (engine {','.join(args.engine)})", flush=True)

    # SIGTERM/SIGINT drain: running generations finish (up to --drain-seconds), then exit 0.
    serve(create_app(config, _engine_connector(args)), args.host, args.port, args.drain_seconds, listening)


if __name__ == "__main__":
    main()
