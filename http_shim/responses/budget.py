"""How many hosted tool calls (file searches, MCP calls) one response may run.

`max_tool_calls` bounds them all together. Unset, each kind of tool may run once: a small model asked
again tends to call again, and each call costs a round of generation.
"""

from __future__ import annotations

from collections import Counter

DEFAULT_CALLS_PER_KIND = 1


class CallBudget:
    def __init__(self, max_tool_calls: int | None) -> None:
        self.limit = max_tool_calls
        self.used: Counter[str] = Counter()

    def left(self, kind: str) -> bool:
        if self.limit is None:
            return self.used[kind] < DEFAULT_CALLS_PER_KIND
        return sum(self.used.values()) < self.limit

    def spend(self, kind: str) -> None:
        self.used[kind] += 1
