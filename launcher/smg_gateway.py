"""The Shepherd Model Gateway (`smg` on PyPI) in front of Conduit engines, as their gRPC workers:
for the tests and `make bench-gateway` (docs/gateway.md runs it by hand).

Each engine serves vllm.grpc.engine.VllmEngine beside conduit.v1.Engine on its one port
(engine_service/serving/vllm_worker.py), so the gateway takes `grpc://HOST:PORT` per engine. It
binds loopback only here (it binds 0.0.0.0 by default), and reads the tokenizer from `model_path`.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from launcher.stack import free_port, log_tail

POLL_S = 0.2


class GatewayError(RuntimeError):
    pass


def smg_command() -> str:
    """The `smg` console script of this environment (the dev extra installs it), else one on PATH."""
    beside = Path(sys.executable).with_name("smg")
    found = str(beside) if beside.exists() else shutil.which("smg")
    if found is None:
        raise GatewayError("the `smg` gateway is not installed: pip install smg")
    return found


class Gateway:
    def __init__(self, workers: Sequence[str], model_path: str | Path, log_path: Path, *,
                 policy: str = "cache_aware", host: str = "127.0.0.1", extra_args: Sequence[str] = ()) -> None:
        """`workers`: HOST:PORT of each engine (a gRPC worker), or a URL (http://SHIM: an HTTP one)."""
        self.worker_urls = [w if "://" in w else f"grpc://{w}" for w in workers]
        self.model_path = str(model_path)
        self.log_path = log_path
        self.policy = policy
        self.host = host
        self.port = free_port(host)
        self.metrics_port = free_port(host)
        self.extra_args = list(extra_args)
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        """What the openai SDK takes (the anthropic SDK takes `url`)."""
        return f"{self.url}/v1"

    def command(self) -> list[str]:
        return [smg_command(), "launch", "--worker-urls", *self.worker_urls,
                "--policy", self.policy, "--host", self.host, "--port", str(self.port),
                "--prometheus-host", self.host, "--prometheus-port", str(self.metrics_port),
                "--model-path", self.model_path, *self.extra_args]

    def start(self, timeout_s: float = 120.0) -> Gateway:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(self.command(), stdin=subprocess.DEVNULL, stdout=log,
                                            stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while self.ready_workers() < len(self.worker_urls):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise GatewayError(f"the gateway did not come up with {len(self.worker_urls)} workers; "
                                   f"{self.log_path}:\n{log_tail(self.log_path)}")
            time.sleep(POLL_S)
        # Workers turn ready before the gateway has fetched their tokenizer (GetTokenizer), and until
        # then it answers 503 tokenizer_not_ready: ready means a one-token completion is served.
        while not self.answers():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise GatewayError(f"the gateway did not serve a completion; {self.log_path}:\n"
                                   f"{log_tail(self.log_path)}")
            time.sleep(POLL_S)
        return self

    def answers(self) -> bool:
        """Whether a one-token completion of the first listed model gets a 200."""
        try:
            with urllib.request.urlopen(f"{self.base_url}/models", timeout=5.0) as response:
                model = json.load(response)["data"][0]["id"]
            body = json.dumps({"model": model, "prompt": "Hi", "max_tokens": 1}).encode()
            completion = urllib.request.Request(f"{self.base_url}/completions", data=body,
                                                headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(completion, timeout=30.0) as response:
                return response.status == 200
        except (urllib.error.URLError, OSError, ValueError, KeyError, IndexError):
            return False

    def ready_workers(self) -> int:
        try:
            with urllib.request.urlopen(f"{self.url}/workers", timeout=2.0) as response:
                workers = json.load(response).get("workers", [])
        except (urllib.error.URLError, OSError, ValueError):
            return 0
        return sum(1 for w in workers if w.get("status") == "ready" and w.get("is_healthy"))

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://{self.host}:{self.metrics_port}/metrics", timeout=5.0) as response:
            return response.read().decode()

    def metric(self, name_and_labels: str) -> float:
        """The value of one sample (`name{labels}` exactly as exposed), 0 when absent."""
        for line in self.metrics().splitlines():
            if line.startswith(name_and_labels + " "):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    def stop(self, grace: float = 10.0) -> None:
        if self.process is None:
            return
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if self.process.poll() is not None:
                return
            self.process.send_signal(sig)
            try:
                self.process.wait(grace)
            except subprocess.TimeoutExpired:
                continue

    def __enter__(self) -> Gateway:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
