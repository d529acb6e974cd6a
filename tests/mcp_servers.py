"""Real MCP servers for the MCP tests, built with the `mcp` package's MCPServer (FastMCP in mcp 1.x), on
loopback ports of a process of their own (one process serves several, each on its port: `mcp` takes
seconds of CPU to import): `python tests/mcp_servers.py --calls-dir DIR --serve NAME:TRANSPORT:PORT[:TOKEN]...`
with TRANSPORT streamable-http or sse. Every tool call is appended to DIR/NAME.jsonl as a JSON line (the
tests check on the server's side what was called); with a TOKEN every request needs `Authorization:
Bearer TOKEN` (else 401). `Listener` is a socket that only counts the connections it accepts (a server
the shim must never reach)."""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from launcher.stack import free_port

HERE = Path(__file__).resolve().parent
BIG_CHARS = 50_000  # the `big` tool's output, past the shim's default cap
STATS = "The 2026 lighthouse census counted 4211 lighthouses."  # what `facts` says


@dataclass
class McpServerProcess:
    process: subprocess.Popen
    url: str
    calls_file: Path

    def calls(self) -> list[dict]:
        if not self.calls_file.exists():
            return []
        return [json.loads(line) for line in self.calls_file.read_text().splitlines() if line]

    def stop(self) -> None:
        """Stops its process (and so the servers it shares it with)."""
        if self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def start_mcp_servers(specs: dict[str, tuple[str, str | None]], folder: Path) -> dict[str, McpServerProcess]:
    """Starts them in one process ({name: (transport, token or None)}), each logging its calls to
    folder/NAME.jsonl, and waits until each accepts connections; each URL is its transport's endpoint."""
    from conduit_common.lifetime import child_env

    ports = {name: free_port() for name in specs}
    argv = [sys.executable, str(HERE / "mcp_servers.py"), "--calls-dir", str(folder)]
    for name, (transport, token) in specs.items():
        argv += ["--serve", ":".join([name, transport, str(ports[name]), *([token] if token else [])])]
    process = subprocess.Popen(argv, env=child_env({**os.environ, "PYTHONPATH": str(HERE.parent)}),
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    for name, port in ports.items():
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    process.kill()
                    raise RuntimeError(f"the MCP server {name} did not start") from None
                time.sleep(0.05)
    return {name: McpServerProcess(process, f"http://127.0.0.1:{port}{'/mcp' if specs[name][0] != 'sse' else '/sse'}",
                                   folder / f"{name}.jsonl") for name, port in ports.items()}


class Listener:
    """A listening loopback socket that accepts connections, counting them, and closes them (`hold`: keeps
    them open and never answers, as a hung server does)."""

    def __init__(self, hold: bool = False) -> None:
        self.socket = socket.create_server(("127.0.0.1", 0))
        self.port = self.socket.getsockname()[1]
        self.accepted = 0
        self.held: list[socket.socket] = []
        self.hold = hold
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self.socket.accept()
            except OSError:
                return
            self.accepted += 1
            if self.hold:
                self.held.append(connection)
            else:
                connection.close()

    def close(self) -> None:
        self.socket.close()
        for connection in self.held:
            connection.close()


class Redirector:
    """An HTTP server on loopback that answers every request with a 307 to `location` (counting them)."""

    def __init__(self, location: str) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        outer = self

        class Handler(BaseHTTPRequestHandler):
            def _redirect(self) -> None:
                outer.requests += 1
                self.send_response(307)
                self.send_header("Location", location)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_GET = do_POST = _redirect

            def log_message(self, *args) -> None:  # quiet
                pass

        self.requests = 0
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/mcp"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _server(calls_file: Path):
    from mcp.server import MCPServer

    server = MCPServer("conduit-test-tools")

    def record(tool: str, **arguments) -> None:
        with calls_file.open("a") as out:
            out.write(json.dumps({"tool": tool, "arguments": arguments}) + "\n")

    @server.tool()
    def add(a: int, b: int) -> int:
        """Add two integers."""
        record("add", a=a, b=b)
        return a + b

    @server.tool()
    def facts(topic: str) -> str:
        """Facts about a topic."""
        record("facts", topic=topic)
        return STATS

    @server.tool()
    def boom(reason: str = "") -> str:
        """Always fails."""
        record("boom", reason=reason)
        raise ValueError("the boom tool always fails")

    @server.tool()
    def big() -> str:
        """A very long answer."""
        record("big")
        return "x" * BIG_CHARS

    @server.tool()
    def sleepy(seconds: float) -> str:
        """Answers after a while."""
        record("sleepy", seconds=seconds)
        time.sleep(seconds)
        return "awake"

    return server


def _bearer_only(app, token: str):
    """An ASGI app that answers 401 to any request without the token."""
    wanted = f"Bearer {token}".encode()

    async def guarded(scope, receive, send):
        if scope["type"] == "http" and dict(scope["headers"]).get(b"authorization") != wanted:
            await send({"type": "http.response.start", "status": 401, "headers": [(b"content-type", b"text/plain")]})
            await send({"type": "http.response.body", "body": b"unauthorized"})
            return
        await app(scope, receive, send)

    return guarded


def main() -> None:
    from conduit_common.lifetime import die_with_parent

    die_with_parent()
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls-dir", type=Path, required=True)
    parser.add_argument("--serve", action="append", required=True, metavar="NAME:TRANSPORT:PORT[:TOKEN]")
    args = parser.parse_args()
    import asyncio

    import uvicorn

    servers = []
    for spec in args.serve:
        name, transport, port, *token = spec.split(":")
        server = _server(args.calls_dir / f"{name}.jsonl")
        app = server.sse_app(host="127.0.0.1") if transport == "sse" else server.streamable_http_app(host="127.0.0.1")
        if token:
            app = _bearer_only(app, token[0])
        servers.append(uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=int(port), log_level="warning")))

    async def serve_all() -> None:
        await asyncio.gather(*(server.serve() for server in servers))

    asyncio.run(serve_all())


if __name__ == "__main__":
    main()
