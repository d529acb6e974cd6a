"""Start the engine and the HTTP shim as local processes, wait until both serve, stop both.

Used by `make run-stack` (`python -m launcher.stack`), by the end-to-end tests and
by the benchmarks. Each process writes stdout and stderr to a log file; when one
fails to come up, the error carries the tail of its log.

A secured stack: `token` is required by the engine and sent by the shim (both learn it from
their environment, not their command line, so `ps` does not show it); `tls` makes the engine
serve TLS with the given certificate and the shim verify it with the CA, and with a client
certificate, mutual TLS (the engine then requires certificates signed by the same CA).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clients.engine_client import EngineClient
from conduit_common.cli import EnvArgumentParser, prog_name
from clients.errors import ConduitError
from conduit_common.lifetime import child_env
from conduit.v1.contract import ENGINE_TOKEN_ENV, ENGINE_TOKENS_ENV

REPO_ROOT = Path(__file__).resolve().parent.parent
LOG_TAIL_LINES = 40
# Readiness probes try to connect every POLL_S: under grpc's default reconnect backoff (1 s, growing
# 1.6x a failure) an engine listening after 10 s was seen ready only at ~16 s.
POLL_S = 0.25
PROBE_CHANNEL_OPTIONS = tuple((f"grpc.{name}_reconnect_backoff_ms", int(POLL_S * 1000))
                              for name in ("initial", "min", "max"))


# The embedding model `conduit-stack` serves beside the chat model unless told none.
DEFAULT_EMBEDDING_MODEL = "all-MiniLM-L6-v2"


def embedding_model_or_none(given: str) -> str | None:
    """--embedding-model's value: "" or "none" is no embedding engine."""
    return None if given in ("", "none") else given


class StackError(RuntimeError):
    """A process of the stack died or did not become ready in time."""


# Ports handed out by free_port in this process, so a stack's engine and shim never get the same.
_handed_out: set[int] = set()
LOWEST_FREE_PORT = 10000


def ephemeral_port_range() -> tuple[int, int]:
    """The ports the kernel picks from for outgoing connections (Linux's default where unknown)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def free_port(host: str = "127.0.0.1") -> int:
    """A port that is free now, chosen below the kernel's ephemeral range.

    A port from bind(("", 0)) lies inside that range, where any outgoing connection may take it in
    the seconds before the engine binds it, the readiness probe to that very port included (Linux
    can connect a socket to itself when nothing listens yet). CI hit "Address already in use" so.
    Below the range only an explicit bind can take it; another process may still do that.
    """
    low, high = ephemeral_port_range()
    ports = list(range(LOWEST_FREE_PORT, low)) or list(range(high + 1, 65536))
    random.shuffle(ports)
    for port in ports:
        if port in _handed_out:
            continue
        try:
            ensure_port_free(host, port)
        except StackError:
            continue
        _handed_out.add(port)
        return port
    raise StackError(f"no free port on {host} outside the ephemeral range {low}-{high}")


def ensure_port_free(host: str, port: int) -> None:
    """Fail before starting anything when a port is taken, rather than talk to a stranger's server."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # As the servers do, so connections in TIME_WAIT from a previous run do not count as "taken".
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as error:
            raise StackError(f"{host}:{port} is already in use ({error.strerror})") from None


@dataclass(frozen=True)
class ThreadShares:
    """Torch threads of each engine of a stack whose engines share this host's cores (thread_shares)."""

    chat: int  # each chat engine's, while the embedding engine is idle (or absent)
    chat_beside_embedding: int  # each chat engine's while the embedding engine has work
    embedding: int  # the embedding engine's (0: none)


