"""The engine's numeric promises, on every CPU (docs/engine.md, "Numerics"): a prompt computes the
same bits whether it was cached or not and however it was chunked, because each prompt segment
(model/step.py) is computed with calls of its own.

This machine's kernels may round a row alike whatever the call (AMD EPYC's do); Intel Xeons with AMX
do not. So each check also runs under tests/shape_rounding.py's double, which makes every dense call
round by its shape, and the double is shown to break a prefill that is not cut into segments."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from shape_rounding import nudged, rounding_by_call_shape
from tiny_models import RunnerSeq, tiny_config, tiny_in_memory

from engine_service.core.scheduler import ScheduledBatch
from engine_service.model import attention, cpu_isa
from engine_service.model.kv_cache import CacheShape, KVCache
from engine_service.model.linear import PackedLinear
from engine_service.model.runner import ModelRunner
from engine_service.model.step import Segments

pytestmark = pytest.mark.in_process_engine  # engine code in this process (conftest.py)

CPU = torch.device("cpu")
BLOCK, SEGMENT = 16, 32
SEGMENTS = Segments(BLOCK, SEGMENT)  # a block long up to 32, 32 long after
WHOLE = Segments(1024, 1024)  # no cuts: a prompt in one call
ROUNDING = {"this CPU's": False, "by call shape": True}


@pytest.fixture(params=ROUNDING)
def rounding(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if ROUNDING[request.param]:
        rounding_by_call_shape(monkeypatch)
    return request.param


def test_the_double_rounds_a_row_by_the_calls_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    rounding_by_call_shape(monkeypatch)
    torch.manual_seed(0)
    layer = PackedLinear(torch.randn(64, 48, dtype=torch.bfloat16), None)
    x = torch.randn(6, 48, dtype=torch.bfloat16)
    assert not torch.equal(layer(x[:5]), layer(x)[:5])
    assert torch.equal(nudged(x, 4), x) and not torch.equal(nudged(x, 3), x)  # one shape in three is left alone


def runner(quantization: str, deterministic: bool, segments: Segments = SEGMENTS) -> ModelRunner:
    model = tiny_in_memory(tiny_config(), torch.bfloat16)
    return ModelRunner(model, CPU, torch.bfloat16, BLOCK, 24, 256, quantization=quantization,
                       deterministic=deterministic, segments=segments)


def prefill(engine: ModelRunner, seq: RunnerSeq, chunks: list[int]) -> torch.Tensor:
    """seq's uncached prompt in steps of `chunks` tokens; the next token's logits."""
    for length in chunks:
        logits = engine.run(ScheduledBatch(prefill=[(seq, length)]).step_input())
        seq.num_cached += length
    return logits.next_token[seq.seq_id]


def cold_and_warm(engine: ModelRunner, tokens: list[int], hit: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The prompt whole into blocks 0.., then again from a hit of `hit` tokens (its blocks shared)."""
    blocks = -(-len(tokens) // BLOCK)
    cold = prefill(engine, RunnerSeq(0, tokens, block_table=list(range(blocks))), [len(tokens)])
    shared = list(range(hit // BLOCK))
    own = list(range(blocks, blocks + blocks - len(shared)))
    warm = prefill(engine, RunnerSeq(1, tokens, num_cached=hit, block_table=shared + own), [len(tokens) - hit])
    return cold, warm


@pytest.mark.parametrize("leftover", [1, 5, 17, 40])
@pytest.mark.parametrize("hit", [16, 64], ids=["hit at a block", "hit at a segment"])
@pytest.mark.parametrize("quantization, deterministic", [("int8", False), ("none", False), ("none", True)])
def test_a_prefix_cache_hit_gives_the_cold_prefills_logits(rounding: str, quantization: str, deterministic: bool,
                                                         hit: int, leftover: int) -> None:
    """Cold: the whole prompt in one chunk. Warm: its first tokens cached to a segment's boundary (a
    block's below SEGMENT tokens, a segment's after), the rest prefilled: the same bits."""
    cold, warm = cold_and_warm(runner(quantization, deterministic), list(range(3, 3 + hit + leftover)), hit=hit)
    assert torch.equal(cold, warm)


@pytest.mark.parametrize("chunks", [[32, 32, 9], [64, 9], [32, 41], [16, 16, 41], [16, 57]])
def test_a_prompt_chunked_on_segment_boundaries_gives_the_whole_prompts_logits(rounding: str,
                                                                             chunks: list[int]) -> None:
    engine = runner("int8", False)
    tokens = list(range(3, 3 + sum(chunks)))
    whole = prefill(engine, RunnerSeq(0, tokens, block_table=[0, 1, 2, 3, 4]), [len(tokens)])
    chunked = prefill(engine, RunnerSeq(1, tokens, block_table=[5, 6, 7, 8, 9]), chunks)
    assert torch.equal(whole, chunked)


def test_a_prompt_computed_in_one_call_is_not_the_same_after_a_hit_under_the_double(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The double has teeth: without segments, a warm prefill's calls have other shapes than the cold
    one's, and the logits differ."""
    rounding_by_call_shape(monkeypatch)
    cold, warm = cold_and_warm(runner("int8", False, WHOLE), list(range(3, 3 + 2 * SEGMENT + 5)), hit=2 * SEGMENT)
    assert not torch.equal(cold, warm)


Q_HEADS, KV_HEADS, DIM = 9, 3, 64


class Layer(torch.nn.Module):
    layer_idx = 0


def attend(cache: KVCache, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, first: int,
           segments: Segments) -> torch.Tensor:
    """Positions first..first+n of one sequence (blocks 0, 1, ...), the earlier ones already cached,
    one call per segment as the model runner packs them."""
    n, context = q.shape[2], first + q.shape[2]
    table = torch.arange(-(-context // BLOCK))
    chunks = [attention.PrefillChunk(start - first, length, start + length, table[:-(-(start + length) // BLOCK)])
              for start, length in segments.split(first, n)]
    layout = attention.StepLayout(cache=cache, slot_mapping=torch.arange(first, context), num_decode=0,
                                  decode_block_ids=None, decode_lens=None, max_decode_context=0, prefills=chunks)
    out, _ = attention.paged_attention(Layer(), q, k, v, None, scaling=DIM ** -0.5, layout=layout)
    return out


@pytest.mark.parametrize("length, cached", [(130, 16), (130, 48), (130, 64), (130, 128), (178, 128), (179, 64),
                                            (263, 256), (40, 32)])
def test_attention_over_a_segment_after_cached_ones_matches_the_cold_pass(rounding: str, length: int,
                                                                          cached: int) -> None:
    torch.manual_seed(length * 100 + cached)
    q = torch.randn(1, Q_HEADS, length, DIM, dtype=torch.bfloat16)
    k, v = (torch.randn(1, KV_HEADS, length, DIM, dtype=torch.bfloat16) for _ in range(2))
    cache = KVCache(CacheShape(1, KV_HEADS, DIM, BLOCK, 32), torch.bfloat16, CPU)
    segments = Segments(BLOCK, 64)
    cold = attend(cache, q, k, v, first=0, segments=segments)  # the whole prompt in one step; fills the cache
    warm = attend(cache, q[:, :, cached:], k[:, :, cached:], v[:, :, cached:], first=cached, segments=segments)
    assert torch.equal(warm, cold[:, cached:])


def test_attention_in_one_call_is_not_the_same_after_a_hit_under_the_double(monkeypatch: pytest.MonkeyPatch) -> None:
    rounding_by_call_shape(monkeypatch)
    torch.manual_seed(0)
    q = torch.randn(1, Q_HEADS, 130, DIM, dtype=torch.bfloat16)
    k, v = (torch.randn(1, KV_HEADS, 130, DIM, dtype=torch.bfloat16) for _ in range(2))
    cache = KVCache(CacheShape(1, KV_HEADS, DIM, BLOCK, 32), torch.bfloat16, CPU)
    cold = attend(cache, q, k, v, first=0, segments=WHOLE)
    warm = attend(cache, q[:, :, 64:], k[:, :, 64:], v[:, :, 64:], first=64, segments=WHOLE)
    assert not torch.equal(warm, cold[:, 64:])


def test_deterministic_keeps_onednn_off_amx_unless_the_operator_chose() -> None:
    amx = {"avx512f", "avx512_bf16", "amx_tile", "amx_bf16"}
    environ: dict[str, str] = {}
    assert not cpu_isa.keep_onednn_off_amx(False, amx, environ) and environ == {}, "AMX stays where it pays"
    assert not cpu_isa.keep_onednn_off_amx(True, amx - {"amx_bf16"}, environ) and environ == {}
    assert cpu_isa.keep_onednn_off_amx(True, amx, environ)
    assert environ == {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"}
    assert cpu_isa.describe(amx, environ)["amx"] == "off (ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16)"
    chosen = {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_AMX"}
    assert not cpu_isa.keep_onednn_off_amx(True, amx, chosen) and chosen == {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_AMX"}
    assert cpu_isa.describe(amx, chosen)["amx"] == "on" and cpu_isa.describe(set(), {})["amx"] == "absent"


def test_the_cpus_model_and_flags_are_read_from_cpuinfo(tmp_path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Some Xeon\nflags\t\t: fpu avx512f amx_bf16\n\n")
    assert cpu_isa.cpu_facts(cpuinfo) == ("Some Xeon", {"fpu", "avx512f", "amx_bf16"})
    assert cpu_isa.cpu_facts(tmp_path / "absent") == ("unknown", set())


ROWS_CHECK = """
import torch
from engine_service.model import cpu_isa
from engine_service.model.linear import PackedLinear
cpu_isa.keep_onednn_off_amx(True, cpu_isa.cpu_facts()[1])
torch.manual_seed(0)
for n, k in ((960, 576), (576, 576), (3072, 576), (576, 1536), (8192, 576)):
    layer = PackedLinear(torch.randn(n, k, dtype=torch.bfloat16) * 0.05, None)
    x = torch.randn(96, k, dtype=torch.bfloat16)
    every = layer(x)
    for rows in (*range(2, 18), 31, 32, 33, 47, 64, 95):
        assert torch.equal(layer(x[:rows]), every[:rows]), (n, k, rows)
"""


def test_with_deterministic_the_dense_kernel_gives_a_row_its_bits_in_any_batch_on_this_cpu() -> None:
    """What --deterministic rests on, checked on the CPU that runs the suite as the engine sets oneDNN
    up there: a decode row of the default model's shapes (2 to 95 rows; one row is padded to two)
    gets the same bits from the bf16 kernel whatever the number of rows. In a process of its own:
    oneDNN reads its ISA limit once."""
    subprocess.run([sys.executable, "-c", ROWS_CHECK], check=True, timeout=120)
