"""The embedding engine's loop (core/embedding_engine.py) with a stand-in model: packing within the
step-token budget, cancellation, a failed step, the drain; and serving a decoder as an embedding
model (model/encoder.py: last-token pooling) on a tiny random Llama, against transformers' own
forward of each input alone."""

from __future__ import annotations

import json
import threading
import time

import pytest
import torch

from engine_service.core.config import EngineConfig
from engine_service.core.embedding_engine import EmbeddingEngine, EmbedJob
from engine_service.core.events import FinishReason
from engine_service.core.params import Draining
from engine_service.model.encoder import Pooling, pool, read_pooling

pytestmark = pytest.mark.in_process_engine


class StandInModel:
    """Embeds an input as [its length, its first id]; records each forward's inputs; fails on id 666."""

    def __init__(self) -> None:
        self.forwards: list[list[list[int]]] = []
        self.tokenizer = None
        self.vocab_size = 1000
        self.max_context_length = 512

    def embed(self, inputs: list[list[int]]) -> torch.Tensor:
        self.forwards.append(inputs)
        if any(666 in ids for ids in inputs):
            raise RuntimeError("a step that fails")
        return torch.tensor([[float(len(ids)), float(ids[0])] for ids in inputs])


class Results:
    def __init__(self) -> None:
        self.got: dict[str, tuple[torch.Tensor | None, FinishReason]] = {}
        self.done = threading.Event()

    def sink(self, name: str):
        def take(vectors, reason) -> None:
            self.got[name] = (vectors, reason)
        return take


def engine_with(**config) -> tuple[EmbeddingEngine, StandInModel]:
    model = StandInModel()
    return EmbeddingEngine(model, EngineConfig(**config)), model  # type: ignore[arg-type]


def test_inputs_pack_into_padded_steps_within_the_budget() -> None:
    engine, model = engine_with(max_step_tokens=64, max_batch_size=8)
    results = Results()
    engine.submit(EmbedJob("a", [[1] * 10] * 9 + [[2] * 100], results.sink("a")))
    engine.submit(EmbedJob("b", [[3] * 5, [4] * 20], results.sink("b")))
    engine._take_inbox()
    while engine._jobs:
        engine.step()
    engine._send()
    # 6 rows of 10 fit 64 padded tokens; the 100-token input runs alone (over the budget, but it must run)
    assert [len(f) for f in model.forwards] == [6, 3, 1, 2]
    assert all(len(f) * max(map(len, f)) <= 64 for f in model.forwards if len(f) > 1)
    vectors, reason = results.got["a"]
    assert reason is FinishReason.STOP and vectors[:, 0].tolist() == [10.0] * 9 + [100.0]  # input order kept
    assert results.got["b"][0][:, 1].tolist() == [3.0, 4.0]


def test_cancelled_request_is_not_embedded_and_a_failed_step_fails_only_its_requests() -> None:
    engine, model = engine_with(max_step_tokens=16, max_batch_size=1)
    results = Results()
    engine.submit(EmbedJob("bad", [[666]], results.sink("bad")))
    engine.submit(EmbedJob("gone", [[7]], results.sink("gone")))
    engine.submit(EmbedJob("fine", [[8, 8]], results.sink("fine")))
    engine.abort("gone")
    engine._take_inbox()
    while engine._jobs:
        engine.step()
    engine._send()
    assert results.got["bad"] == (None, FinishReason.ERROR)
    assert results.got["gone"] == (None, FinishReason.CANCELLED)
    assert results.got["fine"][1] is FinishReason.STOP
    assert [7] not in [row for forward in model.forwards for row in forward]


def test_drain_refuses_new_requests_finishes_the_rest_and_ends_the_loop() -> None:
    engine, _ = engine_with()
    results = Results()
    engine.submit(EmbedJob("queued", [[1, 2, 3]], results.sink("queued")))
    engine.drain(time.monotonic() + 30)
    with pytest.raises(Draining):
        engine.submit(EmbedJob("late", [[1]], results.sink("late")))
    loop = threading.Thread(target=engine.run)
    loop.start()
    loop.join(timeout=30)
    assert not loop.is_alive()
    assert results.got["queued"][1] is FinishReason.STOP and "late" not in results.got


