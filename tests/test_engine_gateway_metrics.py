"""The engine as a model server the Kubernetes inference gateway can pick (Gateway API Inference
Extension): its metrics carry the protocol's figures under Conduit's names (vLLM's with the conduit:
prefix), with the protocol's meaning and ranges, and GetLoad (what the shim's router reads) agrees.

The protocol's endpoint picker reads: the queue depth (vllm:num_requests_waiting), the running
requests (vllm:num_requests_running), the KV-cache usage as a 0-1 fraction (vllm:kv_cache_usage_perc)
and the cache layout (vllm:cache_config_info{block_size, num_gpu_blocks}). deploy/kubernetes/
inference-gateway/epp.yaml maps those names to these; the last test checks that it names them all.
"""

from __future__ import annotations

import re
import urllib.request
from pathlib import Path

import openai
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from clients import EngineClient
from launcher.stack import Stack
from common import MODEL, QUESTION, STORY

pytestmark = pytest.mark.model

EPP = Path(__file__).resolve().parent.parent / "deploy" / "kubernetes" / "inference-gateway" / "epp.yaml"
# The protocol's metric (vLLM's name) -> Conduit's, and the EPP flag that names it.
PROTOCOL = {
    "vllm:num_requests_waiting": ("conduit:num_requests_waiting", "--total-queued-requests-metric"),
    "vllm:num_requests_running": ("conduit:num_requests_running", "--total-running-requests-metric"),
    "vllm:kv_cache_usage_perc": ("conduit:kv_cache_usage_perc", "--kv-cache-usage-percentage-metric"),
    "vllm:cache_config_info": ("conduit:cache_config_info", "--cache-info-metric"),
}


def gauges(url: str) -> dict[str, list]:
    """Gauge name -> its samples (the others are left out: the picker reads gauges)."""
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return {family.name: family.samples for family in text_string_to_metric_families(text)
            if family.type == "gauge"}


def test_the_gateway_metrics_have_the_protocols_meaning_and_ranges(stack: Stack,
                                                                   openai_client: openai.OpenAI) -> None:
    assert stack.metrics_url
    stream = openai_client.chat.completions.create(model=MODEL, messages=STORY, max_tokens=48, temperature=0,
                                                   stream=True)
    try:
        next(chunk for chunk in stream if chunk.choices and chunk.choices[0].delta.content)
        busy = gauges(stack.metrics_url)
        with EngineClient(stack.engine_address, timeout=10) as client:
            load = client.load()
    finally:
        stream.close()
    openai_client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=2)

    for name in ("conduit:num_requests_waiting", "conduit:num_requests_running", "conduit:kv_cache_usage_perc"):
        (sample,) = busy[name]
        assert sample.labels == {"model_name": MODEL}, name
    running = busy["conduit:num_requests_running"][0].value
    waiting = busy["conduit:num_requests_waiting"][0].value
    usage = busy["conduit:kv_cache_usage_perc"][0].value
    assert running >= 1 and running == int(running) and waiting >= 0 and waiting == int(waiting)
    assert 0.0 < usage <= 1.0  # a fraction (the protocol's), not a percentage, and the stream holds blocks
    (info,) = busy["conduit:cache_config_info"]
    assert info.value == 1
    block_size, num_blocks = int(info.labels["block_size"]), int(info.labels["num_gpu_blocks"])
    assert block_size > 0 and num_blocks > 0

    # GetLoad tells the router the same facts.
    assert load.running_requests >= 1 and 0.0 < load.kv_cache_usage <= 1.0
    assert (load.block_size, load.num_blocks) == (block_size, num_blocks)
    assert load.model == MODEL and not load.draining and load.prefix_caching

    idle = gauges(stack.metrics_url)  # the stream closed and a short request finished since
    assert 0.0 <= idle["conduit:kv_cache_usage_perc"][0].value <= 1.0


def test_the_endpoint_picker_is_given_conduits_names_for_the_protocols_metrics(stack: Stack) -> None:
    served = gauges(stack.metrics_url)
    documents = [d for d in yaml.safe_load_all(EPP.read_text()) if d]
    (deployment,) = [d for d in documents if d["kind"] == "Deployment"]
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    given = dict(re.fullmatch(r"(--[\w-]+)=(.*)", arg).groups() for arg in args)
    for conduit_name, flag in PROTOCOL.values():
        assert given[flag] == conduit_name and conduit_name in served, flag
    metrics_port = int(given["--model-server-metrics-port"])
    assert stack.metrics_url and metrics_port == 9090  # the engine image's --metrics-port
