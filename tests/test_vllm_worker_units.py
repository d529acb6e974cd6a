"""The Shepherd gateway's worker protocol (vllm.grpc.engine, smg-grpc-proto) without a model: the
KV events the block manager publishes (as the gateway's indexer reads them), the sampling fields'
mapping and refusals, and the messages a Generate call streams. tests/test_smg_gateway.py runs the
real gateway over real engines."""

from __future__ import annotations

import asyncio

import pytest
from smg_grpc_proto.generated import vllm_engine_pb2 as vpb

from engine_service.core.block_manager import BlockManager, block_hash
from engine_service.core.events import ChunkEvent, FinalEvent, FinishReason, PromptEvent, TokenLogprob
from engine_service.core.params import InvalidRequest, RequestParams, SamplingParams, StoppingParams
from engine_service.core.sequence import Request, Sequence
from engine_service.serving.kv_events import KvEventPublisher, block_name
from engine_service.serving.vllm_outputs import VllmEncoder
from engine_service.serving.vllm_params import Unsupported, check_supported, constraint, proto_field, request_params

pytestmark = pytest.mark.in_process_engine  # engine code in this process (conftest.py)

BLOCK = 4


def admitted(blocks: BlockManager, tokens: list[int]) -> Sequence:
    request = Request("r", list(tokens), RequestParams(SamplingParams(), StoppingParams()), max_tokens=100,
                      sink=lambda events: None)
    seq = Sequence(request, 0, stop_ids=set(), matcher=None, output=None)
    assert blocks.admit(seq, use_cache=True)
    return seq


def computed(blocks: BlockManager, tokens: list[int]) -> Sequence:
    """A sequence admitted and prefilled: its full blocks offered to the cache, as a step does."""
    seq = admitted(blocks, tokens)
    seq.num_cached = len(seq.token_ids)
    blocks.register_full_blocks(seq)
    return seq


def names(tokens: list[int]) -> list[int]:
    """The block names the gateway should get for a prompt's full blocks."""
    keys, parent = [], b""
    for start in range(0, len(tokens) - len(tokens) % BLOCK, BLOCK):
        parent = block_hash(parent, tokens[start:start + BLOCK])
        keys.append(block_name(parent))
    return keys


class Subscriber:
    """One SubscribeKvEvents stream, read on its own event loop as the server's would be."""

    def __init__(self, publisher: KvEventPublisher, loop: asyncio.AbstractEventLoop, start: int = 0) -> None:
        self.loop = loop
        self.stream = publisher.subscribe(start)

    def next(self):
        return self.loop.run_until_complete(asyncio.wait_for(self.stream.__anext__(), 5))

    def settle(self) -> None:
        """Run what the engine thread handed the loop (call_soon_threadsafe)."""
        self.loop.run_until_complete(asyncio.sleep(0))