def thread_shares(cores: int, chat_engines: int, embedding: bool) -> ThreadShares | None:
    """How engines sharing this host's cores take them; None for one engine alone (it takes them all).

    Torch's OpenMP threads wait for each other after every op, so engines whose threads together
    outnumber the cores stall each other at those waits: on 2 cores a chat stream's longest token gap
    went from ~30 ms to 1.3 s beside embedding traffic (benchmarks/RESULTS.md). Chat replicas split the
    cores between them. The embedding engine keeps a quarter (one thread at least), and the chat engines
    give it up only while it has work (--core-share, engine_service/core/core_share.py): an idle
    embedding engine costs chat nothing. Busy or not, the threads add up to the cores at most (one
    thread each at least)."""
    if chat_engines + embedding <= 1:
        return None
    embed = max(1, cores // 4) if embedding else 0
    chat = max(1, cores // chat_engines)
    return ThreadShares(chat, max(1, (cores - embed) // chat_engines) if embedding else chat, embed)


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


@dataclass(frozen=True)
class TLSFiles:
    """PEM files for a TLS stack: the CA, the engine's certificate and key, and optionally a
    client certificate and key (signed by the same CA) for mutual TLS. The engine's
    certificate must name the host the shim dials (e.g. an IP SAN 127.0.0.1)."""

    ca: str
    server_cert: str
    server_key: str
    client_cert: str | None = None
    client_key: str | None = None

    @property
    def mutual(self) -> bool:
        return self.client_cert is not None

    def engine_args(self) -> list[str]:
        args = ["--tls-cert", self.server_cert, "--tls-key", self.server_key]
        return args + ["--tls-client-ca", self.ca] if self.mutual else args

    def shim_args(self) -> list[str]:
        args = ["--engine-tls-ca", self.ca]
        if self.mutual:
            args += ["--engine-tls-cert", str(self.client_cert), "--engine-tls-key", str(self.client_key)]
        return args

    def client_kwargs(self) -> dict[str, Any]:
        return {"tls_ca": self.ca, "tls_cert": self.client_cert, "tls_key": self.client_key}


class Stack:
    """The engine (`python -m engine_service`) and the shim (`python -m http_shim`) on loopback.

    Ports of 0 are replaced by free ports. Use as a context manager, or call
    `start()` and `stop()`. `token` and `tls` secure the engine's port (see the module
    docstring); `engine_env` adds to the engine's environment only, `shim_env` to the shim's.

    `replicas` > 1 starts that many engines (the first on `engine_port`, the others on the next
    ports when `engine_port` was given, else on free ones) behind the one shim, which spreads
    work over them (`--engine A,B`). `metrics_port` (0: off) serves replica i's metrics on
    `metrics_port + i`.

    `embedding_model` (e.g. all-MiniLM-L6-v2) starts one more engine serving it beside the others,
    on `embedding_port` (0: a free port), behind the same shim, with `embedding_args` after its
    flags. A process of its own rather than a second model in one engine: an engine serves one
    model, the shim already routes by model over several engines, and the embedding engine's loop
    (its own thread of torch work) then never shares a step with chat. Off by default, so tests that
    need no embeddings start nothing more. The engines share the cores by demand (thread_shares).
    """

    def __init__(self, *, model: str | None = None, host: str = "127.0.0.1", engine_port: int = 0,
                 shim_port: int = 0, engine_args: Sequence[str] = (), shim_args: Sequence[str] = (),
                 log_dir: Path | str | None = None, startup_timeout: float = 300.0,
                 token: str | None = None, tls: TLSFiles | None = None,
                 engine_env: Mapping[str, str] | None = None, shim_env: Mapping[str, str] | None = None,
                 replicas: int = 1, metrics_port: int = 0, embedding_model: str | None = None,
                 embedding_port: int = 0, embedding_args: Sequence[str] = ()) -> None:
        if replicas < 1:
            raise ValueError("replicas must be at least 1")
        self.model = model
        self.host = host
        self.engine_ports = ([engine_port + i for i in range(replicas)] if engine_port
                             else [free_port(host) for _ in range(replicas)])
        self.engine_port = self.engine_ports[0]
        self.metrics_port = metrics_port
        self.shim_port = shim_port or free_port(host)
        self.engine_args = list(engine_args)
        self.shim_args = list(shim_args)
        self.token = token
        self.tls = tls
        self.engine_env = dict(engine_env or {})
        self.shim_env = dict(shim_env or {})
        self.log_dir = Path(log_dir) if log_dir else Path(tempfile.mkdtemp(prefix="conduit-stack-"))
        self.startup_timeout = startup_timeout
        self.engines: list[subprocess.Popen[bytes] | None] = [None] * replicas
        self.shim: subprocess.Popen[bytes] | None = None
        self.embedding_model = embedding_model
        self.embedding_port = (embedding_port or free_port(host)) if embedding_model else 0
        self.embedder: subprocess.Popen[bytes] | None = None
        self.embedding_args = list(embedding_args)
        # A --threads of the caller's (engine_args, or CONDUIT_THREADS) is kept: then no share is given.
        chosen = "--threads" in self.engine_args or {**os.environ, **self.engine_env}.get("CONDUIT_THREADS")
        self.threads = None if chosen else thread_shares(len(os.sched_getaffinity(0)), replicas,
                                                         bool(embedding_model))
        # Where the embedding engine marks that it has work, for the chat engines to yield it threads.
        self.core_share = self.log_dir / "core-share" if self.threads and self.threads.embedding else None

    @property
    def engine(self) -> subprocess.Popen[bytes] | None:
        """The (first) engine process."""
        return self.engines[0]

    @engine.setter
    def engine(self, proc: subprocess.Popen[bytes] | None) -> None:
        self.engines[0] = proc

    @property
    def engine_addresses(self) -> list[str]:
        """host:port of each replica's gRPC server."""
        return [f"{self.host}:{port}" for port in self.engine_ports]

    @property
    def engine_address(self) -> str:
        """host:port of the (first) engine's gRPC server."""
        return self.engine_addresses[0]

    @property
    def metrics_url(self) -> str | None:
        """The (first) engine's Prometheus metrics, when `metrics_port` was given."""
        return f"http://{self.host}:{self.metrics_port}/metrics" if self.metrics_port else None

    @property
    def shim_url(self) -> str:
        return f"http://{self.host}:{self.shim_port}"

    @property
    def base_url(self) -> str:
        """What the openai SDK takes as base_url."""
        return f"{self.shim_url}/v1"

    @property
    def engine_log(self) -> Path:
        return self.replica_log(0)

    def replica_log(self, index: int) -> Path:
        return self.log_dir / ("engine.log" if index == 0 else f"engine-{index}.log")

    @property
    def embedding_address(self) -> str | None:
        return f"{self.host}:{self.embedding_port}" if self.embedding_model else None

    @property
    def embedding_log(self) -> Path:
        return self.log_dir / "embedding-engine.log"

    def embedding_command(self) -> list[str]:
        """The embedding engine: the stack's security; 8192-token steps (an encoder's step is one padded
        forward with no KV cache to budget, and bigger batches embed more per second on a CPU); its
        share of the cores (thread_shares), and the file where it marks its work for the chat engines."""
        tls = self.tls.engine_args() if self.tls else []
        threads = ["--threads", str(self.threads.embedding), "--core-share", str(self.core_share)] if (
            self.threads and self.core_share) else []
        return [sys.executable, "-m", "engine_service", "--host", self.host, "--port", str(self.embedding_port),
                "--model", str(self.embedding_model), "--max-step-tokens", "8192", *tls, *threads,
                *self.embedding_args]

    @property
    def shim_log(self) -> Path:
        return self.log_dir / "shim.log"

    def engine_command(self, index: int = 0) -> list[str]:
        tls = self.tls.engine_args() if self.tls else []
        metrics = (["--metrics-port", str(self.metrics_port + index), "--metrics-host", self.host]
                   if self.metrics_port else [])
        threads = ["--threads", str(self.threads.chat)] if self.threads else []
        if self.core_share and self.threads:
            threads += ["--core-share", str(self.core_share),
                        "--core-share-threads", str(self.threads.chat_beside_embedding)]
        command = [sys.executable, "-m", "engine_service", "--host", self.host,
                   "--port", str(self.engine_ports[index]), *metrics, *tls, *threads, *self.engine_args]
        return command + ["--model", self.model] if self.model else command

    def shim_command(self) -> list[str]:
        tls = self.tls.shim_args() if self.tls else []
        engines = [*self.engine_addresses, *([self.embedding_address] if self.embedding_model else [])]
        return [sys.executable, "-m", "http_shim", "--engine", ",".join(engines),
                "--host", self.host, "--port", str(self.shim_port), *tls, *self.shim_args]

    def engine_environment(self) -> dict[str, str]:
        env = {**os.environ, **self.engine_env}
        if self.token:
            env[ENGINE_TOKENS_ENV] = self.token
        return env

    def shim_environment(self) -> dict[str, str]:
        env = {**os.environ, **self.shim_env}
        if self.token:
            env[ENGINE_TOKEN_ENV] = self.token
        return env

    def client(self, *, index: int | None = 0, **kwargs: Any) -> EngineClient:
        """An EngineClient for this stack's (first) engine, or replica `index`, or all replicas
        (`index=None`), with its token and TLS files; `kwargs` add to (or override) them."""
        security: dict[str, Any] = {"token": self.token, **(self.tls.client_kwargs() if self.tls else {})}
        target = self.engine_addresses if index is None else self.engine_addresses[index]
        return EngineClient(target, **{**security, **kwargs})

    def start(self) -> Stack:
        """Start all processes and block until all are ready; StackError (all stopped) if not."""
        for port in (*self.engine_ports, self.shim_port, *([self.embedding_port] if self.embedding_model else [])):
            ensure_port_free(self.host, port)
        if self.core_share:  # no mark left by an earlier stack in the same folder
            self.core_share.parent.mkdir(parents=True, exist_ok=True)
            self.core_share.write_bytes(bytes(8))
        try:
            for index in range(len(self.engines)):
                self.engines[index] = spawn(self.engine_command(index), self.replica_log(index),
                                            self.engine_environment())
            if self.embedding_model:
                self.embedder = spawn(self.embedding_command(), self.embedding_log, self.engine_environment())
            self.shim = spawn(self.shim_command(), self.shim_log, self.shim_environment())
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def restart_engine(self, index: int, timeout: float | None = None, extra_args: Sequence[str] = ()) -> None:
        """Start replica `index` again on its port (after it exited), appending to its log, with
        `extra_args` after its usual flags, and wait until it serves."""
        proc = self.engines[index]
        if proc is not None and proc.poll() is None:
            raise StackError(f"engine {index} is still running")
        self.engines[index] = spawn([*self.engine_command(index), *extra_args], self.replica_log(index),
                                    self.engine_environment(), append=True)
        deadline = time.monotonic() + (timeout or self.startup_timeout)
        with self.client(index=index, timeout=2.0, options=PROBE_CHANNEL_OPTIONS) as client:
            while not _engine_serving(client):
                self.check_alive()
                if time.monotonic() > deadline:
                    raise StackError(f"engine {index} not ready; {self.replica_log(index)}:\n"
                                     f"{log_tail(self.replica_log(index))}")
                time.sleep(POLL_S)

    def stop(self, grace: float = 10.0) -> None:
        """Stop the shim, then the engines: SIGINT, then SIGTERM, then SIGKILL, `grace` seconds apart."""
        for proc in (self.shim, *self.engines, self.embedder):
            if proc is not None:
                _stop_process(proc, grace)

    def _processes(self) -> list[tuple[str, subprocess.Popen[bytes] | None, Path]]:
        engines = [("engine" if len(self.engines) == 1 else f"engine {i}", proc, self.replica_log(i))
                   for i, proc in enumerate(self.engines)]
        embedder = [("embedding engine", self.embedder, self.embedding_log)] if self.embedding_model else []
        return [*engines, *embedder, ("shim", self.shim, self.shim_log)]

    def check_alive(self) -> None:
        """Raise StackError with the log tail if any process has exited."""
        for name, proc, log in self._processes():
            if proc is None or proc.poll() is not None:
                code = None if proc is None else proc.returncode
                raise StackError(f"{name} exited (code {code}); last lines of {log}:\n{log_tail(log)}")

    def __enter__(self) -> Stack:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        clients = [self.client(index=i, timeout=2.0, options=PROBE_CHANNEL_OPTIONS) for i in range(len(self.engines))]
        if self.embedding_address:
            security = {"token": self.token, **(self.tls.client_kwargs() if self.tls else {})}
            clients.append(EngineClient(self.embedding_address, timeout=2.0, options=PROBE_CHANNEL_OPTIONS, **security))
        ready = [False] * len(clients)
        shim_ready = False
        try:
            while not (all(ready) and shim_ready):
                self.check_alive()
                if time.monotonic() > deadline:
                    names = [name for (name, _, _), up in zip(self._processes(), [*ready, shim_ready]) if not up]
                    tails = "".join(f"\n{name} ({log}):\n{log_tail(log)}" for name, _, log in self._processes())
                    raise StackError(f"{' and '.join(names)} not ready after {self.startup_timeout:.0f}s; "
                                     f"logs in {self.log_dir}{tails}")
                ready = [up or _engine_serving(client) for up, client in zip(ready, clients)]
                # 200 only once every engine has told the shim what it serves: /v1/models is whole.
                shim_ready = shim_ready or (all(ready) and _http_ok(f"{self.shim_url}/health"))
                if not (all(ready) and shim_ready):
                    time.sleep(POLL_S)
        finally:
            for client in clients:
                client.close()


def spawn(cmd: list[str], log_path: Path, env: Mapping[str, str] | None = None,
          append: bool = False) -> subprocess.Popen[bytes]:
    """Start one process of the stack, its stdout and stderr going to `log_path`, with `env`
    (default: this process's environment).

    The child dies with this process, even when this one is SIGKILLed: `child_env` asks it to, and
    `python -m engine_service` / `python -m http_shim` act on that first thing (clients/lifetime.py).
    The kernel ties that to the spawning *thread*; Stack is started from the main thread.
    Its own session keeps a terminal's Ctrl-C away from the children: `stop()` stops them in order.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab" if append else "wb") as log:
        return subprocess.Popen(cmd, cwd=REPO_ROOT, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT,
                                env=child_env({**(os.environ if env is None else env), "PYTHONUNBUFFERED": "1"}),
                                start_new_session=True)


def _engine_serving(client: EngineClient) -> bool:
    try:
        return client.health() == "SERVING"
    except ConduitError:  # not listening yet, or the health service not registered yet
        return False


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2.0) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _stop_process(proc: subprocess.Popen[bytes], grace: float) -> None:
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
        if proc.poll() is not None:
            return
        proc.send_signal(sig)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            continue


def build_parser() -> EnvArgumentParser:
    """The launcher's flags. Their variables keep the names `make run-stack` has always taken
    (MODEL, ENGINE_PORT, ...); the engine's and the shim's own CONDUIT_* variables reach them too."""
    parser = EnvArgumentParser(prog=prog_name("conduit-stack", "launcher.stack"),
                               description="Run the Conduit engine and OpenAI-compatible shim locally.")
    parser.add_argument("--model", metavar="PATH_OR_ID", env="MODEL",
                        help="model path or id; default: the engine's default model")
    parser.add_argument("--host", default="127.0.0.1", help="where the engine and the shim listen")
    parser.add_argument("--engine-port", type=int, default=50051, metavar="PORT", env="ENGINE_PORT",
                        help="engine gRPC port")
    parser.add_argument("--shim-port", type=int, default=8000, metavar="PORT", env="SHIM_PORT", help="HTTP port")
    parser.add_argument("--log-dir", metavar="DIR",
                        help="where engine.log and shim.log go; default: a new temp folder")
    parser.add_argument("--replicas", type=int, default=1, metavar="N", env="REPLICAS",
                        help="engines behind the shim, on consecutive ports from --engine-port")
    parser.add_argument("--metrics-port", type=int, default=0, metavar="PORT", env="METRICS_PORT",
                        help="engine Prometheus metrics port (replica i: PORT + i); 0: off")
    parser.add_argument("--token", env="ENGINE_TOKEN",
                        help="engine token, required by the engine and sent by the shim")
    parser.add_argument("--tls-ca", metavar="PEM", env="ENGINE_TLS_CA",
                        help="with --tls-cert/--tls-key: the CA the shim verifies the engine with")
    parser.add_argument("--tls-cert", metavar="PEM", env="ENGINE_TLS_CERT", help="the engine's TLS certificate")
    parser.add_argument("--tls-key", metavar="PEM", env="ENGINE_TLS_KEY", help="its private key")
    parser.add_argument("--tls-client-cert", metavar="PEM", env="ENGINE_TLS_CLIENT_CERT",
                        help="mutual TLS: the shim's client certificate, signed by --tls-ca")
    parser.add_argument("--tls-client-key", metavar="PEM", env="ENGINE_TLS_CLIENT_KEY", help="its private key")
    parser.add_argument("--embedding-model", default=DEFAULT_EMBEDDING_MODEL, metavar="PATH_OR_ID", env="EMBEDDING_MODEL",
                        help="served beside the chat model by an engine of its own (/v1/embeddings); none: off")
    parser.add_argument("--embedding-port", type=int, default=0, metavar="PORT", env="EMBEDDING_PORT",
                        help="the embedding engine's gRPC port; default: the one after the chat engines'")
    parser.add_argument("engine_args", nargs=argparse.REMAINDER,
                        help="after `--`: extra engine flags, e.g. -- --max-batch-size 8")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    engine_args = args.engine_args[1:] if args.engine_args[:1] == ["--"] else args.engine_args
    if args.replicas < 1:
        parser.error("--replicas must be at least 1")
    tls = None
    if args.tls_cert or args.tls_key or args.tls_ca:
        if not (args.tls_cert and args.tls_key and args.tls_ca):
            parser.error("TLS needs --tls-ca, --tls-cert and --tls-key together")
        if bool(args.tls_client_cert) != bool(args.tls_client_key):
            parser.error("mutual TLS needs --tls-client-cert and --tls-client-key together")
        tls = TLSFiles(args.tls_ca, args.tls_cert, args.tls_key, args.tls_client_cert, args.tls_client_key)

    stack = Stack(model=args.model, host=args.host, engine_port=args.engine_port,
                  shim_port=args.shim_port, engine_args=engine_args, log_dir=args.log_dir,
                  token=args.token, tls=tls, replicas=args.replicas, metrics_port=args.metrics_port,
                  embedding_model=embedding_model_or_none(args.embedding_model),
                  embedding_port=args.embedding_port or (args.engine_port + args.replicas if args.engine_port else 0))
    # Ctrl-C and `kill` stop the stack, even when started from a shell that ignores SIGINT.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    engines = ", ".join(stack.engine_addresses)
    print(f"Starting the engine{'s' if args.replicas > 1 else ''} on {engines} and the shim on {stack.shim_url} "
          f"(logs in {stack.log_dir})...", flush=True)
    try:
        stack.start()
        with stack.client(timeout=10) as client:
            model_id = client.list_models()[0].id
        print(_ready_banner(stack, model_id, args.metrics_port), flush=True)
        if stack.embedding_model:
            print(f"  embeddings:      {stack.base_url}/embeddings (model {stack.embedding_model!r}, engine "
                  f"{stack.embedding_address})", flush=True)
        while True:
            stack.check_alive()
            time.sleep(1.0)
    except StackError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\nStopping...", flush=True)
        return 0
    finally:
        stack.stop()


def _ready_banner(stack: Stack, model_id: str, metrics_port: int = 0) -> str:
    body = json.dumps({"model": model_id,
                       "messages": [{"role": "user", "content": "What is the capital of France?"}]})
    security = ", ".join(part for part in ("mutual TLS" if stack.tls and stack.tls.mutual else "TLS" if stack.tls
                                           else "", "token required" if stack.token else "") if part)
    metrics = "".join(f"  engine metrics:  http://{stack.host}:{metrics_port + i}/metrics\n"
                      for i in range(len(stack.engine_ports))) if metrics_port else ""
    return (f"Conduit is up, serving {model_id}.\n"
            f"  OpenAI base URL: {stack.base_url}\n"
            f"  engine gRPC:     {', '.join(stack.engine_addresses)}{f' ({security})' if security else ''}\n"
            f"{metrics}"
            f"Try:\n"
            f"  curl {stack.base_url}/chat/completions -H 'Content-Type: application/json' \\\n"
            f"    -d '{body}'\n"
            f"Ctrl-C stops {'both' if len(stack.engine_ports) == 1 and not stack.embedding_model else 'them all'}.")


if __name__ == "__main__":
    sys.exit(main())
