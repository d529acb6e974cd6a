"""The engine's settings (EngineConfig) and the names they take: imported by the command line without
torch, so `conduit-engine --help` and a bad flag answer at once rather than after torch loads.

Every numeric setting has its bounds here, once (BOUNDS): EngineConfig checks its fields against them,
and the command line derives its flags' checks from them (a usage error at start, before the model
loads): `--max-step-tokens 0` would never start a request and `--block-size 0` divide by zero.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields

from engine_service.core.speculation import SpeculativeConfig
from engine_service.model.step import Segments
from engine_service.model.weight_formats import QUANTIZATIONS
from engine_service.text.reasoning import PARSER_CHOICES


@dataclass(frozen=True)
class Bounds:
    """low..high, both allowed, plus `special` (0 with its own meaning: auto, off, the model's)."""

    low: float
    high: float
    special: float | None = None

    def problem(self, value: float, special: str | None = None) -> str | None:
        """Why `value` is out of bounds (NaN included), or None. `special`: how a command line spells
        the special value, when not as its number (which is then refused)."""
        if (value == self.special and special is None) or (math.isfinite(value) and self.low <= value <= self.high):
            return None
        allowed = f"from {_number(self.low)} to {_number(self.high)}"
        if self.special is not None:
            allowed = f"{special or _number(self.special)} or {allowed}"
        return f"must be {allowed}, not {_number(value)}"


def _number(value: float) -> str:
    return str(int(value)) if math.isfinite(value) and value == int(value) else str(value)


PORT = Bounds(1, 65535, special=0)
BOUNDS = {
    # EngineConfig's fields
    "max_batch_size": Bounds(1, 4096),
    "max_waiting": Bounds(0, 1_000_000),  # 0: no line beyond the batch's free places
    "max_step_tokens": Bounds(1, 1 << 20),  # at least max_batch_size too (EngineConfig)
    "block_size": Bounds(1, 1024),
    "kv_cache_tokens": Bounds(1, 1 << 30, special=0),  # 0: sized from kv_cache_gb
    "kv_cache_gb": Bounds(0.001, 65536.0),
    "max_model_len": Bounds(1, 1 << 24, special=0),  # 0: the model's context length
    "stream_interval": Bounds(1, 1000, special=0),  # 0: auto
    # the process's
    "port": PORT,  # 0: a free port
    "metrics_port": PORT,  # 0: off
    "threads": Bounds(1, 4096, special=0),  # 0: all cores
    "drain_seconds": Bounds(0.0, 86400.0),
    "max_loras": Bounds(1, 1024),
    "max_lora_rank": Bounds(1, 1024),
    "max_cpu_loras": Bounds(1, 1024, special=0),  # 0: --max-loras
}


@dataclass(frozen=True)
class LoraModule:
    """An adapter to serve: `--lora-modules NAME=PATH`, or vLLM's JSON form."""

    name: str
    path: str
    base_model_name: str = ""

    @classmethod
    def parse(cls, text: str) -> LoraModule:
        """NAME=PATH or '{"name": ..., "path": ..., "base_model_name": ...}'; ValueError saying what is wrong."""
        if text.lstrip().startswith("{"):
            try:
                given = json.loads(text)
            except json.JSONDecodeError as exc:
                raise ValueError(f"--lora-modules: {exc}") from None
            unknown = sorted(set(given) - {"name", "path", "base_model_name"})
            if unknown or not isinstance(given.get("name"), str) or not isinstance(given.get("path"), str):
                raise ValueError("--lora-modules JSON needs string 'name' and 'path' (and may have "
                                 f"'base_model_name'){f'; unknown: {unknown}' if unknown else ''}")
            return cls(given["name"], given["path"], given.get("base_model_name") or "")
        name, sep, path = text.partition("=")
        if not sep or not name or not path:
            raise ValueError(f"--lora-modules {text!r}: give NAME=PATH or a JSON object")
        return cls(name, path)


@dataclass(frozen=True)
class LoraConfig:
    modules: tuple[LoraModule, ...] = ()
    max_loras: int = 4  # adapters resident at once (in a step's linears)
    max_lora_rank: int = 64
    # LoadAdapter / UnloadAdapter (/v1/load_lora_adapter): off unless the operator turns them on, and then only
    # from under these folders (core/adapter_dirs.py).
    allow_runtime_updating: bool = False
    lora_dirs: tuple[str, ...] = ()
    max_cpu_loras: int = 0  # adapters loaded (resident or kept on the host); 0: max_loras

    @property
    def loaded_limit(self) -> int:
        return max(self.max_cpu_loras, self.max_loras)


BATCH_STEPS = ("auto", "shared", "apart")
COMPILED_STEP_MODES = ("auto", "on", "off")


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
    # Reasoning models' thinking markers: auto (from the chat template), none, or a family by name.
    reasoning_parser: str = "auto"
    # A generation engine also answers Embed: each input a prefill-only sequence, pooled by its last token.
    enable_embeddings: bool = False
    # n-gram speculative decoding (core/speculation.py), on by default: one stream faster, no workload measured slower
    # (benchmarks/RESULTS.md, "Decisions behind the defaults"); None: off (--speculative-config off).
    speculative: SpeculativeConfig | None = SpeculativeConfig()
    lora: LoraConfig | None = None  # LoRA adapters (core/adapters.py); None: off
    # Batch-priority work (GenerateRequest.priority) beside interactive work: "shared" (batch sequences fill the
    # room in a step), "apart" (a step with interactive work holds none: on the CPU a step's time grows with its
    # rows, so they would slow it), "auto" (apart on the CPU, shared on a GPU).
    batch_steps: str = "auto"
    # Decode-only steps through a torch.compile'd forward per batch-size bucket (model/compiled_step.py): "on",
    # "off" (vLLM's --enforce-eager), "auto" (on a GPU, where it becomes CUDA graphs; off on the CPU).
    compiled_step: str = "auto"

    @property
    def segments(self) -> Segments:
        """Where prompt segments begin (model/step.py): each computed apart; prefix-cache hits end there."""
        return Segments.for_engine(self.block_size, self.max_step_tokens)

    def __post_init__(self) -> None:
        """Raises ValueError naming the first setting out of bounds."""
        for f in fields(self):
            bounds = BOUNDS.get(f.name)
            if bounds is not None and (problem := bounds.problem(getattr(self, f.name))) is not None:
                raise ValueError(f"{f.name} {problem}")
        if self.max_step_tokens < self.max_batch_size:  # a full batch's decodes would leave no token to start one
            raise ValueError(f"max_step_tokens ({self.max_step_tokens}) must be at least max_batch_size "
                             f"({self.max_batch_size})")
        if self.batch_steps not in BATCH_STEPS:
            raise ValueError(f"batch_steps must be one of {', '.join(BATCH_STEPS)}, not {self.batch_steps!r}")
        if self.compiled_step not in COMPILED_STEP_MODES:
            raise ValueError(f"compiled_step must be one of {', '.join(COMPILED_STEP_MODES)}, not {self.compiled_step!r}")
        if self.reasoning_parser not in PARSER_CHOICES:
            raise ValueError(f"reasoning_parser must be one of {', '.join(PARSER_CHOICES)}, not {self.reasoning_parser!r}")
        if self.quantization is not None and self.quantization not in QUANTIZATIONS:
            raise ValueError(f"quantization must be one of {', '.join(QUANTIZATIONS)}, not {self.quantization!r}")
