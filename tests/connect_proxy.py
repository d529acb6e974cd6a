"""A recording HTTP CONNECT proxy on loopback, for the tests of engine channels and proxies: it notes
each CONNECT's authority, then relays the bytes both ways (a thread per direction)."""

from __future__ import annotations

import socket
import threading


class ConnectProxy:
    """`url` is its address; `connected` the authorities asked for (HOST:PORT), in order."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self.connected: list[str] = []
        threading.Thread(target=self._accept, name="connect-proxy", daemon=True).start()

    def close(self) -> None:
        self._listener.close()

    def __enter__(self) -> ConnectProxy:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:  # closed
                return
            threading.Thread(target=self._tunnel, args=(client,), daemon=True).start()

    def _tunnel(self, client: socket.socket) -> None:
        head = b""
        while b"\r\n\r\n" not in head:
            data = client.recv(4096)
            if not data:
                client.close()
                return
            head += data
        head, _, rest = head.partition(b"\r\n\r\n")
        method, authority, *_ = head.split(b"\r\n")[0].decode().split()
        self.connected.append(authority)
        host, _, port = authority.rpartition(":")
        try:
            if method != "CONNECT":
                raise OSError(f"not a CONNECT: {method}")
            upstream = socket.create_connection((host.strip("[]"), int(port)), timeout=5)
        except (OSError, ValueError):
            client.sendall(b"HTTP/1.1 502 Bad Gateway\r\n\r\n")
            client.close()
            return
        upstream.settimeout(None)
        client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
        upstream.sendall(rest)
        threading.Thread(target=_relay, args=(upstream, client), daemon=True).start()
        _relay(client, upstream)


def _relay(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        for end in (source, sink):
            try:
                end.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
