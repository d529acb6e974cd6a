"""`make bench-retrieval`: what vector stores cost (docs/retrieval.md).

1. Search latency at 1k, 10k and 100k chunks, in this process on the shim's own code (retrieval/catalog.py,
   index.py, search.py): random unit vectors of 384 dimensions and random-word texts written straight into a
   catalog on disk, then searches hybrid (vectors + FTS5 words), vectors only, and filtered. The query's own
   embedding is not in these figures (a stub gives its vector): it is measured apart, on the stack.
2. On a stack as `make run-stack` starts it (chat engine, embedding engine, one shim):
   - one query's embedding through /v1/embeddings, and a whole HTTP search, p50;
   - ingestion: a long document added to a store, chunks/s from the add to `completed`, against embedding the
     same chunks (cut by the shim's own chunker over /tokenize) through /v1/embeddings directly, 64 a call,
     one call after another, as ingestion sends them;
   - chat beside ingestion: the inter-token latency of 4 chat streams alone, then while a long file ingests.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

from benchmarks.embed import MODEL as EMBEDDING_MODEL
from benchmarks.embed import OUT
from benchmarks.embed_mix import chat_streams
from benchmarks.stats import percentile
from benchmarks.targets import OpenAITarget
from http_shim.retrieval.catalog import Catalog
from http_shim.retrieval.chunking import auto_sizes, chunk_text
from http_shim.retrieval.index import VectorIndex
from http_shim.retrieval.search import SearchOptions, search
from launcher.stack import Stack

DIMENSIONS = 384
WORDS = [f"w{k}" for k in range(5000)] + "volcano orbit tennis bread jazz photosynthesis river castle".split()


class StubEmbedder:
    """The query's vector without an engine (its cost is measured on the stack)."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def embed(self, texts, request_id):
        rows = self.rng.standard_normal((len(texts), DIMENSIONS)).astype(np.float32)
        return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def fill(catalog: Catalog, count: int, files: int = 100) -> str:
    """A store of `count` chunks over `files` files (attribute `group` = file number % 4)."""
    rng = np.random.default_rng(count)
    store = catalog.create_store("", "bench", {}, None, None)
    per_file = count // files
    for f in range(files):
        file_id = f"file_{count}_{f}"
        catalog.add_file("", store, file_id, f"doc{f}.txt", {"group": f % 4}, {"type": "auto"})
        vectors = rng.standard_normal((per_file, DIMENSIONS)).astype(np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        texts = [" ".join(random.choices(WORDS, k=60)) for _ in range(per_file)]
        catalog.finish_file(store, file_id, "", texts, vectors, {"type": "auto"})
    return store


def time_searches(catalog: Catalog, index: VectorIndex, store: str, options: SearchOptions, runs: int) -> dict:
    embedder = StubEmbedder(1)
    search(catalog, index, embedder, [store], options, "warm")  # the store's matrix is read once, then kept
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        search(catalog, index, embedder, [store], options, "bench")
        times.append((time.perf_counter() - started) * 1000)
    return {"p50_ms": percentile(times, 50), "p99_ms": percentile(times, 99)}


def search_latency(sizes: list[int], runs: int) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-retrieval-") as folder:
        catalog = Catalog(folder)
        index = VectorIndex(catalog)
        for size in sizes:
            started = time.monotonic()
            store = fill(catalog, size)
            filled_s = time.monotonic() - started
            query = "volcano orbit castle river"
            for name, options in [
                ("hybrid", SearchOptions([query])),
                ("vectors only", SearchOptions([query], ranker="none")),
                ("hybrid, filtered to 1/4", SearchOptions([query], filters={"type": "eq", "key": "group", "value": 1})),
            ]:
                row = {"chunks": size, "search": name, **time_searches(catalog, index, store, options, runs),
                       "fill_s": round(filled_s, 1)}
                rows.append(row)
                print(f"{size:>7} chunks | {name:<24} | p50 {row['p50_ms']:6.2f} ms | p99 {row['p99_ms']:6.2f} ms",
                      flush=True)
    return rows


def long_document(paragraphs: int, seed: int) -> str:
    rng = random.Random(seed)
    topics = ["volcanoes erupt lava", "satellites orbit the planet", "bread rises with yeast", "jazz swings",
              "rivers carve valleys", "castles have towers", "plants turn light into sugar"]
    return "\n\n".join(" ".join(f"{rng.choice(topics).capitalize()} in case {rng.randint(1, 9999)} of the study, "
                                f"and the notes from day {k} say it was {rng.choice(['calm', 'busy', 'odd'])}."
                                for k in range(8)) for _ in range(paragraphs))


def wait_completed(http: httpx.Client, store: str, file_id: str) -> None:
    while http.get(f"/vector_stores/{store}/files/{file_id}").json()["status"] == "in_progress":
        time.sleep(0.05)


def add_file(http: httpx.Client, text: str, name: str) -> tuple[str, str]:
    uploaded = http.post("/files", files={"file": (name, text.encode())}, data={"purpose": "assistants"}).json()
    store = http.post("/vector_stores", json={"name": name}).json()["id"]
    return store, uploaded["id"]


def stack_figures(stack: Stack, args: argparse.Namespace) -> dict:
    out: dict = {}
    with httpx.Client(base_url=stack.base_url, timeout=600) as http:
        deadline = time.monotonic() + 120
        while EMBEDDING_MODEL not in [m["id"] for m in http.get("/models").json()["data"]]:
            if time.monotonic() > deadline:
                raise RuntimeError("the shim does not list the embedding model")
            time.sleep(1)
        chat_model = next(m["id"] for m in http.get("/models").json()["data"] if m["id"] != EMBEDDING_MODEL)
        # One query's embedding, and a whole search over HTTP (a small store).
        small_store, small_file = add_file(http, long_document(5, 1), "small.txt")
        http.post(f"/vector_stores/{small_store}/files", json={"file_id": small_file})
        wait_completed(http, small_store, small_file)
        query = "Why do volcanoes erupt?"
        embed_ms, search_ms = [], []
        for _ in range(30):
            started = time.perf_counter()
            http.post("/embeddings", json={"model": EMBEDDING_MODEL, "input": query})
            embed_ms.append((time.perf_counter() - started) * 1000)
            started = time.perf_counter()
            http.post(f"/vector_stores/{small_store}/search", json={"query": query})
            search_ms.append((time.perf_counter() - started) * 1000)
        out["query_embedding_p50_ms"] = statistics.median(embed_ms)
        out["http_search_p50_ms"] = statistics.median(search_ms)
        # Ingestion against /v1/embeddings of the same chunks.
        text = long_document(args.paragraphs, 2)
        store, file_id = add_file(http, text, "long.txt")
        started = time.monotonic()
        http.post(f"/vector_stores/{store}/files", json={"file_id": file_id})
        wait_completed(http, store, file_id)
        ingest_s = time.monotonic() - started
        tokenize = f"{stack.shim_url}/tokenize"  # vLLM's route, beside /v1
        window = http.post(tokenize, json={"model": EMBEDDING_MODEL, "prompt": "x"}).json()["max_model_len"]
        chunks = [c.text for c in chunk_text(text, auto_sizes(window), lambda piece: http.post(
            tokenize, json={"model": EMBEDDING_MODEL, "prompt": piece, "return_token_strs": True}).json()["token_strs"])]
        started = time.monotonic()
        for k in range(0, len(chunks), 64):
            answer = http.post("/embeddings", json={"model": EMBEDDING_MODEL, "input": chunks[k:k + 64],
                                                   "truncate_prompt_tokens": -1})
            answer.raise_for_status()
        direct_s = time.monotonic() - started
        out.update(chunks=len(chunks), ingest_chunks_per_s=len(chunks) / ingest_s,
                   direct_chunks_per_s=len(chunks) / direct_s, ingest_over_direct=ingest_s / direct_s)
        print(f"ingestion: {len(chunks)} chunks, {out['ingest_chunks_per_s']:.1f} chunks/s; /v1/embeddings "
              f"directly {out['direct_chunks_per_s']:.1f} chunks/s; ratio {out['ingest_over_direct']:.2f}x", flush=True)
        # Chat streams alone, then beside an ingestion.
        out["chat"] = asyncio.run(chat_phases(stack, chat_model, http, args))
    return out


async def chat_phases(stack: Stack, chat_model: str, http: httpx.Client, args: argparse.Namespace) -> list[dict]:
    target = OpenAITarget("Conduit", stack.base_url, args.max_tokens, system="")
    await target.open()
    target.model = chat_model
    rows = []
    try:
        await chat_streams(target, 4, 3.0, args.max_tokens)  # warm up
        for phase in ("chat alone", "chat beside ingestion"):
            file_id = store = None
            if phase != "chat alone":
                store, file_id = add_file(http, long_document(args.paragraphs * 5, 3), "busy.txt")
                http.post(f"/vector_stores/{store}/files", json={"file_id": file_id})
            results = await chat_streams(target, 4, args.seconds, args.max_tokens)
            still = file_id is not None and http.get(
                f"/vector_stores/{store}/files/{file_id}").json()["status"] == "in_progress"
            good = [r for r in results if r.ok]
            gaps = [(b - a) * 1000 for r in good for a, b in zip(r.text_times, r.text_times[1:])]
            row = {"phase": phase, "itl_p50_ms": percentile(gaps, 50), "itl_p99_ms": percentile(gaps, 99),
                   "requests": len(results), "failed": len(results) - len(good),
                   "ingesting_throughout": still if file_id else None}
            rows.append(row)
            print(f"{phase:>22} | ITL p50 {row['itl_p50_ms']:6.1f} ms p99 {row['itl_p99_ms']:6.1f} ms | "
                  f"ingestion still running at the end: {row['ingesting_throughout']}", flush=True)
    finally:
        await target.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--runs", type=int, default=200, help="searches per figure")
    parser.add_argument("--paragraphs", type=int, default=60, help="of the long document (~2 chunks each)")
    parser.add_argument("--seconds", type=float, default=20.0, help="per chat phase")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--skip-stack", action="store_true", help="search latency only")
    parser.add_argument("--skip-search", action="store_true", help="the stack's figures only")
    parser.add_argument("--json", type=Path, default=OUT / "retrieval.json")
    args = parser.parse_args()
    figures: dict = {}
    if not args.skip_search:
        figures["search"] = search_latency([int(s) for s in args.sizes.split(",")], args.runs)
    if not args.skip_stack:
        with Stack(embedding_model=EMBEDDING_MODEL, log_dir=OUT / "retrieval-stack",
                   shim_args=["--responses-store-dir", tempfile.mkdtemp(prefix="bench-retrieval-store-")]) as stack:
            figures["stack"] = stack_figures(stack, args)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(figures, indent=1))
    print(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
