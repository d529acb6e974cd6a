"""Tables and ratios: the figures side by side, and how Conduit stands against its targets."""

from __future__ import annotations

import math
from dataclasses import dataclass

from benchmarks.stats import LevelStats

# Conduit through the shim against llama-server, output tokens/s, per concurrency.
THROUGHPUT_TARGETS: dict[int, float] = {1: 0.5, 8: 1.0, 32: 1.5}
# At this concurrency Conduit's TTFT p50 must also be no worse than the peer's.
TTFT_TARGET_CONCURRENCY = 32
# The shim may cost at most this fraction of gRPC's tokens/s at the highest concurrency.
SHIM_COST_LIMIT = 0.05

HEADERS = (
    "target", "conc", "reqs", "failed", "tok/s", "req/s",
    "TTFT p50 ms", "TTFT p95 ms", "ITL p50 ms", "ITL p95 ms",
    "client CPU %", "server CPU %", "other CPU %",
)


@dataclass
class Ratio:
    concurrency: int
    name: str
    value: float
    target: str  # e.g. ">= 1.50", empty when this level has none
    met: bool | None


def _row(s: LevelStats) -> list[str]:
    return [
        s.target, str(s.concurrency), str(s.requests), str(s.failed),
        f"{s.tokens_per_s:.1f}", f"{s.requests_per_s:.2f}",
        f"{s.ttft_p50_ms:.0f}", f"{s.ttft_p95_ms:.0f}",
        f"{s.itl_p50_ms:.1f}", f"{s.itl_p95_ms:.1f}",
        f"{s.client_cpu_pct:.0f}", f"{s.server_cpu_pct:.0f}", f"{s.other_cpu_pct:.0f}",
    ]


def _find(stats: list[LevelStats], target: str, concurrency: int) -> LevelStats | None:
    return next((s for s in stats if s.target == target and s.concurrency == concurrency), None)


def _div(a: float, b: float) -> float:
    return a / b if b and not math.isnan(b) else float("nan")


def ratios(stats: list[LevelStats]) -> list[Ratio]:
    """Conduit (shim) against the peer and the shim against gRPC, at each concurrency."""
    out: list[Ratio] = []
    top = max((s.concurrency for s in stats), default=0)
    for conc in sorted({s.concurrency for s in stats}):
        shim, grpc_, peer = (_find(stats, t, conc) for t in ("shim", "grpc", "peer"))
        if shim and peer:
            value = _div(shim.tokens_per_s, peer.tokens_per_s)
            goal = THROUGHPUT_TARGETS.get(conc)
            out.append(Ratio(conc, "tok/s shim / llama-server", value,
                             f">= {goal:.2f}" if goal else "", value >= goal if goal else None))
            value = _div(shim.ttft_p50_ms, peer.ttft_p50_ms)
            judged = conc == TTFT_TARGET_CONCURRENCY
            out.append(Ratio(conc, "TTFT p50 shim / llama-server", value,
                             "<= 1.00" if judged else "", value <= 1.0 if judged else None))
        if grpc_ and peer:
            out.append(Ratio(conc, "tok/s gRPC / llama-server",
                             _div(grpc_.tokens_per_s, peer.tokens_per_s), "", None))
        if shim and grpc_:
            cost = 1.0 - _div(shim.tokens_per_s, grpc_.tokens_per_s)
            judged = conc == top
            out.append(Ratio(conc, "shim cost (1 - shim/gRPC tok/s)", cost,
                             f"< {SHIM_COST_LIMIT:.2f}" if judged else "",
                             cost < SHIM_COST_LIMIT if judged else None))
    return out


def _verdict(r: Ratio) -> str:
    return "" if r.met is None else ("met" if r.met else "MISSED")


def text_table(stats: list[LevelStats]) -> str:
    rows = [list(HEADERS)] + [_row(s) for s in stats]
    widths = [max(len(row[i]) for row in rows) for i in range(len(HEADERS))]
    lines = ["  ".join(cell.rjust(w) for cell, w in zip(row, widths)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    for s in stats:
        for error in s.errors:
            lines.append(f"  {s.target}@{s.concurrency} error: {error}")
    found = ratios(stats)
    if found:
        lines.append("")
    for r in found:
        lines.append(f"conc {r.concurrency:>3}  {r.name:<33} {r.value:6.2f}  {r.target:<8} {_verdict(r)}")
    return "\n".join(lines)


def markdown(stats: list[LevelStats]) -> str:
    lines = ["| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    lines += ["| " + " | ".join(_row(s)) + " |" for s in stats]
    found = ratios(stats)
    if found:
        lines += ["", "| conc | ratio | value | target | |", "|---|---|---|---|---|"]
        lines += [
            f"| {r.concurrency} | {r.name} | {r.value:.2f} | {r.target} | {_verdict(r)} |"
            for r in found
        ]
    return "\n".join(lines)


NOTES_HEADING = "## Notes"


def results_document(stats: list[LevelStats], context: dict[str, object], previous: str = "") -> str:
    """A whole RESULTS.md; the `## Notes` section of `previous` (hand-written analysis) is kept."""
    machine = context["machine"]
    assert isinstance(machine, dict)
    notes = previous[previous.index(NOTES_HEADING):] if NOTES_HEADING in previous else (
        f"{NOTES_HEADING}\n\n(Hand-written analysis goes here; reruns keep this section.)\n")
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
        "",
        "## Workload",
        "",
        f"- {context['prompts']} fixed short chat prompts (`benchmarks/prompts.py`), each after the same "
        "system message; streaming, temperature 0, "
        f"max_tokens {context['max_tokens']}.",
        f"- Each concurrency level keeps that many streams in flight until "
        f"{context['multiplier']} x concurrency requests have finished (closed loop); one "
        "warm-up burst at the top concurrency (max_tokens 8) precedes each target's levels.",
        "- `shim`: openai SDK -> http_shim -> engine. `grpc`: grpc.aio -> engine `Generate` "
        "(no shim). `peer`: openai SDK -> llama-server. All servers are up for the whole run, "
        "idle but for the one being measured; the targets take turns within each level.",
        "- tok/s: completion tokens (from the usage chunk / Final) over the level's wall time. "
        "TTFT: send to first text chunk. ITL: gaps between text chunks. CPU columns: CPU time "
        "over wall time (100 = one core) of the load generator, of the server under test "
        "(shim + engine for `shim`), and of everything else on the machine (high = skewed).",
        "",
        "## Results",
        "",
        markdown(stats),
        "",
        "Targets (Conduit through the shim against llama-server): conc 32 >= 1.5x tok/s with TTFT "
        "p50 no worse; conc 8 >= 1.0x; conc 1 >= 0.5x; the shim costs < 5% of gRPC tok/s at the "
        "top concurrency.",
        "",
        notes.rstrip("\n"),
        "",
    ])
