"""The bench's CPU columns (benchmarks/cpu.py): the shim's own share is measured apart from the
engine's, from real processes' CPU time, and shown blank where a target has no shim."""

from __future__ import annotations

import math
import subprocess
import sys
import time

from benchmarks import report
from benchmarks.cpu import CpuMeter
from benchmarks.stats import summarize

# Burns 0.6 s of CPU, then idles: a process must still exist when the meter stops to be counted.
BURN = "import time\nend = time.process_time() + 0.6\nwhile time.process_time() < end: pass\ntime.sleep(5)\n"
IDLE = "import time\ntime.sleep(5)\n"


def test_the_relays_share_is_its_own_processes_cpu() -> None:
    relay = subprocess.Popen([sys.executable, "-c", BURN])
    engine = subprocess.Popen([sys.executable, "-c", IDLE])
    try:
        meter = CpuMeter([engine.pid, relay.pid], relay_pids=[relay.pid])
        time.sleep(1.5)
        shares = meter.stop()
    finally:
        for process in (relay, engine):
            process.kill()
            process.wait()
    assert shares.relay > 20  # the burner's ~0.6 s of CPU over 1.5 s of wall time
    assert shares.relay <= shares.server + 1e-9
    assert shares.server - shares.relay < 10  # the idle "engine" used next to nothing


def test_without_relay_pids_the_shims_share_is_unknown_and_shown_blank() -> None:
    shares = CpuMeter([], []).stop()
    assert math.isnan(shares.relay)
    grpc_row = report._row(summarize("grpc", 1, 0, [], 1.0, CpuMeter([sys.maxsize - 1]).stop()))
    column = report.HEADERS.index("of which shim %")
    assert grpc_row[column] == ""
    assert len(grpc_row) == len(report.HEADERS)
