"""The engine as other threads see it (Engine), and the one place that builds it (build_engine).

Three objects, one job each, as vLLM splits its engine: EngineCore (engine_core.py) only steps;
EngineLoop (engine_loop.py) owns the thread that feeds the core and hands on its outputs; Engine
is what the gRPC servicers call from their threads: submit, abort and drain, which cross into the
loop through its inbox (inbox.py) under one lock, the load as of the last step, and the model's
facts. The consumer of each step's outputs is given to build_engine (requests.deliver: the sinks
on the loop's thread; a server hops them to its own loop first, serving/server.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import torch

from engine_service.core.adapter_dirs import AdapterNotFound
from engine_service.core.adapters import Adapter, Adapters
from engine_service.core.admission import Admission
from engine_service.core.block_manager import BlockManager
from engine_service.core.choices import Choices
from engine_service.core.config import EngineConfig
from engine_service.core.engine_core import EngineCore
from engine_service.core.engine_loop import EngineLoop
from engine_service.core.inbox import Inbox
from engine_service.core.metrics import EngineMetrics, Load, StepRecorder
from engine_service.core.pacing import StreamPacing
from engine_service.core.recovery import StepRecovery
from engine_service.core.requests import RequestOutput, Requests, deliver
from engine_service.core.scheduler import Scheduler
from engine_service.core.sequence import Request
from engine_service.core.speculation import DRAFT_ROW_COST, Speculator
from engine_service.model import compiled_step
from engine_service.model.kv_cache import kv_cache_blocks
from engine_service.model.linear import LOW_BIT_MAX_ROWS
from engine_service.model.loader import LoadedModel
from engine_service.model.runner import ModelRunner
from engine_service.text import reasoning
from engine_service.text.constraints import GrammarCompiler
from engine_service.text.detokenizer import TokenTable

log = logging.getLogger(__name__)


class Engine:
    """Safe from any thread but a signal handler's (submit, abort and drain take the inbox's lock)."""

    def __init__(self, loaded: LoadedModel, config: EngineConfig, core: EngineCore, loop: EngineLoop,
                 admission: Admission, grammars: GrammarCompiler, adapters: Adapters | None = None) -> None:
        self.loaded = loaded
        self.adapters = adapters  # LoRA adapters by name (None: --enable-lora off)
        self.config = config
        self.core = core
        self.loop = loop
        self.admission = admission
        self.grammars = grammars
        self.tokenizer = loaded.tokenizer
        self.token_table = TokenTable(loaded.tokenizer)
        self.vocab_size = admission.vocab_size
        self.max_model_len = admission.max_model_len
        self.scheduler = core.scheduler  # its block manager: the cache's size, and hooks on its blocks
        fmt = reasoning.choose(config.reasoning_parser, getattr(loaded.tokenizer, "chat_template", None))
        # A reasoning model's markers, for its chat requests (None: a model that does not reason).
        self.reasoning = reasoning.ReasoningTokens.of(fmt, loaded.tokenizer) if fmt is not None else None
        if fmt is not None:
            log.info("reasoning: %s (%s...%s)", fmt.name, fmt.start, fmt.end)

    def submit(self, request: Request) -> None:
        """Queue a request. Raises InvalidRequest, QueueFull or Draining at once."""
        self.admission.check(request)
        request.arrival = time.monotonic()
        request.log_id = request.log_id or request.request_id
        # Held under the inbox's lock, so a drain (or an adapter's unloading: engine_loop.py) cannot slip in.
        self.loop.inbox.put(request, len(self.scheduler.waiting), self.scheduler.free_slots(),
                            lambda: self._admit(request))

    def _admit(self, request: Request) -> None:
        if request.adapter is not None and request.adapter.retiring:
            raise AdapterNotFound(f"The lora adapter '{request.adapter.name}' was unloaded")
        self.core.requests.add(request)

    def load_adapter(self, name: str, path: str) -> Adapter:
        """LoadAdapter (core/adapters.py; --enable-lora); AdapterError, naming the problem, when refused."""
        return self.adapters.load_at_runtime(name, path)

    def unload_adapter(self, name: str) -> None:
        """UnloadAdapter (--enable-lora): the loop reaps it once its requests are done (woken, if idle)."""
        self.adapters.unload(name)
        self.loop.inbox.wake()

    def abort(self, request_id: str) -> None:
        """Stop a request; its blocks are freed at the next step."""
        self.loop.inbox.abort(request_id)

    def drain(self, deadline: float) -> None:
        """Refuse new requests (Draining) from now on, finish the queued and running ones, and
        make the loop's run() return when they are done, or at `deadline` (time.monotonic()) with
        the rest ended by FinishReason.SHUTDOWN. A later call may bring the deadline forward."""
        self.loop.inbox.drain(deadline)

    @property
    def draining(self) -> bool:
        return self.loop.inbox.draining

    @property
    def load(self) -> Load:
        """As of the last step (or idle wake)."""
        return self.loop.load


def compile_decode(runner: ModelRunner, config: EngineConfig, device: torch.device) -> str:
    """The runner's decode steps compiled where config.compiled_step wants it and nothing rules it out; what
    happened, for the start log."""
    if not compiled_step.wanted(config.compiled_step, device):
        return "off" if config.compiled_step == "off" else "off (--compiled-step auto: on GPUs only)"
    if config.deterministic:
        return "off (--deterministic: a compiled graph's kernels may round a row by the bucket it runs in)"
    if config.lora is not None:
        return "off (--enable-lora: adapter steps run eagerly, and loading one would recompile)"
    return runner.compile_decode(config.max_batch_size)


def build_engine(loaded: LoadedModel, config: EngineConfig, metrics: EngineMetrics | None = None,
                 on_outputs: Callable[[list[RequestOutput]], None] = deliver) -> Engine:
    """The engine over a loaded model: its KV cache sized, the runner, the scheduler and the rest
    made and wired. `on_outputs` takes each step's outputs on the loop's thread."""
    vocab_size = int(loaded.model.config.vocab_size)
    grammars = GrammarCompiler(loaded.tokenizer, vocab_size)
    max_model_len = min(config.max_model_len or loaded.max_context_length, loaded.max_context_length)
    num_blocks = kv_cache_blocks(loaded.model.config, loaded.dtype, config.block_size, max_model_len,
                                 config.kv_cache_tokens, config.kv_cache_gb)
    kv_capacity_tokens = (num_blocks - 1) * config.block_size
    runner = ModelRunner(loaded.model, loaded.device, loaded.dtype, config.block_size, num_blocks, max_model_len,
                         config.quantization, config.deterministic, native_kernels=config.native_kernels,
                         segments=config.segments, enable_lora=config.lora is not None)
    log.info("compiled decode step: %s", compile_decode(runner, config, loaded.device))
    adapters = None
    if config.lora is not None:
        adapters = Adapters(runner, config.lora, loaded.model_id)
        for module in config.lora.modules:
            adapters.load(module)
    blocks = BlockManager(num_blocks - 1,  # the runner keeps the last block for padding
                          config.block_size, runner.cache.copy_block, config.enable_prefix_caching,
                          config.segments)
    batch_apart = config.batch_steps == "apart" or (config.batch_steps == "auto" and loaded.device.type == "cpu")
    scheduler = Scheduler(blocks, config.max_batch_size, config.max_step_tokens, batch_apart)
    if adapters is not None:
        scheduler.adapter_residency = adapters.resident
    admission = Admission(max_model_len, kv_capacity_tokens, vocab_size, config.max_batch_size)
    pacing = StreamPacing(config.stream_interval)
    recorder = StepRecorder(metrics)
    requests = Requests(scheduler, recorder)
    choices = Choices(loaded.tokenizer, loaded.eos_token_ids, grammars, scheduler, requests, recorder)
    speculator = None
    if config.speculative is not None:
        max_rows = runner.rows.low_bit_max_rows or LOW_BIT_MAX_ROWS
        speculator = Speculator(config.speculative, blocks, DRAFT_ROW_COST.get(loaded.device.type, 0.25), max_rows)
    core = EngineCore(scheduler, runner, requests, choices, StepRecovery(scheduler, requests, choices), pacing,
                      recorder, speculator)
    loop = EngineLoop(core, Inbox(config.max_waiting), on_outputs, recorder)
    if batch_apart:
        core.batch_gives_way = loop.inbox.interactive_waiting
    loop.adapters = adapters
    if metrics is not None:
        metrics.cache_config(config.block_size, num_blocks - 1, config.enable_prefix_caching)
    log.info("KV cache: %d blocks of %d tokens (%d tokens), max batch %d, max model len %d",
             num_blocks, config.block_size, kv_capacity_tokens, config.max_batch_size, max_model_len)
    kernel = f" ({runner.int8_kernel} kernel)" if runner.quantization == "int8" else ""
    log.info("weights: %s%s on %s (%s)%s", runner.quantization, kernel, loaded.device,
             str(loaded.dtype).removeprefix("torch."), ", deterministic" if config.deterministic else "")
    log.info("decode attention: %s", "native, in place in the paged cache"
             if runner.decode_attention is not None else "gathered, then SDPA")
    log.info("streaming: %s", pacing.describe())
    if speculator is not None:
        spec = config.speculative
        log.info("speculative decoding: n-gram, up to %d draft tokens, n-grams of %d-%d tokens, up to %d decode rows",
                 spec.num_speculative_tokens, spec.prompt_lookup_min, spec.prompt_lookup_max, speculator.max_rows)
    return Engine(loaded, config, core, loop, admission, grammars, adapters)