@pytest.fixture
def loop():
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def test_kv_events_name_each_stored_block_with_its_parent_and_the_gateway_reconnects_to_a_snapshot(loop):
    blocks = BlockManager(8, BLOCK, lambda src, dst: None)
    publisher = KvEventPublisher(blocks)
    before = computed(blocks, list(range(9)))
    assert blocks.listener is None, "no events are made before anyone subscribes"
    blocks.free(before)

    first = Subscriber(publisher, loop)
    opening = first.next()  # what was cached before anyone subscribed is in the first snapshot too
    assert opening.sequence_number == 1
    assert [e.WhichOneof("data") for e in opening.events] == ["cleared", "stored", "stored"]
    assert [e.stored.blocks[0].block_hash for e in opening.events[1:]] == names(list(range(9)))
    assert opening.events[2].stored.parent_block_hash == names(list(range(9)))[0]

    prompt = [50 + t for t in range(10)]
    held = computed(blocks, prompt)  # two full blocks: one stored event, the chain from the prompt's start
    first.settle()
    batch = first.next()
    assert batch.sequence_number == 2
    (event,) = batch.events
    assert [b.block_hash for b in event.stored.blocks] == names(prompt)
    assert [list(b.token_ids) for b in event.stored.blocks] == [prompt[:4], prompt[4:8]]
    assert all(b.block_size == BLOCK for b in event.stored.blocks) and not event.stored.HasField("parent_block_hash")

    longer = admitted(blocks, prompt[:8] + [7, 7, 7, 7, 7])  # shares two blocks, fills a third
    longer.num_cached = len(longer.token_ids)
    blocks.register_full_blocks(longer)
    first.settle()
    (event,) = first.next().events
    assert event.stored.parent_block_hash == names(prompt)[1]
    assert [b.block_hash for b in event.stored.blocks] == names(prompt[:8] + [7, 7, 7, 7])[2:]

    # A reconnect after batch 3 gets batch 4: the whole cache, parents first, after a clear.
    second = Subscriber(publisher, loop, start=3)
    snapshot = second.next()
    assert snapshot.sequence_number == 4
    kinds = [e.WhichOneof("data") for e in snapshot.events]
    assert kinds == ["cleared"] + ["stored"] * 5
    sent = [e.stored.blocks[0].block_hash for e in snapshot.events[1:]]
    chain = names(prompt[:8] + [7, 7, 7, 7])
    assert [name for name in sent if name in chain] == chain and set(sent) == {*chain, *names(list(range(9)))}
    parents = {e.stored.blocks[0].block_hash: e.stored.parent_block_hash for e in snapshot.events[1:]
               if e.stored.HasField("parent_block_hash")}
    assert parents == {chain[1]: chain[0], chain[2]: chain[1], names(list(range(9)))[1]: names(list(range(9)))[0]}

    blocks.free(held)
    blocks.free(longer)
    everything = admitted(blocks, [90 + t for t in range(8 * BLOCK - 1)])  # takes all 8 blocks: the cached go
    first.settle()
    removed = [h for e in first.next().events for h in e.removed.block_hashes]
    assert len(removed) == 5 and set(names(prompt[:8] + [7, 7, 7, 7])) <= set(removed)  # and `before`'s two

    blocks.free(everything)
    blocks.flush_requested = True
    admitted(blocks, [1])  # the engine thread forgets the cache at the next admission
    first.settle()
    assert [e.WhichOneof("data") for e in first.next().events] == ["cleared"]


def test_flush_makes_the_next_admission_find_nothing_cached():
    blocks = BlockManager(8, BLOCK, lambda src, dst: None)
    blocks.free(computed(blocks, list(range(9))))
    blocks.flush_requested = True
    again = admitted(blocks, list(range(9)))
    assert again.num_cached == 0 and blocks.num_free == 8 - 3


def test_sampling_fields_map_to_the_engines_parameters_with_vllm_zeros_as_unset():
    params = request_params(vpb.SamplingParams())
    assert (params.sampling.temperature, params.sampling.top_p, params.sampling.repetition_penalty) == (1.0, 1.0, 1.0)
    assert (params.n, params.logprobs, params.stopping.max_tokens, params.sampling.seed) == (1, False, None, None)
    params = request_params(vpb.SamplingParams(
        temperature=0, top_p=0.5, top_k=3, min_p=0.1, repetition_penalty=1.1, frequency_penalty=0.2,
        presence_penalty=0.3, max_tokens=7, min_tokens=2, stop=["x"], stop_token_ids=[5], ignore_eos=True, n=3,
        logprobs=2, seed=-4, logit_bias={11: 5.0}))
    assert params.sampling == SamplingParams(temperature=0.0, top_p=0.5, top_k=3, min_p=pytest.approx(0.1),
                                             repetition_penalty=pytest.approx(1.1),
                                             frequency_penalty=pytest.approx(0.2), presence_penalty=pytest.approx(0.3),
                                             logit_bias={11: 5.0}, seed=-4)
    assert params.stopping == StoppingParams(max_tokens=7, min_tokens=2, stop=["x"], stop_token_ids=[5],
                                             ignore_eos=True)
    assert (params.n, params.logprobs, params.top_logprobs, params.echo) == (3, True, 2, False)
    prompt_only = request_params(vpb.SamplingParams(prompt_logprobs=1))
    assert (prompt_only.logprobs, prompt_only.top_logprobs, prompt_only.wants_prompt_logprobs) == (True, 1, True)
    with pytest.raises(InvalidRequest):
        request_params(vpb.SamplingParams(logprobs=-2))
    with pytest.raises(InvalidRequest) as bad:
        request_params(vpb.SamplingParams(temperature=9)).validate(100)
    assert proto_field(bad.value.param) == "sampling_params.temperature"


