"""`make bench-embed`: embeddings per second at 1, 8 and 64 concurrent clients, short queries and
~200-token passages, one input per request (as a retrieval app embeds a query), in one run against:

- Conduit: all-MiniLM-L6-v2's engine behind the shim, POST /v1/embeddings;
- Infinity (infinity-emb, installed apart by benchmarks/install_infinity.sh), its /embeddings;
- sentence-transformers' own batched `encode` in this process: the ceiling on this CPU, no serving.

The servers run one at a time, on the same model folder (the wheel's, unzipped by the engine's
loader); every client is an asyncio task of one process (httpx), so the clients cost both servers
alike. Figures: inputs/s and tokens/s (the model's tokens, [CLS] and [SEP] included).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import httpx

from launcher.stack import Stack, free_port

BENCH_DIR = Path(__file__).resolve().parent
OUT = BENCH_DIR / "out"
MODEL = "all-MiniLM-L6-v2"
_WORDS = ("retrieval augmented generation vector store cosine similarity index query passage document "
          "transformer attention encoder pooling normalization batch token latency throughput kernel "
          "the a of and to in is was for on with as by at from that this which how what why").split()


def workloads(seed: int = 43) -> dict[str, list[str]]:
    rng = random.Random(seed)
    short = [" ".join(rng.choice(_WORDS) for _ in range(rng.randint(5, 10))) + "?" for _ in range(512)]
    passages = [" ".join(rng.choice(_WORDS) for _ in range(rng.randint(160, 175))) + "." for _ in range(256)]
    return {"short queries": short, "~200-token passages": passages}


async def load(url: str, texts: list[str], concurrency: int, seconds: float) -> tuple[int, list[int]]:
    """`concurrency` clients posting one text each, back to back, for `seconds`; (inputs, indexes done)."""
    done: list[int] = []
    stop = time.monotonic() + seconds
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        async def one(worker: int) -> None:
            i = worker
            while time.monotonic() < stop:
                response = await client.post(url, json={"model": MODEL, "input": texts[i % len(texts)]})
                response.raise_for_status()
                done.append(i % len(texts))
                i += concurrency
        await asyncio.gather(*(one(w) for w in range(concurrency)))
    return len(done), done


def measure(name: str, url: str, texts: dict[str, list[str]], lengths: dict[str, list[int]],
            levels: list[int], seconds: float) -> list[dict]:
    rows = []
    for workload, pool in texts.items():
        asyncio.run(load(url, pool, 2, 2.0))  # warm up
        for concurrency in levels:
            started = time.monotonic()
            count, indexes = asyncio.run(load(url, pool, concurrency, seconds))
            elapsed = time.monotonic() - started
            tokens = sum(lengths[workload][i] for i in indexes)
            rows.append({"server": name, "workload": workload, "concurrency": concurrency,
                         "inputs_per_s": count / elapsed, "tokens_per_s": tokens / elapsed})
            print(f"{name:>22} | {workload:>20} | {concurrency:>3} clients | {count / elapsed:8.1f} inputs/s | "
                  f"{tokens / elapsed:9.0f} tokens/s", flush=True)
    return rows


def ceiling(folder: Path, texts: dict[str, list[str]], lengths: dict[str, list[int]]) -> list[dict]:
    """sentence-transformers' encode over each pool, batch 64, twice (the second is timed)."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(folder), device="cpu")
    rows = []
    for workload, pool in texts.items():
        model.encode(pool[:64], batch_size=64)
        started = time.perf_counter()
        model.encode(pool, batch_size=64)
        elapsed = time.perf_counter() - started
        rows.append({"server": "sentence-transformers (in process)", "workload": workload, "concurrency": 0,
                     "inputs_per_s": len(pool) / elapsed, "tokens_per_s": sum(lengths[workload]) / elapsed})
        print(f"sentence-transformers encode | {workload:>20} | {len(pool) / elapsed:8.1f} inputs/s", flush=True)
    return rows


def start_infinity(folder: Path, path: Path, port: int) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(path), "DO_NOT_TRACK": "1", "INFINITY_ANONYMOUS_USAGE_STATS": "0",
           "HF_HUB_OFFLINE": "1"}
    OUT.mkdir(parents=True, exist_ok=True)
    log = open(OUT / "infinity.log", "wb")
    process = subprocess.Popen([sys.executable, "-c", "from infinity_emb.cli import cli; cli()", "v2",
                                "--model-id", str(folder), "--served-model-name", MODEL, "--host", "127.0.0.1",
                                "--port", str(port), "--engine", "torch", "--device", "cpu"],
                               env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"Infinity exited ({process.returncode}); see {OUT / 'infinity.log'}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                return process
        except OSError:
            time.sleep(0.5)
    process.kill()
    raise RuntimeError("Infinity did not start in 300 s")


def table(rows: list[dict]) -> str:
    lines = ["| server | workload | clients | inputs/s | tokens/s |", "| --- | --- | ---: | ---: | ---: |"]
    for r in rows:
        clients = "in process, batch 64" if r["concurrency"] == 0 else str(r["concurrency"])
        lines.append(f"| {r['server']} | {r['workload']} | {clients} | {r['inputs_per_s']:.1f} | "
                     f"{r['tokens_per_s']:.0f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=10.0, help="per cell")
    parser.add_argument("--concurrency", default="1,8,64")
    parser.add_argument("--skip-peer", action="store_true", help="no Infinity")
    parser.add_argument("--infinity-dir", type=Path, default=BENCH_DIR / "peers" / "infinity")
    parser.add_argument("--json", type=Path, default=OUT / "embed.json")
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]

    from transformers import AutoTokenizer

    from engine_service.model.embedding_wheel import default_embedding_folder

    folder = default_embedding_folder()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    texts = workloads()
    lengths = {name: [min(len(ids), 256) for ids in tokenizer(pool)["input_ids"]] for name, pool in texts.items()}
    rows: list[dict] = []
    with Stack(model=MODEL, engine_args=["--max-step-tokens", "8192"], log_dir=OUT / "embed-stack") as stack:
        rows += measure("Conduit (HTTP)", f"{stack.base_url}/embeddings", texts, lengths, levels, args.seconds)
    if not args.skip_peer:
        port = free_port()
        infinity = start_infinity(folder, args.infinity_dir, port)
        try:
            rows += measure("Infinity 0.0.78 (HTTP)", f"http://127.0.0.1:{port}/embeddings", texts, lengths, levels,
                            args.seconds)
        finally:
            infinity.terminate()
            infinity.wait(30)
    rows += ceiling(folder, texts, lengths)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(rows, indent=1))
    print()
    print(table(rows))


if __name__ == "__main__":
    main()
