"""`make bench-embed`: embeddings per second at 1, 8 and 64 concurrent clients, short queries and
~200-token passages, one input per request (as a retrieval app embeds a query), in one run against:

- Conduit: all-MiniLM-L6-v2's engine behind the shim, POST /v1/embeddings;
- Infinity (infinity-emb, installed apart by benchmarks/install_infinity.sh), its /embeddings;
- sentence-transformers' own batched `encode` in this process: the ceiling on this CPU, no serving.

The servers run one at a time, on the same model folder (the wheel's, unzipped by the engine's
loader); every client is an asyncio task of one process (aiohttp), so the clients cost both servers
alike. httpx was the client until its ~6 ms of CPU a request (aiohttp: ~0.4) made the client the
bottleneck of both servers on 2 cores. Figures: inputs/s and tokens/s (the model's tokens, [CLS] and
[SEP] included), and the CPU milliseconds an input cost the server's processes and the client, which a
loaded machine moves less than the rates. The ceiling runs before the servers and after them (two
figures show how much the machine's load moved during the run), each time under both OpenMP wait
policies (see ceilings()).
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

import aiohttp

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
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=120)) as client:
        async def one(worker: int) -> None:
            i = worker
            while time.monotonic() < stop:
                async with client.post(url, json={"model": MODEL, "input": texts[i % len(texts)]}) as response:
                    response.raise_for_status()
                    await response.read()
                done.append(i % len(texts))
                i += concurrency
        await asyncio.gather(*(one(w) for w in range(concurrency)))
    return len(done), done


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU time of these processes and their threads so far (Linux /proc)."""
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / os.sysconf("SC_CLK_TCK")


def measure(name: str, url: str, texts: dict[str, list[str]], lengths: dict[str, list[int]],
            levels: list[int], seconds: float, server_pids: list[int]) -> list[dict]:
    rows = []
    for workload, pool in texts.items():
        asyncio.run(load(url, pool, 2, 2.0))  # warm up
        for concurrency in levels:
            server_cpu, client_cpu, started = cpu_seconds(server_pids), time.process_time(), time.monotonic()
            count, indexes = asyncio.run(load(url, pool, concurrency, seconds))
            elapsed = time.monotonic() - started
            server_ms = (cpu_seconds(server_pids) - server_cpu) * 1000 / max(count, 1)
            client_ms = (time.process_time() - client_cpu) * 1000 / max(count, 1)
            tokens = sum(lengths[workload][i] for i in indexes)
            rows.append({"server": name, "workload": workload, "concurrency": concurrency,
                         "inputs_per_s": count / elapsed, "tokens_per_s": tokens / elapsed,
                         "server_cpu_ms": server_ms, "client_cpu_ms": client_ms, "load_avg": os.getloadavg()[0]})
            print(f"{name:>22} | {workload:>20} | {concurrency:>3} clients | {count / elapsed:8.1f} inputs/s | "
                  f"{tokens / elapsed:9.0f} tokens/s | CPU ms/input server {server_ms:5.1f} client {client_ms:4.1f} "
                  f"| load {os.getloadavg()[0]:.1f}", flush=True)
    return rows