@pytest.mark.parametrize("request_, refused", [
    (vpb.GenerateRequest(sampling_params=vpb.SamplingParams(structural_tag="{}")), "structural_tag"),
    (vpb.GenerateRequest(sampling_params=vpb.SamplingParams(logprobs=-1)), "logprobs=-1"),
    (vpb.GenerateRequest(sampling_params=vpb.SamplingParams(truncate_prompt_tokens=5)), "truncate_prompt_tokens"),
    (vpb.GenerateRequest(mm_inputs=vpb.MultimodalInputs(mm_hashes=["h"])), "mm_inputs"),
    (vpb.GenerateRequest(kv_transfer_params_json="{}"), "kv_transfer_params_json"),
    (vpb.GenerateRequest(data_parallel_rank=1), "data_parallel_rank"),
    (vpb.GenerateRequest(sampling_params=vpb.SamplingParams(logprobs=1, prompt_logprobs=2)), "prompt_logprobs"),
])
def test_what_the_engine_does_not_do_is_refused_by_name(request_, refused):
    with pytest.raises(Unsupported, match=refused):
        check_supported(request_)
    check_supported(vpb.GenerateRequest(data_parallel_rank=0, sampling_params=vpb.SamplingParams(logprobs=1)))


def test_constraints_map_onto_the_engines_kinds():
    assert constraint(vpb.SamplingParams()) is None
    assert constraint(vpb.SamplingParams(json_object=True)).json_object
    assert constraint(vpb.SamplingParams(json_schema='{"type": "object"}')).json_schema == '{"type": "object"}'
    assert constraint(vpb.SamplingParams(regex="[ab]+")).regex == "[ab]+"
    assert constraint(vpb.SamplingParams(grammar='root ::= "yes" | "no"')).grammar.split() == \
        ["%llguidance", "{}", "start:", '"yes"', "|", '"no"']  # GBNF, vLLM's dialect, converted to Lark
    assert constraint(vpb.SamplingParams(choice=vpb.ChoiceConstraint(choices=['a"b', "c"]))).grammar == \
        'start: "a\\"b" | "c"'
    with pytest.raises(InvalidRequest):
        constraint(vpb.SamplingParams(choice=vpb.ChoiceConstraint()))


def lp(token: int) -> TokenLogprob:
    return TokenLogprob(token, -0.5, [(token, -0.5), (token + 1, -1.5)])


EVENTS = [PromptEvent([1, 2, 3], None, cached_tokens=2),
          ChunkEvent(0, "a", [10, 11], [lp(10), lp(11)], 3, 2),
          ChunkEvent(0, "b", [12], [lp(12)], 3, 3),
          FinalEvent(0, FinishReason.STOP, 3, 3, matched_stop="<stop>")]


def test_streamed_chunks_carry_new_ids_and_the_final_names_the_matched_stop_token():
    encoder = VllmEncoder(stream=True, logprobs=True, top=2, stop_token_ids=[12])
    messages = [m for m in map(encoder.encode, EVENTS) if m is not None]
    chunks = [m.chunk for m in messages[:2]]
    assert [list(c.token_ids) for c in chunks] == [[10, 11], [12]]
    assert [(c.prompt_tokens, c.completion_tokens, c.cached_tokens) for c in chunks] == [(3, 2, 2), (3, 1, 2)]
    assert list(chunks[0].output_logprobs.top_logprobs[1].token_ids) == [11, 12]
    complete = messages[2].complete
    assert (complete.finish_reason, complete.WhichOneof("matched_stop"), complete.matched_token_id) == \
        ("stop", "matched_token_id", 12)
    assert (list(complete.output_ids), complete.completion_tokens, complete.cached_tokens) == ([12], 3, 2)


def test_unstreamed_complete_holds_every_id_a_stop_string_and_an_abort_reads_as_vllms():
    encoder = VllmEncoder(stream=False, logprobs=False, top=0, stop_token_ids=[])
    (message,) = [m for m in map(encoder.encode, EVENTS) if m is not None]
    assert list(message.complete.output_ids) == [10, 11, 12] and message.complete.matched_stop_str == "<stop>"
    assert not message.complete.HasField("output_logprobs")
    def final(reason: FinishReason, index: int = 0):
        encoder = VllmEncoder(stream=True, logprobs=False, top=0, stop_token_ids=[])
        return encoder.encode(FinalEvent(index, reason, 3, 3))
    eos = final(FinishReason.STOP)
    assert eos.complete.WhichOneof("matched_stop") is None, "an EOS matches no stop, as in vLLM"
    cut = final(FinishReason.CANCELLED, index=1)
    assert (cut.complete.finish_reason, cut.complete.index) == ("abort", 1)
