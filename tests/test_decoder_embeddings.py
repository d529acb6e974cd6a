"""A generation engine started with enable_embeddings (--enable-embeddings) serves Embed beside
Generate (serving/decoder_embed.py): each input a prefill-only sequence of the scheduler, its vector
the final norm's hidden row at its last token, normalized. Checked against transformers' AutoModel
on each input alone, on a tiny random Llama (with all-MiniLM-L6-v2's tokenizer, for want of a small
one) in float32 without quantization, through real gRPC to an engine in this process."""

from __future__ import annotations

import asyncio
import copy
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import torch

from clients.engine_client import EngineClient
from conduit.v1 import engine_pb2 as pb
from conduit.v1 import engine_pb2_grpc as pb_grpc
from conduit.v1.contract import PARAM_METADATA_KEY
from engine_service.core.config import EngineConfig, LoraConfig, LoraModule
from engine_service.core.engine import Engine, build_engine
from engine_service.core.scheduler import ScheduledBatch
from engine_service.model.runner import ModelRunner
from engine_service.serving.background import BackgroundServer
from engine_service.serving.decoder_embed import DecoderEmbedServicer
from engine_service.serving.server import EngineServicer, outputs_to
from engine_service.serving.vllm_worker import VllmWorker
from lora_files import merged, scale_of, write_adapter
from tiny_models import RunnerSeq, tiny_config, tiny_in_memory

pytestmark = pytest.mark.in_process_engine

CONTEXT = 128  # the tiny model's max_position_embeddings


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from engine_service.model.embedding_wheel import default_embedding_folder

    path = tmp_path_factory.mktemp("tiny-llama")
    tokenizer = AutoTokenizer.from_pretrained(default_embedding_folder())
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=CONTEXT)
    LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def reference(folder: Path, inputs: list[list[int]], model: torch.nn.Module | None = None) -> torch.Tensor:
    """transformers' AutoModel (or the base `model` of a causal LM): each input's last hidden state alone,
    normalized."""
    from transformers import AutoModel

    model = model or AutoModel.from_pretrained(folder).eval()
    with torch.no_grad():
        rows = [model(input_ids=torch.tensor([ids])).last_hidden_state[0, -1] for ids in inputs]
    return torch.nn.functional.normalize(torch.stack(rows), dim=-1)