def test_pooling_modes_mask_the_padding() -> None:
    hidden = torch.tensor([[[1.0], [3.0], [100.0]], [[2.0], [4.0], [6.0]]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    assert pool(hidden, mask, "mean").flatten().tolist() == [2.0, 4.0]
    assert pool(hidden, mask, "cls").flatten().tolist() == [1.0, 2.0]
    assert pool(hidden, mask, "lasttoken").flatten().tolist() == [3.0, 6.0]


def test_sentence_transformers_config_is_read(tmp_path) -> None:
    def folder(name: str, modules: list[str], pooling: dict) -> object:
        path = tmp_path / name
        (path / "1_Pooling").mkdir(parents=True)
        (path / "modules.json").write_text(json.dumps([
            {"idx": i, "name": str(i), "path": {"Pooling": "1_Pooling"}.get(kind, ""),
             "type": f"sentence_transformers.models.{kind}"} for i, kind in enumerate(modules)]))
        (path / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
        return path

    assert read_pooling(folder("cls", ["Transformer", "Pooling"], {"pooling_mode_cls_token": True}),
                        False) == Pooling("cls", False)
    assert read_pooling(folder("last", ["Transformer", "Pooling", "Normalize"], {"pooling_mode_lasttoken": True}),
                        True) == Pooling("lasttoken", True)
    assert read_pooling(tmp_path, is_decoder=True) == Pooling("lasttoken", True)  # no modules.json
    assert read_pooling(tmp_path, is_decoder=False) == Pooling("mean", False)
    with pytest.raises(ValueError, match="Dense"):
        read_pooling(folder("dense", ["Transformer", "Pooling", "Dense"], {"pooling_mode_mean_tokens": True}), False)
    with pytest.raises(ValueError, match="not supported"):
        read_pooling(folder("max", ["Transformer", "Pooling"], {"pooling_mode_max_tokens": True}), False)


def test_a_decoder_embeds_by_its_last_token(tmp_path) -> None:
    """A tiny random Llama (with all-MiniLM-L6-v2's tokenizer, for want of a small one) served as an
    embedding model: a padded batch of mixed lengths gives each input's last hidden state, normalized,
    as transformers' AutoModel gives it for the input alone."""
    from transformers import AutoModel, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from engine_service.model.embedding_wheel import default_embedding_folder
    from engine_service.model.encoder import load_embedding_model

    tokenizer = AutoTokenizer.from_pretrained(default_embedding_folder())
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    LlamaForCausalLM(config).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    loaded = load_embedding_model(str(tmp_path))
    assert loaded.pooling == Pooling("lasttoken", True) and loaded.dimensions == 32
    texts = ["a short one", "a much longer input that pads the short one in the same forward pass", "x"]
    ids = [loaded.tokenize(text) for text in texts]
    batched = loaded.embed(ids)
    reference = AutoModel.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        alone = torch.stack([reference(input_ids=torch.tensor([row])).last_hidden_state[0, -1] for row in ids])
    assert torch.allclose(batched, torch.nn.functional.normalize(alone, dim=-1), atol=1e-5)


def test_shorter_vectors_only_where_the_model_was_trained_for_them() -> None:
    from dataclasses import replace

    from engine_service.model.encoder import EmbeddingModel
    from engine_service.serving.embed import shorten

    plain = EmbeddingModel(model_id="m", source="", model=None, tokenizer=None, device=torch.device("cpu"),
                           dtype=torch.float32, max_context_length=8, dimensions=8, pooling=Pooling("mean", True),
                           matryoshka_dimensions=None, special_prefix=(), special_suffix=())
    assert plain.allows_dimensions(8) and not plain.allows_dimensions(4)
    assert replace(plain, matryoshka_dimensions=()).allows_dimensions(3)  # is_matryoshka: any size
    listed = replace(plain, matryoshka_dimensions=(2, 4))
    assert listed.allows_dimensions(4) and not listed.allows_dimensions(3) and not listed.allows_dimensions(16)
    short = shorten(torch.nn.functional.normalize(torch.arange(1.0, 9.0).reshape(1, 8), dim=-1), 2, True)
    assert torch.allclose(short, torch.nn.functional.normalize(torch.tensor([[1.0, 2.0]]), dim=-1))


def test_a_short_request_is_tokenized_on_the_event_loop_and_a_large_one_off_it() -> None:
    from conduit.v1 import engine_pb2 as pb
    from engine_service.serving.embed import INLINE_INPUT_SIZE, inline_work

    def request(*inputs: pb.EmbedInput) -> pb.EmbedRequest:
        return pb.EmbedRequest(inputs=list(inputs))

    query = pb.EmbedInput(text="what is retrieval augmented generation?")
    assert inline_work(request(query, pb.EmbedInput(token_ids=pb.TokenIds(ids=[101, 2054, 102]))))
    assert not inline_work(request(pb.EmbedInput(text="x" * (INLINE_INPUT_SIZE + 1))))
    assert not inline_work(request(pb.EmbedInput(token_ids=pb.TokenIds(ids=[7] * (INLINE_INPUT_SIZE + 1)))))
    assert not inline_work(request(*[pb.EmbedInput(text="") for _ in range(INLINE_INPUT_SIZE + 1)]))  # many inputs


@pytest.mark.parametrize("mode", ["mean", "cls", "lasttoken"])
def test_packed_bert_equals_bert_on_each_input_alone(mode) -> None:
    """model/packed_bert.py: inputs of mixed lengths packed without padding give, per input, what
    transformers' BertModel gives for that input alone (a tiny random BERT, one input 1 token long)."""
    from transformers import BertConfig, BertModel

    from engine_service.model.packed_bert import PackedBert, pool_packed, supports

    torch.manual_seed(0)
    model = BertModel(BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                 intermediate_size=64, max_position_embeddings=64), add_pooling_layer=False).eval()
    assert supports(model)
    inputs = [[1, 5, 9, 2], [1, 7, 2], [1] + list(range(10, 40)) + [2], [3]]
    hidden, starts = PackedBert(model)(inputs, torch.device("cpu"))
    packed = pool_packed(hidden, starts, mode)
    with torch.no_grad():
        alone = [model(input_ids=torch.tensor([ids])).last_hidden_state for ids in inputs]
    reference = torch.cat([pool(h, torch.ones(h.shape[:2], dtype=torch.long), mode) for h in alone])
    assert torch.allclose(packed, reference, atol=1e-5)


def test_only_a_plain_bert_is_packed() -> None:
    from transformers import BertConfig, BertModel, RobertaConfig, RobertaModel

    from engine_service.model.packed_bert import supports

    small = dict(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64)
    assert not supports(BertModel(BertConfig(**small, is_decoder=True)))
    assert not supports(BertModel(BertConfig(**small, chunk_size_feed_forward=4)))
    assert not supports(RobertaModel(RobertaConfig(**small)))  # its own positions (after the padding id)
