"""A KV cache too small for the batch: the engine preempts and every request still finishes in full.

On an engine of its own, so apart from test_engine_batching.py, whose other tests share the session
stack: the suite's scheduler runs all those modules on one worker, and this one can go to the other."""

from __future__ import annotations

import grpc
import pytest
from conftest import STARTUP_TIMEOUT_S
from test_engine_batching import PROMPTS, chat, collect, run_concurrently

from launcher.stack import Stack
from conduit.v1 import engine_pb2 as pb
from conduit.v1 import engine_pb2_grpc as pb_grpc

pytestmark = pytest.mark.model


def test_kv_cache_exhaustion_preempts_and_every_request_still_finishes():
    with Stack(engine_args=["--kv-cache-tokens", "320", "--max-batch-size", "8"],
               startup_timeout=STARTUP_TIMEOUT_S) as small:
        with grpc.insecure_channel(small.engine_address) as channel:
            stub = pb_grpc.EngineStub(channel)
            requests = [chat(p, stopping=pb.StoppingParams(max_tokens=120, ignore_eos=True)) for p in PROMPTS[:5]]
            results = run_concurrently(stub, requests)
            assert [r["final"][0].completion_tokens for r in results] == [120] * 5
            assert collect(stub, chat(PROMPTS[0], max_tokens=8))["final"][0].completion_tokens > 0
