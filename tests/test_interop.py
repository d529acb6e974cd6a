"""Conduit from other clients (issue 43), on a real stack (the chat model and all-MiniLM-L6-v2, as `make run-stack`
serves them): the openai SDK for Node (embeddings in float and in its default base64, a list input, a bad
input, a chat completion); a gRPC client in another language generated from the `.proto` at test time:
@grpc/grpc-js with ts-proto's stubs (protoc from grpcio-tools, ts-proto as its plugin, esbuild to JavaScript),
calling Embed and a streamed Generate; and LlamaIndex's OpenAI-like embedding class with its in-memory vector
store. What the Node programs (tests/interop/) got is checked here, against the Python client's answers to the
same requests.

Why ts-proto rather than grpc-tools' grpc_tools_node_protoc: grpc-tools' install downloads its protoc from
grpc.io, not from the npm registry, so it cannot install where only package registries are reachable.

`make test-interop` runs this module (an npm install into the cache the first time): left out of `make test`
unless CONDUIT_INTEROP_TESTS=1 (importing LlamaIndex alone takes ~5 s here).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from clients import EngineClient
from conduit.v1 import engine_pb2 as pb
from conftest import STARTUP_TIMEOUT_S
from engine_service.model.cache_dir import cache_dir
from launcher.stack import Stack

pytestmark = [pytest.mark.slow, pytest.mark.model, pytest.mark.timeout(900),  # a first npm install included
              pytest.mark.skipif(os.environ.get("CONDUIT_INTEROP_TESTS") != "1",
                                 reason="the interop tests run with `make test-interop`")]

HERE = Path(__file__).parent
REPO = HERE.parent
PACKAGES = HERE / "interop" / "package.json"
EMBEDDING_MODEL = "all-MiniLM-L6-v2"
TEXTS = ["What is the capital of France?", "Paris is the capital and largest city of France.",
         "Der schnelle braune Fuchs springt über den faulen Hund.", "東京は日本の首都です。",
         "I love pizza 🍕🍕 and rain ☔", "x"]
MIN_COSINE = 0.9999
PROMPT, MAX_TOKENS = "Write a sentence about the sea.", 12
DOCUMENTS = {
    "paris": "Paris is the capital and largest city of France, on the river Seine.",
    "python": "Python is a programming language known for its readable syntax.",
    "whales": "Blue whales are the largest animals that ever lived; they feed on krill in the ocean.",
    "sourdough": "Sourdough bread rises with wild yeast and lactic acid bacteria instead of baker's yeast.",
    "volcano": "A volcano erupts when magma from deep below rises through the crust.",
}
QUERIES = {"Which city is the capital of France?": "paris", "Which language is easy to read for programmers?": "python",
           "What do the biggest sea mammals eat?": "whales", "How is sourdough bread leavened?": "sourdough",
           "Why does lava come out of a mountain?": "volcano"}


@pytest.fixture(scope="module")
def node_modules() -> Path:
    """tests/interop/package.json's packages (exact versions), installed once into the cache under
    the file's hash, so a change of version installs anew."""
    if shutil.which("npm") is None:
        pytest.fail("npm is missing: run `make test-interop` (it installs Debian's nodejs and npm)")
    prefix = cache_dir() / "interop" / hashlib.sha256(PACKAGES.read_bytes()).hexdigest()[:16]
    done = prefix / "installed"
    if not done.exists():
        prefix.mkdir(parents=True, exist_ok=True)
        shutil.copy(PACKAGES, prefix / "package.json")
        subprocess.run(["npm", "install", "--prefix", str(prefix), "--no-audit", "--no-fund", "--no-package-lock"],
                       check=True, timeout=900)
        done.touch()
    return prefix / "node_modules"


@pytest.fixture(scope="module")
def generated_stubs(node_modules: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """engine.proto's messages and Engine client for grpc-js, generated now (nothing generated is
    committed): ts-proto as a protoc plugin, then esbuild to a CommonJS module."""
    out = tmp_path_factory.mktemp("node_stubs")
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", "-I", str(REPO / "protos"),
                    f"--plugin=protoc-gen-ts_proto={node_modules / '.bin' / 'protoc-gen-ts_proto'}",
                    f"--ts_proto_out={out}", "--ts_proto_opt=outputServices=grpc-js,env=node",
                    str(REPO / "protos" / "conduit" / "v1" / "engine.proto")], check=True, timeout=120)
    module = out / "engine.cjs"
    subprocess.run([str(node_modules / ".bin" / "esbuild"), str(out / "conduit" / "v1" / "engine.ts"),
                    "--format=cjs", "--platform=node", f"--outfile={module}", "--log-level=warning"],
                   check=True, timeout=120)
    return module


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    with Stack(embedding_model=EMBEDDING_MODEL, startup_timeout=STARTUP_TIMEOUT_S) as running:
        yield running


@pytest.fixture(scope="module")
def python_embeddings(stack: Stack) -> pb.EmbedResponse:
    """The Python client's answer for TEXTS: what the Node clients' vectors must equal."""
    with EngineClient(stack.embedding_address) as engine:
        return engine.embed(TEXTS, timeout=120)


