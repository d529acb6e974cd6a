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
import logging  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402

import gevent  # noqa: E402
from gevent.pywsgi import WSGIServer  # noqa: E402

from .app import ShimConfig, create_app  # noqa: E402
from .connection import SocketExposingHandler  # noqa: E402


def _parse_args() -> argparse.Namespace:
    env = os.environ.get
    parser = argparse.ArgumentParser(prog="python -m http_shim", description=__doc__)
    parser.add_argument("--engine", default=env("CONDUIT_ENGINE", "127.0.0.1:50051"), help="engine gRPC address")
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
    parser.add_argument(
        "--api-key", default=env("CONDUIT_API_KEY"), help="require 'Authorization: Bearer KEY' on /v1 routes"
    )
    parser.add_argument("--log-level", default=env("CONDUIT_LOG_LEVEL", "INFO"))
    return parser.parse_args()


def main() -> None:
    args = _parse_args()
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    config = ShimConfig(
        engine=args.engine,
        heartbeat_s=args.heartbeat_interval,
        request_timeout_s=args.request_timeout or None,
        api_key=args.api_key or None,
    )
    server = WSGIServer((args.host, args.port), create_app(config), handler_class=SocketExposingHandler)
    server.start()
    gevent.signal_handler(signal.SIGTERM, server.stop, 5)
    gevent.signal_handler(signal.SIGINT, server.stop, 5)
    print(f"http_shim listening on http://{args.host}:{server.server_port} (engine {args.engine})", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
