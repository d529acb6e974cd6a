"""Where the machine's CPU went during a level: the load generator, the server, everything else,
and of the server's share, the HTTP shim's own (the relay's cost, apart from the engine's).

The bench shares a small machine with the servers it measures, and often with other work; a level
whose "other" share is high was measured on a busy machine and its figures are skewed.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

_TICKS = os.sysconf("SC_CLK_TCK")


def _machine_busy_s() -> float:
    """CPU seconds all cores spent not idle since boot (user, nice, system, irq, softirq, steal)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / _TICKS


def _process_s(pid: int) -> float:
    """CPU seconds of one process (all its threads); 0 once it has gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS  # utime, stime


@dataclass
class CpuShares:
    """Percent of one core over the wall time: 100 = one core busy the whole time."""

    client: float
    server: float
    other: float
    relay: float = float("nan")  # of `server`, the relay's processes (the shim); NaN: none measured


class CpuMeter:
    """Measures one interval; `server_pids` are the processes under test (may be empty), and
    `relay_pids` those of them that relay for the others (the shim in front of the engine)."""

    def __init__(self, server_pids: list[int], relay_pids: list[int] | None = None) -> None:
        self.server_pids = server_pids
        self.relay_pids = relay_pids or []
        self._start = self._sample()

    def _sample(self) -> tuple[float, float, float, float, float]:
        servers = sum(_process_s(pid) for pid in self.server_pids)
        relays = sum(_process_s(pid) for pid in self.relay_pids)
        return time.perf_counter(), _machine_busy_s(), _process_s(os.getpid()), servers, relays

    def stop(self) -> CpuShares:
        end = self._sample()
        wall, machine, client, server, relay = (b - a for a, b in zip(self._start, end))
        if wall <= 0:
            return CpuShares(0.0, 0.0, 0.0)
        if not self.server_pids:  # a server started elsewhere: only the client is known
            return CpuShares(100 * client / wall, float("nan"), float("nan"))
        other = max(0.0, machine - client - server)
        return CpuShares(100 * client / wall, 100 * server / wall, 100 * other / wall,
                         100 * relay / wall if self.relay_pids else float("nan"))
