"""The engine's settings (EngineConfig) and the names they take: imported by the command line without
torch, so `conduit-engine --help` and a bad flag answer at once rather than after torch loads."""

from __future__ import annotations

from dataclasses import dataclass

# Linear weights' formats (model/linear.py says what each runs on and which is the default).
QUANTIZATIONS = ("none", "int8", "int4")


@dataclass
class EngineConfig:
    max_batch_size: int = 32
    max_waiting: int = 256
    max_step_tokens: int = 512  # decode tokens + prompt-chunk tokens per step
    block_size: int = 16
    kv_cache_tokens: int = 0  # 0: sized from kv_cache_gb
    kv_cache_gb: float = 2.0
    max_model_len: int = 0  # 0: the model's context length
    enable_prefix_caching: bool = True  # share cached full prompt blocks across requests (block_manager.py)
    quantization: str | None = None  # linear weights: none, int8, int4; None: the default (model/linear.py)
    deterministic: bool = False  # a sequence's results never depend on the batch it runs in
    native_kernels: bool = True  # int8 linears and decode attention on model/native.py's kernels where they build
    # Steps whose tokens a request gathers before they are sent; 0: auto (core/pacing.py).
    stream_interval: int = 0