class Pump:
    """The engine loop's job, from a thread the test owns: each step's outputs to the server's loop.
    `paused` holds it between steps (so a test can catch a request in the middle of its prompt)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.running = threading.Event()
        self.running.set()
        self._stop = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        loop = self.engine.loop
        while not self._stop:
            if self.running.is_set():
                loop.on_outputs(loop.step())
            time.sleep(0.002)

    def step_once(self) -> None:
        """One step while paused, here."""
        loop = self.engine.loop
        loop.on_outputs(loop.step())

    def close(self) -> None:
        self._stop = True
        self._thread.join(timeout=10)


def serve(folder: Path, enable: bool, **config) -> tuple[BackgroundServer, Engine]:
    from engine_service.model.loader import load_model

    grpc_loop = asyncio.new_event_loop()
    loaded = load_model(str(folder), device="cpu", dtype="float32")
    engine = build_engine(loaded, EngineConfig(enable_embeddings=enable, quantization="none", kv_cache_tokens=1024,
                                               block_size=8, **config), on_outputs=outputs_to(grpc_loop))
    servicer = DecoderEmbedServicer(engine) if enable else EngineServicer(engine)
    return BackgroundServer(servicer, "127.0.0.1", 0, loop=grpc_loop, companions=[VllmWorker(servicer).add_to]
                            ).start(), engine


@pytest.fixture(scope="module")
def served(folder: Path) -> Iterator[tuple[BackgroundServer, Engine, Pump]]:
    # A small step budget: a long input's prompt spans several steps (chunked prefill).
    server, engine = serve(folder, True, max_step_tokens=16, max_batch_size=4)
    pump = Pump(engine)
    yield server, engine, pump
    pump.close()
    server.stop(grace=1.0)


@pytest.fixture
def client(served) -> Iterator[EngineClient]:
    with EngineClient(served[0].address, timeout=60) as engine_client:
        yield engine_client


TEXTS = ["a short one", "x", "a much longer input whose prompt takes several of this engine's sixteen-token steps, "
         "so only its last chunk gives the vector"]


def test_vectors_equal_transformers_last_hidden_state_on_each_input_alone(folder, served, client) -> None:
    engine = served[1]
    blocks = engine.scheduler.blocks
    free, cached = blocks.num_free, len(blocks.chains)
    response = client.embed(TEXTS)
    ids = [engine.tokenizer(text)["input_ids"] for text in TEXTS]
    assert len(ids[2]) > 16  # chunked
    got = torch.tensor([list(e.values) for e in response.embeddings])
    assert torch.allclose(got, reference(folder, ids), atol=1e-4)
    assert [e.prompt_tokens for e in response.embeddings] == [len(i) for i in ids]
    assert response.prompt_tokens == sum(map(len, ids)) and response.model == folder.name
    # Token ids embed alike; and every block went back, none offered to the prefix cache.
    again = client.embed([ids[1]])
    assert torch.allclose(torch.tensor(list(again.embeddings[0].values)), got[1], atol=1e-5)
    assert blocks.num_free == free and len(blocks.chains) == cached and not engine.scheduler.running


def test_a_lora_adapters_name_as_model_embeds_with_the_adapter(folder, tmp_path) -> None:
    """--enable-lora beside --enable-embeddings: `model` = an adapter's name gives the vectors of the base model
    with that adapter merged (never the base model's under the adapter's name), and names the adapter back."""
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(folder).eval()
    pairs = write_adapter(tmp_path / "tuned", base, ("q_proj", "down_proj"), 4, 8.0, seed=3)
    server, engine = serve(folder, True, lora=LoraConfig(modules=(LoraModule("tuned", str(tmp_path / "tuned")),)))
    pump = Pump(engine)
    try:
        with EngineClient(server.address, timeout=60) as engine_client:
            tuned, plain = engine_client.embed(TEXTS, model="tuned"), engine_client.embed(TEXTS)
    finally:
        pump.close()
        server.stop(grace=1.0)
    ids = [engine.tokenizer(text)["input_ids"] for text in TEXTS]
    want = reference(folder, ids, merged(base, pairs, scale_of(4, 8.0)).model)
    vectors = lambda response: torch.tensor([list(e.values) for e in response.embeddings])  # noqa: E731
    assert torch.allclose(vectors(tuned), want, atol=1e-4) and tuned.model == "tuned"
    assert torch.allclose(vectors(plain), reference(folder, ids), atol=1e-4)
    assert not torch.allclose(vectors(plain), want, atol=1e-2), "the adapter changes the vectors"


def test_an_embed_beside_a_running_stream(folder, served, client) -> None:
    """Both arrive while the engine is paused, so they start in the same step and share the next ones
    (the long input's prompt spans several): the stream's text is what it is alone (greedy), the vectors
    the reference's."""
    _, engine, pump = served
    request = pb.GenerateRequest(text="once upon a time", sampling=pb.SamplingParams(temperature=0),
                                 stopping=pb.StoppingParams(max_tokens=24, ignore_eos=True))
    alone = client.complete(request).text
    answers: list[pb.EmbedResponse] = []
    pump.running.clear()
    try:
        stream = client.generate(request)
        call = threading.Thread(target=lambda: answers.append(client.embed(TEXTS)))
        call.start()
        wait_for(lambda: len(engine.loop.inbox) == 2)
    finally:
        pump.running.set()
    text = "".join(m.chunk.text for m in stream if m.HasField("chunk"))
    call.join()
    assert text == alone
    ids = [engine.tokenizer(t)["input_ids"] for t in TEXTS]
    assert torch.allclose(torch.tensor([list(e.values) for e in answers[0].embeddings]), reference(folder, ids),
                          atol=1e-4)


def test_the_gateways_embed_is_served_too(folder, served) -> None:
    """vllm.grpc.engine's Embed (the Shepherd gateway's protocol, one input's ids a call) on the same port."""
    from smg_grpc_proto.generated import vllm_engine_pb2 as vpb, vllm_engine_pb2_grpc as vpb_grpc

    ids = served[1].tokenizer(TEXTS[0])["input_ids"]
    with grpc.insecure_channel(served[0].address) as channel:
        answer = vpb_grpc.VllmEngineStub(channel).Embed(vpb.EmbedRequest(tokenized=vpb.TokenizedInput(input_ids=ids)),
                                                        timeout=30)
    assert answer.prompt_tokens == len(ids) and answer.embedding_dim == 32
    assert torch.allclose(torch.tensor([list(answer.embedding)]), reference(folder, [ids]), atol=1e-4)


def embed_error(address: str, request: pb.EmbedRequest) -> grpc.RpcError:
    with grpc.insecure_channel(address) as channel:
        with pytest.raises(grpc.RpcError) as caught:
            pb_grpc.EngineStub(channel).Embed(request, timeout=30)
    return caught.value


def test_bad_inputs_are_invalid_argument_naming_the_input(served) -> None:
    address = served[0].address
    error = embed_error(address, pb.EmbedRequest())
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "inputs must not be empty" in error.details()
    error = embed_error(address, pb.EmbedRequest(inputs=[pb.EmbedInput(text="fine"), pb.EmbedInput(text="")]))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (PARAM_METADATA_KEY, "inputs[1]") in error.trailing_metadata()
    too_long = pb.EmbedInput(text="word " * (CONTEXT + 10))
    error = embed_error(address, pb.EmbedRequest(inputs=[pb.EmbedInput(text="fine"), too_long]))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "maximum context length is 128" in error.details()
    assert (PARAM_METADATA_KEY, "inputs[1]") in error.trailing_metadata()
    error = embed_error(address, pb.EmbedRequest(inputs=[pb.EmbedInput(text="a")], dimensions=8))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and (PARAM_METADATA_KEY, "dimensions") in \
        error.trailing_metadata()


def test_truncation_fits_a_long_input_to_the_context(folder, served, client) -> None:
    response = client.embed(["word " * (CONTEXT + 10)], truncate_prompt_tokens=0)
    assert response.embeddings[0].prompt_tokens == CONTEXT


def test_a_cancelled_embed_frees_its_blocks(served) -> None:
    """Caught in the middle of its prompt (the engine paused between steps), then cancelled by its
    client: the engine ends it at the next step and every block it held goes back."""
    server, engine, pump = served
    blocks = engine.scheduler.blocks
    free = blocks.num_free
    pump.running.clear()
    try:
        time.sleep(0.05)  # let a step in progress finish
        with grpc.insecure_channel(server.address) as channel:
            call = pb_grpc.EngineStub(channel).Embed.future(
                pb.EmbedRequest(inputs=[pb.EmbedInput(text="word " * 60)]), timeout=60)
            wait_for(lambda: len(engine.loop.inbox) == 1)
            pump.step_once()  # admitted: its first 16-token chunk computed
            assert engine.scheduler.running and blocks.num_free < free
            call.cancel()
            with pytest.raises(grpc.FutureCancelledError):
                call.result()
        wait_for(lambda: bool(engine.loop.inbox._aborts))
        pump.step_once()
        assert not engine.scheduler.running and blocks.num_free == free
    finally:
        pump.running.set()


def wait_for(condition, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition never met"
        time.sleep(0.01)


def test_without_the_flag_embed_is_failed_precondition(folder) -> None:
    server, engine = serve(folder, False)
    try:
        error = embed_error(server.address, pb.EmbedRequest(inputs=[pb.EmbedInput(text="a")]))
        assert error.code() == grpc.StatusCode.FAILED_PRECONDITION and "--enable-embeddings" in error.details()
    finally:
        server.stop(grace=1.0)


@pytest.mark.parametrize("lean", [True, False])
def test_the_runner_gives_the_final_norms_row_of_a_prompts_last_chunk(lean: bool) -> None:
    """ModelRunner on both forwards (the lean Llama's and transformers'): a prompt in two chunks gives
    its hidden row only with the last; it equals the base model's last_hidden_state."""
    model = tiny_in_memory(tiny_config(), torch.float32)
    with torch.no_grad():
        want = copy.deepcopy(model).model(input_ids=torch.tensor([list(range(3, 23))])).last_hidden_state[0, -1]
    runner = ModelRunner(model, torch.device("cpu"), torch.float32, 16, 8, 256, quantization="none",
                         lean_forward=lean)
    assert (runner.lean is not None) == lean
    seq = RunnerSeq(0, list(range(3, 23)), block_table=[0, 1])
    first = runner.run(ScheduledBatch(prefill=[(seq, 12)]).step_input(wants_hidden={0}))
    assert first.hidden == {}
    seq.num_cached = 12
    last = runner.run(ScheduledBatch(prefill=[(seq, 8)]).step_input(wants_hidden={0}))
    assert torch.allclose(last.hidden[0], want, atol=1e-5)
    assert 0 in last.next_token  # logits as ever


def test_the_shim_serves_embeddings_for_the_chat_model_id(folder, served) -> None:
    """/v1/embeddings through a real shim in front of the engine, for the chat model's own id."""
    import openai

    from fake_engine import start_shim, stop_process

    process, url = start_shim(served[0].address)
    try:
        sdk = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)
        response = sdk.embeddings.create(model=folder.name, input=TEXTS)  # base64, decoded by the SDK
        sdk.close()
    finally:
        stop_process(process)
    ids = [served[1].tokenizer(t)["input_ids"] for t in TEXTS]
    got = torch.tensor([item.embedding for item in response.data])
    assert torch.allclose(got, reference(folder, ids), atol=1e-4)
    assert response.usage.prompt_tokens == sum(map(len, ids))
