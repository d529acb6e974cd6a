"""The engine's busy loop, on one thread (vLLM's EngineCoreProc, without the process): take what
other threads put in the inbox into the core, step it while it has work, and hand each step's
outputs to the consumer the engine was built with; between steps, publish the load a router reads.

Draining (Engine.drain) stops admitting; the loop finishes what runs and waits by the deadline,
then cuts what is left (FinishReason.SHUTDOWN: UNAVAILABLE) and returns from run().
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from engine_service.core.adapters import Adapter, Adapters
from engine_service.core.engine_core import EngineCore
from engine_service.core.inbox import Inbox
from engine_service.core.metrics import Load, StepRecorder
from engine_service.core.requests import RequestOutput

log = logging.getLogger(__name__)


class EngineLoop:
    def __init__(self, core: EngineCore, inbox: Inbox, on_outputs: Callable[[list[RequestOutput]], None],
                 recorder: StepRecorder) -> None:
        self.core = core
        self.inbox = inbox
        self.on_outputs = on_outputs  # called on this loop's thread, once a step
        self.recorder = recorder
        self.load = Load(0, 0, 0.0)  # as of the last step (or idle wake)
        # Called on this loop's thread before each step (core_share.YieldingThreads: the torch threads).
        self.before_step: Callable[[], None] | None = None
        self.adapters: Adapters | None = None  # LoRA adapters: the unloaded ones are reaped between steps
        self._stopping = False
        self._thread: threading.Thread | None = None

    def run(self) -> None:
        """Run the loop in the calling thread until stop(), or until a drain is over. Prefer the
        main thread: torch's CPU kernels ran about 35% slower per step on a secondary thread here."""
        core, inbox = self.core, self.inbox
        while True:
            draining = inbox.draining  # read first: what was admitted before the drain is in the inbox
            self._take_inbox()
            if self._stopping or (draining and (not core.has_work() or inbox.past_deadline())):
                break
            if not core.has_work():
                self.on_outputs(core.take_outputs())  # aborts of queued requests
                self._publish(None)
                inbox.wait(1.0)
                continue
            started = time.perf_counter()
            try:
                outputs = self.step()
            except Exception:  # outside a step's batch (step() handles those): fail all, not loop on it
                log.exception("engine loop failed outside a step; failing every queued and running request")
                core.fail_started()
                outputs = core.take_outputs()
            self.on_outputs(outputs)
            self._publish(time.perf_counter() - started)
        self._close()
        self.on_outputs(core.take_outputs())

    def step(self) -> list[RequestOutput]:
        """What was submitted meanwhile joins, then one step of the core; returns its outputs (for a
        caller that steps the engine itself, without run())."""
        self._take_inbox()
        if self.before_step is not None:
            self.before_step()
        return self.core.step()

    def start(self) -> None:
        """Run the loop on a background thread (for embedding the engine in another program)."""
        self._thread = threading.Thread(target=self.run, name="engine-loop", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """End the loop now; requests still there end with FinishReason.SHUTDOWN. Waits for a
        background loop. Not for signal handlers (it takes a lock): see Engine.drain()."""
        self._stopping = True
        self.inbox.wake()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)

    def _take_inbox(self) -> None:
        requests, aborts = self.inbox.take()
        self.core.add_requests(requests)
        self.core.abort_requests(aborts)
        if self.adapters is not None and self.adapters.retiring:
            self.adapters.reap(self._adapters_in_use(), self.core.scheduler.blocks)

    def _adapters_in_use(self) -> set[Adapter]:
        """The adapters of the requests here and of those submitted and not yet taken (read under the inbox's
        lock, where submit refuses a request whose adapter is unloading: none can slip in after)."""
        held = {request.adapter for request in self.core.requests.all() if request.adapter is not None}
        return held | self.inbox.pending_adapters()

    def _close(self) -> None:
        """The loop is over: end every request still here with SHUTDOWN."""
        self.inbox.close()  # submit() refuses from now on; what it still held is in the core's requests too
        left = len(self.core.requests.all())
        if left:
            log.warning("engine stopping with %d request(s) unfinished; ending them with UNAVAILABLE", left)
        self.core.shut_down()
        self._publish(None)

    def _publish(self, step_seconds: float | None) -> None:
        # One assignment: the gRPC server's thread reads it whole (GetLoad, for routers).
        scheduler = self.core.scheduler
        self.load = Load.of(scheduler, queued=len(self.inbox))
        blocks = scheduler.blocks
        self.recorder.publish(step_seconds, self.load, scheduler.num_preemptions, blocks.queries, blocks.hits)
        if self.adapters is not None:
            self.recorder.lora_requests(self.adapters.config.max_loras, scheduler)
