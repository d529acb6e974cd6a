"""The bench's turns: every target runs every level in every repeat, the order reversed every other
repeat (benchmarks/bench.py `run_all`), so drift over a level favours no target."""

from __future__ import annotations

import asyncio


def test_targets_take_turns_in_an_order_reversed_every_other_repeat(monkeypatch) -> None:
    from benchmarks import bench  # here, not at collection: it imports the openai SDK (~0.8 s a worker)

    ran: list[tuple[int, int, str]] = []

    async def warm_up(target, burst: int, prompts) -> None:
        pass

    async def run_level(server, concurrency: int, level, repeat: int, prompts):
        ran.append((repeat, concurrency, server.target))
        return bench.LevelStats(server.target, concurrency, repeat, requests=1, failed=0, wall_s=1.0,
                                output_tokens=1, tokens_per_s=1.0, requests_per_s=1.0, ttft_p50_ms=1.0,
                                ttft_p95_ms=1.0, itl_p50_ms=1.0, itl_p95_ms=1.0, client_cpu_pct=0.0,
                                server_cpu_pct=0.0, other_cpu_pct=0.0)

    monkeypatch.setattr(bench, "warm_up", warm_up)
    monkeypatch.setattr(bench, "run_level", run_level)
    servers = [bench.Server(name, []) for name in ("shim", "grpc", "peer")]  # targets stand in by name
    stats = asyncio.run(bench.run_all(servers, [1, 32], bench.Level(1, 0.0), repeats=3, prompts=("hi",)))
    forward, backward = ["shim", "grpc", "peer"], ["peer", "grpc", "shim"]
    assert ran == [(r, c, t) for r, order in enumerate([forward, backward, forward]) for c in (1, 32) for t in order]
    assert [(s.repeat, s.concurrency, s.target) for s in stats] == ran
