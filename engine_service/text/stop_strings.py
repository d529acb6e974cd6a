"""Stop strings that may span tokens: hold back text that could still become a match."""

from __future__ import annotations


class StopStringMatcher:
    def __init__(self, stops: list[str]) -> None:
        self._stops = [s for s in stops if s]
        self._buffer = ""

    def feed(self, text: str) -> tuple[str, str | None]:
        """Return (text safe to emit, the stop string matched or None). After a match, stop."""
        if not self._stops:
            return text, None
        self._buffer += text
        hit: tuple[int, str] | None = None
        for stop in self._stops:
            at = self._buffer.find(stop)
            if at >= 0 and (hit is None or at < hit[0]):
                hit = (at, stop)
        if hit is not None:
            emit = self._buffer[:hit[0]]
            self._buffer = ""
            return emit, hit[1]
        keep = self._partial_match_length()
        emit = self._buffer[:len(self._buffer) - keep]
        self._buffer = self._buffer[len(emit):]
        return emit, None

    def _partial_match_length(self) -> int:
        """Longest suffix of the buffer that is a proper prefix of some stop string."""
        longest = min(len(self._buffer), max(len(s) for s in self._stops) - 1)
        for k in range(longest, 0, -1):
            tail = self._buffer[-k:]
            if any(stop.startswith(tail) for stop in self._stops):
                return k
        return 0

    def flush(self) -> str:
        out, self._buffer = self._buffer, ""
        return out