def run_node(node_modules: Path, script: str, **settings: object) -> dict:
    """Runs tests/interop/SCRIPT with the installed packages and SETTINGS (as JSON); its JSON report."""
    done = subprocess.run(["node", str(HERE / "interop" / script), json.dumps(settings)], capture_output=True,
                          text=True, timeout=240, env={**os.environ, "NODE_PATH": str(node_modules)})
    assert done.returncode == 0, f"node {script} failed:\n{done.stderr[-4000:]}"
    return json.loads(done.stdout)


def assert_same_vectors(vectors: list[list[float]], expected: pb.EmbedResponse) -> None:
    got = np.array(vectors, dtype=np.float64)
    want = np.array([list(e.values) for e in expected.embeddings], dtype=np.float64)
    assert got.shape == want.shape == (len(want), 384)
    cosine = (got * want).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
    assert cosine.min() >= MIN_COSINE, f"cosines {cosine}"


def test_openai_sdk_for_node(stack: Stack, node_modules: Path, python_embeddings: pb.EmbedResponse) -> None:
    """Embeddings through the Node SDK's default path (it asks for base64 and decodes it) and in
    float, one input and a list; a bad input raises its BadRequestError naming the input; a chat
    completion."""
    chat_model = EngineClient(stack.engine_address).list_models()[0].id
    got = run_node(node_modules, "openai_sdk.cjs", baseURL=stack.base_url, embeddingModel=EMBEDDING_MODEL,
                   chatModel=chat_model, texts=TEXTS)
    assert_same_vectors(got["default"]["vectors"], python_embeddings)
    assert_same_vectors(got["float"]["vectors"], python_embeddings)
    assert got["default"]["indexes"] == list(range(len(TEXTS))) and got["default"]["model"] == EMBEDDING_MODEL
    usage = got["default"]["usage"]
    assert usage["prompt_tokens"] == usage["total_tokens"] == python_embeddings.prompt_tokens
    single = got["single"]["vectors"]
    assert len(single) == 1
    assert_same_vectors(single, pb.EmbedResponse(embeddings=python_embeddings.embeddings[:1]))
    assert got["refused"] == {"badRequest": True, "status": 400, "param": "input[1]", "type": "invalid_request_error",
                              "message": got["refused"]["message"]}
    assert got["chat"]["content"] and got["chat"]["finishReason"] in ("stop", "length")
    assert 0 < got["chat"]["usage"]["completion_tokens"] <= 5


def test_grpc_client_generated_from_the_proto(stack: Stack, node_modules: Path, generated_stubs: Path,
                                              python_embeddings: pb.EmbedResponse) -> None:
    """Embed equals the Python client's vectors and token counts; an empty input is INVALID_ARGUMENT
    naming it; Generate streams the same greedy text as the Python client's, in several chunks."""
    got = run_node(node_modules, "grpc_engine.cjs", stubs=str(generated_stubs),
                   embeddingAddress=stack.embedding_address, chatAddress=stack.engine_address, texts=TEXTS,
                   prompt=PROMPT, maxTokens=MAX_TOKENS)
    assert_same_vectors(got["embed"]["vectors"], python_embeddings)
    assert got["embed"]["promptTokens"] == [e.prompt_tokens for e in python_embeddings.embeddings]
    assert got["embed"]["total"] == python_embeddings.prompt_tokens
    assert got["embed"]["model"] == EMBEDDING_MODEL
    assert got["refused"]["codeName"] == "INVALID_ARGUMENT" and got["refused"]["param"] == "inputs[1]"
    generate = got["generate"]
    with EngineClient(stack.engine_address) as engine:
        expected = engine.complete(pb.GenerateRequest(
            chat=pb.ChatInput(messages=[pb.ChatMessage(role="user", content=PROMPT)]),
            sampling=pb.SamplingParams(temperature=0), stopping=pb.StoppingParams(max_tokens=MAX_TOKENS)),
            timeout=120)
    assert len([text for text in generate["chunks"] if text]) >= 2
    assert "".join(generate["chunks"]) == expected.text
    assert generate["finishReason"] == f"FINISH_REASON_{expected.choices[0].finish_reason.upper()}"
    assert generate["completionTokens"] == expected.choices[0].completion_tokens


def test_llamaindex_embeddings_and_vector_store(stack: Stack, python_embeddings: pb.EmbedResponse) -> None:
    """LlamaIndex's class for OpenAI-compatible servers, as its docs configure it, gets the Python
    client's vectors; its in-memory VectorStoreIndex retrieves the right document for each query."""
    # Imported here: ~5 s, paid only where the test runs (the module is imported, and skipped, in `make test`).
    from llama_index.core import Document, VectorStoreIndex
    from llama_index.embeddings.openai_like import OpenAILikeEmbedding

    embed_model = OpenAILikeEmbedding(model_name=EMBEDDING_MODEL, api_base=stack.base_url, api_key="unused",
                                      max_retries=0)
    assert_same_vectors(embed_model.get_text_embedding_batch(TEXTS), python_embeddings)
    index = VectorStoreIndex.from_documents([Document(text=text, doc_id=name) for name, text in DOCUMENTS.items()],
                                            embed_model=embed_model)  # no LLM: a retriever needs none
    retriever = index.as_retriever(similarity_top_k=1)
    assert {query: retriever.retrieve(query)[0].node.ref_doc_id for query in QUERIES} == QUERIES
