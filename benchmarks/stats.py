"""Per-request measurements and the figures one concurrency level adds up to."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field

from benchmarks.cpu import CpuShares


@dataclass
class RequestResult:
    """What the client saw of one streamed request; times are seconds since it was sent."""

    ok: bool
    latency: float = 0.0
    # Arrival times of the chunks that carried text; the first one is the time to first token.
    text_times: list[float] = field(default_factory=list)
    completion_tokens: int = 0
    # From the usage chunk, where the server sends it: prompt tokens, and how many of them came
    # from a prompt cache (None: the server did not say).
    prompt_tokens: int = 0
    cached_tokens: int | None = None
    error: str = ""


@dataclass
class LevelStats:
    """One target at one concurrency: the figures RESULTS.md compares."""

    target: str
    concurrency: int
    repeat: int  # which pass of the whole comparison (0, 1, ...)
    requests: int
    failed: int
    wall_s: float
    output_tokens: int
    tokens_per_s: float
    requests_per_s: float
    ttft_p50_ms: float
    ttft_p95_ms: float
    itl_p50_ms: float
    itl_p95_ms: float
    # CPU over wall time (100 = one core busy): the load generator (which shares the machine, so
    # it must stay light), the server under test, and everything else (high = a skewed level).
    client_cpu_pct: float
    server_cpu_pct: float
    other_cpu_pct: float
    # Of server_cpu_pct, the shim's own (NaN for targets without one): what relaying costs.
    shim_cpu_pct: float = float("nan")
    errors: list[str] = field(default_factory=list)


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default), NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


@dataclass
class Spread:
    """Median and range of one figure over the repeats of a run."""

    median: float
    low: float
    high: float


def spread(values: Iterable[float]) -> Spread:
    """NaNs (a figure a repeat could not measure) are left out; all NaN gives NaN."""
    known = [v for v in values if not math.isnan(v)]
    if not known:
        return Spread(math.nan, math.nan, math.nan)
    return Spread(statistics.median(known), min(known), max(known))


def summarize(
    target: str, concurrency: int, repeat: int, results: list[RequestResult], wall_s: float, cpu: CpuShares
) -> LevelStats:
    """Adds up one level; failed requests count toward nothing but `failed`."""
    good = [r for r in results if r.ok]
    ttfts = [r.text_times[0] * 1000 for r in good if r.text_times]
    itls = [
        (later - earlier) * 1000
        for r in good
        for earlier, later in zip(r.text_times, r.text_times[1:])
    ]
    tokens = sum(r.completion_tokens for r in good)
    return LevelStats(
        target=target,
        concurrency=concurrency,
        repeat=repeat,
        requests=len(results),
        failed=len(results) - len(good),
        wall_s=wall_s,
        output_tokens=tokens,
        tokens_per_s=tokens / wall_s if wall_s > 0 else 0.0,
        requests_per_s=len(good) / wall_s if wall_s > 0 else 0.0,
        ttft_p50_ms=percentile(ttfts, 50),
        ttft_p95_ms=percentile(ttfts, 95),
        itl_p50_ms=percentile(itls, 50),
        itl_p95_ms=percentile(itls, 95),
        client_cpu_pct=cpu.client,
        server_cpu_pct=cpu.server,
        other_cpu_pct=cpu.other,
        shim_cpu_pct=cpu.relay,
        errors=sorted({r.error for r in results if not r.ok})[:5],
    )
