"""Runs a command as on a host without a network: `python tests/airgap.py COUNT_FILE -- COMMAND...`.

Every package index and HTTP proxy setting points at a tripwire, a listener on loopback that counts the
connections made to it (pip, requests, httpx and urllib go through them), and pip reads no
configuration file and no find-links of this machine. Started under `unshare --net` (root), the
command also has no route anywhere but loopback, so a connection that bypasses the proxies fails too.
Exits with the command's status after writing the tripwire's count to COUNT_FILE.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

# Loopback stays direct: the tests' own engines and shims live there.
LOOPBACK = "127.0.0.1,localhost,::1"
# Upper case only, which Python's HTTP clients read (urllib's getproxies: pip, requests, httpx) and grpc
# does not: grpc sends a channel to several addresses (`ipv4:a,b`) through its proxy whatever no_proxy
# says, and the tests' replica channels are on loopback. The namespace stops grpc reaching further.
PROXY_VARIABLES = ["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"]


class Tripwire:
    """Accepts and closes every connection, counting them; `close()` counts those still queued too."""

    def __init__(self) -> None:
        self.connections = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.05)  # the loop looks at `stopping` this often
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                if self.stopping.is_set():
                    return
                continue
            self.connections += 1
            conn.close()

    def close(self) -> int:
        self.stopping.set()
        self.thread.join()
        self.listener.close()
        return self.connections


def offline_env(base: dict[str, str], url: str) -> dict[str, str]:
    env = {k: v for k, v in base.items() if not k.startswith("PIP_") and not k.lower().endswith("_proxy")}
    env.update({"PIP_NO_INDEX": "1", "PIP_INDEX_URL": f"{url}/simple", "PIP_CONFIG_FILE": os.devnull,
                "PIP_DISABLE_PIP_VERSION_CHECK": "1", "NO_PROXY": LOOPBACK})
    env.update(dict.fromkeys(PROXY_VARIABLES, url))
    return env


def main() -> int:
    count_file, separator, *command = sys.argv[1:]
    assert separator == "--" and command, __doc__
    tripwire = Tripwire()
    code = subprocess.run(command, env=offline_env(dict(os.environ), tripwire.url)).returncode
    Path(count_file).write_text(str(tripwire.close()))
    return code


if __name__ == "__main__":
    sys.exit(main())
