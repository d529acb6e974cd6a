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

# Burns 0.6 s of CPU, says so, then idles: a process must still exist when the meter stops to be counted.
BURN = ("import time\nend = time.process_time() + 0.6\nwhile time.process_time() < end: pass\n"
        "print('burnt', flush=True)\ntime.sleep(30)\n")
IDLE = "import time\ntime.sleep(30)\n"


def test_the_relays_share_is_its_own_processes_cpu() -> None:
    relay = subprocess.Popen([sys.executable, "-c", BURN], stdout=subprocess.PIPE, text=True)
    engine = subprocess.Popen([sys.executable, "-c", IDLE])
    try:
        meter, started = CpuMeter([engine.pid, relay.pid], relay_pids=[relay.pid]), time.perf_counter()
        assert relay.stdout.readline().strip() == "burnt"  # however long a busy machine takes
        shares, wall = meter.stop(), time.perf_counter() - started
    finally:
        for process in (relay, engine):
            process.kill()
            process.wait()
    relay_cpu_s = shares.relay / 100 * wall
    assert 0.4 < relay_cpu_s < 1.0  # the burner's 0.6 s (less what it burnt before the meter began)
    assert shares.relay <= shares.server + 1e-9
    assert (shares.server - shares.relay) / 100 * wall < 0.2  # the idle "engine" used next to nothing


def test_without_relay_pids_the_shims_share_is_unknown_and_shown_blank() -> None:
    shares = CpuMeter([], []).stop()
    assert math.isnan(shares.relay)
    grpc_row = report._row(summarize("grpc", 1, 0, [], 1.0, CpuMeter([sys.maxsize - 1]).stop()))
    column = report.HEADERS.index("of which shim %")
    assert grpc_row[column] == ""
    assert len(grpc_row) == len(report.HEADERS)
