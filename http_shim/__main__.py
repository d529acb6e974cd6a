"""Entry point: `conduit-shim` (or `python -m http_shim`) --engine HOST:PORT --host 127.0.0.1 --port 8000."""

# gevent must patch the standard library, and grpc must learn to yield to gevent, before anything
# else imports socket, threading or grpc.
from gevent import monkey

monkey.patch_all()

import grpc.experimental.gevent  # noqa: E402

grpc.experimental.gevent.init_gevent()

import grpc._common  # noqa: E402

# grpc's blocking calls wait in 0.1 s slices so that a main thread stuck in a native wait still
# runs signal handlers. Under gevent a wait is a greenlet's and the hub runs the handlers, so each
# slice is only a timer that fires and re-arms: ~10 a second per open stream, about 30% of the
# shim's CPU a relayed token at 32 streams (benchmarks/RESULTS.md). A wait still ends when its
# event arrives; the long slice only keeps grpc's loop.
grpc._common.MAXIMUM_WAIT_TIMEOUT = 60.0

if __name__ == "__main__":
    # As early as gevent allows: a launcher killed meanwhile must not leave this shim running.
    from conduit_common.lifetime import die_with_parent

    die_with_parent()

import argparse  # noqa: E402
import sys  # noqa: E402
from collections.abc import Callable, Sequence  # noqa: E402

from clients.engine_client import EngineClient  # noqa: E402

from .app import create_app  # noqa: E402
from conduit_common.cli import prog_name  # noqa: E402
from conduit_common.logs import configure_logging  # noqa: E402
from .options import parse_args  # noqa: E402
from .responses import StoreError  # noqa: E402
from .server import serve  # noqa: E402

# The shim's channel retries a lost engine at least this often (gRPC's default backoff grows to
# two minutes), so it serves again within seconds of the engine's return.
ENGINE_CHANNEL_OPTIONS = (
    ("grpc.initial_reconnect_backoff_ms", 250),
    ("grpc.min_reconnect_backoff_ms", 250),
    ("grpc.max_reconnect_backoff_ms", 2000),
)


def _engine_connector(args: argparse.Namespace) -> Callable[[str | Sequence[str]], EngineClient]:
    """The shim's engine clients (one per engine address), with the engine flags' security, keepalive and proxy."""
    tls = bool(args.engine_tls_ca or args.engine_tls_cert or args.engine_tls_key)
    options = (*ENGINE_CHANNEL_OPTIONS, *args.keepalive)

    def connect(target: str | Sequence[str], server_name: str | None = None) -> EngineClient:
        """`server_name`: the name the engine's certificate carries, for an address a dns:/// name
        resolved to (the shim dials each replica behind a name by its address)."""
        return EngineClient(target, options=options, proxy=args.engine_proxy, token=args.engine_token or None,
                            tls_ca=args.engine_tls_ca, tls_cert=args.engine_tls_cert, tls_key=args.engine_tls_key,
                            tls_server_name=server_name if tls else None)

    return connect


def main() -> None:
    args = parse_args()  # every flag and its environment variable, and the ShimConfig they give (options.py)
    configure_logging(args.log_level, args.log_format)

    def listening(port: int) -> None:
        print(f"http_shim listening on http://{args.host}:{port} (engine {','.join(args.engine)})", flush=True)

    try:
        app = create_app(args.config, _engine_connector(args))
    except StoreError as error:  # one line, as a usage error: the fix is a flag, not in a traceback
        print(f"{prog_name('conduit-shim', 'http_shim')}: error: {error}", file=sys.stderr)
        sys.exit(2)
    # SIGTERM/SIGINT drain: running generations finish (up to --drain-seconds), then exit 0.
    serve(app, args.host, args.port, args.drain_seconds, listening,
          read_timeout_s=args.read_timeout or None, max_connections=args.max_connections)


if __name__ == "__main__":
    main()
