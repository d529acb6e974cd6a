"""Tables and ratios: the figures side by side, and how Conduit stands against its targets.

A run repeats the whole comparison; each ratio is computed within a repeat (the targets of one
repeat ran minutes apart, under the same conditions) and reported as the median and range over
the repeats. A target is met when the median meets it.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from dataclasses import dataclass, fields

from benchmarks.prefix_cache import PrefixStats
from benchmarks.stats import LevelStats, Spread, percentile, spread

# Conduit through the shim against llama-server, output tokens/s, per concurrency (at least; issue 53's bar).
THROUGHPUT_TARGETS: dict[int, float] = {1: 1.0, 8: 1.8, 32: 2.5}
# Conduit's TTFT p50 through the shim over llama-server's, per concurrency (at most).
TTFT_TARGETS: dict[int, float] = {1: 1.2, 8: 1.5, 32: 1.0}
# The shim may cost less than this fraction of gRPC's tokens/s at the highest concurrency.
SHIM_COST_LIMIT = 0.05
# A warm prefix cache must make Conduit's TTFT (1,000-token system prompt) this many times faster.
PREFIX_SPEEDUP_TARGET = 5.0

_OPS: dict[str, Callable[[float, float], bool]] = {">=": operator.ge, "<=": operator.le, "<": operator.lt}

HEADERS = (
    "target", "conc", "reqs", "failed", "tok/s", "req/s",
    "TTFT p50 ms", "TTFT p95 ms", "ITL p50 ms", "ITL p95 ms",
    "client CPU %", "server CPU %", "of which shim %", "other CPU %",
)


@dataclass
class Goal:
    op: str  # ">=", "<=" or "<"
    value: float

    def __str__(self) -> str:
        return f"{self.op} {self.value:.2f}"

    def met(self, value: float) -> bool:
        return not math.isnan(value) and _OPS[self.op](value, self.value)


@dataclass
class Ratio:
    """One ratio of one repeat."""

    concurrency: int
    name: str
    value: float
    goal: Goal | None = None


@dataclass
class RatioSummary:
    """One ratio over the repeats: `met` judges the median (None: no target)."""

    concurrency: int
    name: str
    values: list[float]
    spread: Spread
    goal: Goal | None

    @property
    def met(self) -> bool | None:
        return None if self.goal is None else self.goal.met(self.spread.median)


def _row(s: LevelStats) -> list[str]:
    return [
        s.target, str(s.concurrency), str(s.requests), str(s.failed),
        f"{s.tokens_per_s:.1f}", f"{s.requests_per_s:.2f}",
        f"{s.ttft_p50_ms:.0f}", f"{s.ttft_p95_ms:.0f}",
        f"{s.itl_p50_ms:.1f}", f"{s.itl_p95_ms:.1f}",
        f"{s.client_cpu_pct:.0f}", f"{s.server_cpu_pct:.0f}",
        "" if math.isnan(s.shim_cpu_pct) else f"{s.shim_cpu_pct:.1f}", f"{s.other_cpu_pct:.0f}",
    ]


def _find(stats: list[LevelStats], target: str, concurrency: int) -> LevelStats | None:
    return next((s for s in stats if s.target == target and s.concurrency == concurrency), None)


def _div(a: float, b: float) -> float:
    return a / b if b and not math.isnan(b) else float("nan")


def ratios(stats: list[LevelStats]) -> list[Ratio]:
    """Conduit (shim) against the peer and the shim against gRPC, at each concurrency, for the
    levels of one repeat."""
    out: list[Ratio] = []
    top = max((s.concurrency for s in stats), default=0)
    for conc in sorted({s.concurrency for s in stats}):
        shim, grpc_, peer = (_find(stats, t, conc) for t in ("shim", "grpc", "peer"))
        if shim and peer:
            goal = THROUGHPUT_TARGETS.get(conc)
            out.append(Ratio(conc, "tok/s shim / llama-server", _div(shim.tokens_per_s, peer.tokens_per_s),
                             Goal(">=", goal) if goal else None))
            goal = TTFT_TARGETS.get(conc)
            out.append(Ratio(conc, "TTFT p50 shim / llama-server", _div(shim.ttft_p50_ms, peer.ttft_p50_ms),
                             Goal("<=", goal) if goal else None))
        if grpc_ and peer:
            out.append(Ratio(conc, "tok/s gRPC / llama-server", _div(grpc_.tokens_per_s, peer.tokens_per_s)))
        if shim and grpc_:
            out.append(Ratio(conc, "shim cost (1 - shim/gRPC tok/s)",
                             1.0 - _div(shim.tokens_per_s, grpc_.tokens_per_s),
                             Goal("<", SHIM_COST_LIMIT) if conc == top else None))
    return out


def ratio_summaries(stats: list[LevelStats]) -> list[RatioSummary]:
    """Each ratio of every repeat, gathered: median and range."""
    by_key: dict[tuple[int, str], list[Ratio]] = {}
    for repeat in sorted({s.repeat for s in stats}):
        for r in ratios([s for s in stats if s.repeat == repeat]):
            by_key.setdefault((r.concurrency, r.name), []).append(r)
    return [RatioSummary(conc, name, [r.value for r in found], spread(r.value for r in found), found[0].goal)
            for (conc, name), found in by_key.items()]


def medians(stats: list[LevelStats]) -> list[LevelStats]:
    """One row per target and concurrency: requests and failures summed over the repeats, every
    other figure their median."""
    out = []
    for key in dict.fromkeys((s.target, s.concurrency) for s in stats):
        group = [s for s in stats if (s.target, s.concurrency) == key]
        values: dict[str, object] = {}
        for f in fields(LevelStats):
            column = [getattr(s, f.name) for s in group]
            if f.name in ("requests", "failed", "output_tokens"):
                values[f.name] = sum(column)
            elif f.name == "errors":
                values[f.name] = sorted({e for s in group for e in s.errors})[:5]
            elif isinstance(column[0], float):
                values[f.name] = spread(column).median
            else:
                values[f.name] = column[0]
        values["repeat"] = len(group)  # in a median row: how many repeats it gathers
        out.append(LevelStats(**values))  # type: ignore[arg-type]
    return out


def prefix_rows(prefix: list[PrefixStats]) -> list[list[str]]:
    """The prefix-cache scenario: cold and warm TTFT p50 and their ratio, per target."""
    rows = []
    for p in prefix:
        cold, warm = percentile(p.cold_ttft_ms, 50), percentile(p.warm_ttft_ms, 50)
        speedup = _div(cold, warm)
        judged = p.target == "shim"
        goal = Goal(">=", PREFIX_SPEEDUP_TARGET)
        cached = [c for c in p.warm_cached_tokens if c is not None]
        rows.append([
            p.target, str(len(p.cold_ttft_ms)), str(p.prompt_tokens), f"{cold:.0f}", f"{warm:.0f}", f"{speedup:.1f}",
            str(goal) if judged else "", (("met" if goal.met(speedup) else "MISSED") if judged else ""),
            f"{percentile([float(c) for c in cached], 50):.0f}" if cached else "not reported",
        ])
    return rows


PREFIX_HEADERS = ("target", "samples", "prompt tokens", "cold TTFT p50 ms", "warm TTFT p50 ms",
                  "cold / warm", "target", "", "warm cached tokens p50")


def _verdict(r: RatioSummary) -> str:
    return "" if r.met is None else ("met" if r.met else "MISSED")


def _values(r: RatioSummary) -> str:
    return " / ".join(f"{v:.2f}" for v in r.values)


def text_table(stats: list[LevelStats], prefix: list[PrefixStats]) -> str:
    """The medians over the repeats (each repeat's levels were logged as they ran), the ratios and
    the prefix-cache scenario."""
    rows = [list(HEADERS)] + [_row(s) for s in medians(stats)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(HEADERS))]
    lines = ["  ".join(cell.rjust(w) for cell, w in zip(row, widths)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    for s in stats:
        for error in s.errors:
            lines.append(f"  {s.target}@{s.concurrency} run {s.repeat + 1}: error: {error}")
    found = ratio_summaries(stats)
    if found:
        lines += ["", "ratios, median [range] over the repeats:"]
    for r in found:
        lines.append(f"conc {r.concurrency:>3}  {r.name:<33} {r.spread.median:6.2f} "
                     f"[{r.spread.low:.2f} to {r.spread.high:.2f}]  {str(r.goal or ''):<8} {_verdict(r)}")
    if prefix:
        lines += ["", "prefix cache (1,000-token system prompt): " + ", ".join(PREFIX_HEADERS[:6])]
        lines += ["  " + "  ".join(row[:6]) + (f"  {row[6]} {row[7]}" if row[6] else "") + f"  cached {row[8]}"
                  for row in prefix_rows(prefix)]
    return "\n".join(lines)


def _table(headers: tuple[str, ...] | list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)] + [
        "| " + " | ".join(row) + " |" for row in rows]


def markdown(stats: list[LevelStats], prefix: list[PrefixStats]) -> str:
    """The median table, the ratio table (median, range, each repeat's value) and the prefix table."""
    lines = _table(HEADERS, [_row(s) for s in medians(stats)])
    found = ratio_summaries(stats)
    if found:
        lines += [""] + _table(
            ["conc", "ratio", "median", "range", "each run", "target", ""],
            [[str(r.concurrency), r.name, f"{r.spread.median:.2f}", f"{r.spread.low:.2f} to {r.spread.high:.2f}",
              _values(r), str(r.goal or ""), _verdict(r)] for r in found])
    if prefix:
        lines += [""] + _table(PREFIX_HEADERS, prefix_rows(prefix))
    return "\n".join(lines)


NOTES_HEADING = "## Notes"


def results_document(stats: list[LevelStats], prefix: list[PrefixStats], context: dict[str, object],
                     previous: str = "") -> str:
    """A whole RESULTS.md; the `## Notes` section of `previous` (hand-written analysis) is kept."""
    machine = context["machine"]
    assert isinstance(machine, dict)
    notes = previous[previous.index(NOTES_HEADING):] if NOTES_HEADING in previous else (
        f"{NOTES_HEADING}\n\n(Hand-written analysis goes here; reruns keep this section.)\n")
    throughput = "; ".join(f"conc {c} >= {v:.1f}x" for c, v in THROUGHPUT_TARGETS.items())
    ttft = "; ".join(f"conc {c} <= {v:.1f}x" for c, v in TTFT_TARGETS.items())
    return "\n".join([
        "# Benchmark results",
        "",
        f"Measured {context['date']} with:",
        "",
        "```",
        str(context["command"]),
        "```",
        "",
        "Rerun that command to refresh this file (everything above the Notes section is generated).",
        "",
        "## Machine and software",
        "",
        f"- CPU: {machine['cpu']}, {machine['cores']} cores; the most any level saw other "
        f"processes use: {max((s.other_cpu_pct for s in stats), default=0):.0f}% of one core",
        f"- Python {machine['python']}, {context['software']}",
        f"- Conduit: {context['conduit']}",
        f"- Peer: {context['peer']}",
        f"- Whole run: {context['elapsed_min']:.1f} minutes",
        "",
        "## Workload",
        "",
        f"- {context['prompts']} fixed short chat prompts (`benchmarks/prompts.py`), each after the same "
        "system message; streaming, temperature 0, "
        f"max_tokens {context['max_tokens']}.",
        f"- Each concurrency level keeps that many streams in flight (closed loop) for at least "
        f"{context['min_seconds']:.0f} s and {context['multiplier']} x concurrency requests, whichever "
        "takes longer, then lets the last ones finish. One warm-up burst at the top concurrency "
        "(max_tokens 8) per target precedes everything.",
        f"- The whole comparison runs {context['repeats']} times (repeats); the results table shows "
        "each figure's median over them, and each ratio is taken within a repeat and shown as the "
        "median, range and every repeat's value (reqs and failed: totals over the repeats). A target "
        "counts as met when the median meets it.",
        "- `shim`: aiohttp reading SSE -> http_shim -> engine. `grpc`: grpc.aio -> engine `Generate` "
        "(no shim). `peer`: the same aiohttp client -> llama-server. All servers are up for the whole run, "
        "idle but for the one being measured; the targets take turns within each level, in reverse order every other repeat.",
        "- tok/s: completion tokens (from the usage chunk / Final) over the level's wall time. "
        "TTFT: send to first text chunk. ITL: gaps between text chunks. CPU columns: CPU time "
        "over wall time (100 = one core) of the load generator, of the server under test "
        "(shim + engine for `shim`; of which the shim's own process), and of everything else on the "
        "machine (high = skewed). On a machine the engine fills, the shim's cost is about the shim's "
        "CPU plus the HTTP client's extra over the gRPC client's, taken from the engine.",
        f"- Prefix cache: {context['prefix_samples']} pairs per target, one request at a time: a cold "
        "request with a fresh random 1,000-token system prompt (`long_system_prompt`, never seen "
        "before), then a warm one with the same system prompt and another question; max_tokens "
        f"{context['prefix_max_tokens']}. Cached tokens: usage.prompt_tokens_details.cached_tokens "
        "(llama-server: its `timings.cache_n`).",
        "",
        "## Results",
        "",
        markdown(stats, prefix),
        "",
        f"Targets (Conduit through the shim against llama-server, medians): tok/s {throughput}; "
        f"TTFT p50 {ttft}; the shim costs < {SHIM_COST_LIMIT:.0%} of gRPC tok/s at the top "
        f"concurrency; a warm prefix cache makes TTFT >= {PREFIX_SPEEDUP_TARGET:.0f}x faster than cold.",
        "",
        notes.rstrip("\n"),
        "",
    ])