def ceiling(folder: Path, texts: dict[str, list[str]], lengths: dict[str, list[int]], when: str) -> list[dict]:
    """sentence-transformers' encode over each pool, batch 64, twice (the second is timed)."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(folder), device="cpu")
    rows = []
    for workload, pool in texts.items():
        model.encode(pool[:64], batch_size=64)
        started, cpu = time.perf_counter(), time.process_time()
        model.encode(pool, batch_size=64)
        elapsed = time.perf_counter() - started
        rows.append({"server": f"sentence-transformers (in process, {when})", "workload": workload,
                     "concurrency": 0, "inputs_per_s": len(pool) / elapsed,
                     "tokens_per_s": sum(lengths[workload]) / elapsed,
                     "server_cpu_ms": (time.process_time() - cpu) * 1000 / len(pool), "client_cpu_ms": 0.0,
                     "load_avg": os.getloadavg()[0]})
        print(f"sentence-transformers encode ({when}) | {workload:>20} | {len(pool) / elapsed:8.1f} inputs/s",
              flush=True)
    return rows


def ceilings(workloads_arg: str, when: str) -> list[dict]:
    """The ceiling under both OpenMP wait policies, each in a process of its own (the policy is read when
    torch loads): torch's default spins after each op, which is fastest on an idle machine and far
    slower on a loaded one; Conduit's embedding engine sleeps at once (PASSIVE)."""
    rows = []
    for policy in ("default", "PASSIVE"):
        env = {**os.environ, "OMP_WAIT_POLICY": policy} if policy != "default" else \
            {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
        done = subprocess.run([sys.executable, "-m", "benchmarks.embed", "--workloads", workloads_arg,
                               "--ceiling", f"{when}, OpenMP {policy}"],
                              env=env, capture_output=True, text=True, check=True)
        rows += json.loads(done.stdout.strip().splitlines()[-1])
        print(done.stdout.strip().rsplit("\n", 1)[0], flush=True)
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


def _commit(root: Path) -> str:
    return subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip() or root.name


def table(rows: list[dict]) -> str:
    lines = ["| server | workload | clients | inputs/s | tokens/s | CPU ms/input: server, client | load |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        clients = "batch 64" if r["concurrency"] == 0 else str(r["concurrency"])
        lines.append(f"| {r['server']} | {r['workload']} | {clients} | {r['inputs_per_s']:.1f} | "
                     f"{r['tokens_per_s']:.0f} | {r['server_cpu_ms']:.1f}, {r['client_cpu_ms']:.1f} | "
                     f"{r['load_avg']:.1f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=10.0, help="per cell")
    parser.add_argument("--concurrency", default="1,8,64")
    parser.add_argument("--skip-peer", action="store_true", help="no Infinity")
    parser.add_argument("--infinity-dir", type=Path, default=BENCH_DIR / "peers" / "infinity")
    parser.add_argument("--workloads", default="short,passages", help="short and/or passages")
    parser.add_argument("--ceiling", metavar="WHEN", help=argparse.SUPPRESS)  # only the ceiling, as JSON
    parser.add_argument("--baseline", type=Path,
                        help="also Conduit (engine and shim) from this checkout (a before arm)")
    parser.add_argument("--json", type=Path, default=OUT / "embed.json")
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]

    from transformers import AutoTokenizer

    from engine_service.model.embedding_wheel import default_embedding_folder

    folder = default_embedding_folder()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    picked = args.workloads.split(",")
    texts = {name: pool for key, (name, pool) in zip(("short", "passages"), workloads().items()) if key in picked}
    lengths = {name: [min(len(ids), 256) for ids in tokenizer(pool)["input_ids"]] for name, pool in texts.items()}
    if args.ceiling:
        print(json.dumps(ceiling(folder, texts, lengths, args.ceiling)))
        return
    rows = ceilings(args.workloads, "before")
    arms = [("Conduit (HTTP)", {})]
    if args.baseline:
        root = args.baseline.resolve()
        # PYTHONSAFEPATH: the launcher starts both processes in this checkout, which -m would put first on the path.
        arms.append((f"Conduit {_commit(root)} (HTTP)", {"PYTHONPATH": f"{root}:{root / 'protos'}",
                                                         "PYTHONSAFEPATH": "1"}))
    for name, env in arms:
        with Stack(model=MODEL, engine_args=["--max-step-tokens", "8192"], engine_env=env, shim_env=env,
                   log_dir=OUT / "embed-stack") as stack:
            pids = [stack.engine.pid, stack.shim.pid]  # type: ignore[union-attr]
            rows += measure(name, f"{stack.base_url}/embeddings", texts, lengths, levels, args.seconds, pids)
    if not args.skip_peer:
        port = free_port()
        infinity = start_infinity(folder, args.infinity_dir, port)
        try:
            rows += measure("Infinity 0.0.78 (HTTP)", f"http://127.0.0.1:{port}/embeddings", texts, lengths, levels,
                            args.seconds, [infinity.pid])
        finally:
            infinity.terminate()
            infinity.wait(30)
    rows += ceilings(args.workloads, "after")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(rows, indent=1))
    print()
    print(table(rows))


if __name__ == "__main__":
    main()
