"""LoRA adapters loaded and unloaded at run time (docs/lora.md), on real processes: two engine replicas of the
default model behind one shim that has an API key. Replica 0 takes adapters at run time from one folder
(--allow-runtime-lora-updating --lora-dirs); replica 1 serves LoRA but was not started to take them, so an
adapter loaded through the shim lives on replica 0 only:

- load, use, unload through vLLM's routes with the openai SDK: /v1/models shows the adapter at once (and no
  more at once), the adapter answers otherwise than the base model, every request for it goes to replica 0
  (the engines' logs name each request's id and adapter), its prompt's blocks reach the KV events under its
  name and leave them when it is unloaded, a stream running with it while it is unloaded finishes, and the
  engine's metrics count it;
- each refusal is a 4xx naming the problem: a path outside --lora-dirs, a symlink out of them, a folder that
  is not an adapter, a file, an adapter for another base model, a rank above --max-lora-rank, no such path,
  a missing field, an unknown name to unload, no API key; and replica 1 itself refuses, naming the flag.
The adapters are written here from the default model's shapes (no model in the test process)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import grpc
import openai
import pytest
from conftest import STARTUP_TIMEOUT_S
from lora_files import write_shaped_adapter
from prometheus_client.parser import text_string_to_metric_families
from test_replicas import wait_until
from test_shim_http import post

from clients.errors import ConduitError
from common import MODEL
from launcher.stack import Stack, free_port

pytestmark = pytest.mark.model

KEY = "sk-lora-runtime-test"
MAX_RANK = 8
QUESTION = [{"role": "user", "content": "Name three colors of the rainbow, please."}]


@dataclass(frozen=True)
class Folders:
    allowed: Path  # --lora-dirs
    outside: Path


class RuntimeLoadingOnFirst(Stack):
    """Replica 0 takes adapters at run time from `lora_dirs`; replica 1 only serves LoRA (--enable-lora)."""

    def __init__(self, lora_dirs: Path, **kwargs) -> None:
        super().__init__(**kwargs)
        self.lora_dirs = lora_dirs

    def engine_command(self, index: int = 0) -> list[str]:
        # One adapter resident at a time, three loaded.
        runtime = ["--allow-runtime-lora-updating", "--lora-dirs", str(self.lora_dirs), "--max-loras", "1",
                   "--max-cpu-loras", "3"] if index == 0 else []
        return [*super().engine_command(index), *runtime]


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> Folders:
    root = tmp_path_factory.mktemp("lora-runtime")
    allowed, outside = root / "allowed", root / "outside"
    write_shaped_adapter(allowed / "sql", ("q_proj", "v_proj", "down_proj"), 8, 16.0, seed=5, magnitude=0.2)
    write_shaped_adapter(allowed / "support", ("k_proj", "o_proj", "up_proj"), 4, 8.0, seed=9, magnitude=0.3)
    write_shaped_adapter(allowed / "high-rank", ("q_proj",), MAX_RANK * 2, 16.0, seed=6, layers=1)
    write_shaped_adapter(allowed / "other-base", ("q_proj",), 4, 8.0, seed=7, layers=1,
                         linears={"q_proj": (2048, 2048)})
    (allowed / "no-weights").mkdir()
    (allowed / "no-weights" / "README.md").write_text("not an adapter")
    write_shaped_adapter(outside / "secret", ("q_proj",), 4, 8.0, seed=8, layers=1)
    (allowed / "escape").symlink_to(outside / "secret", target_is_directory=True)
    return Folders(allowed, outside)


@pytest.fixture(scope="module")
def stack(folders: Folders, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    # --deterministic: a row's answer whatever shares its step, on either replica.
    with RuntimeLoadingOnFirst(folders.allowed, replicas=2, engine_args=["--enable-lora", "--max-lora-rank",
                                                                         str(MAX_RANK), "--deterministic"],
                               shim_args=["--api-key", KEY], metrics_port=free_port(),
                               log_dir=tmp_path_factory.mktemp("logs"), startup_timeout=STARTUP_TIMEOUT_S) as running:
        yield running


@pytest.fixture(scope="module")
def sdk(stack: Stack) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=stack.base_url, api_key=KEY, max_retries=0, timeout=120) as client:
        yield client


def admin(stack: Stack, route: str, body: dict, key: str | None = KEY) -> tuple[int, str]:
    """POST to vLLM's adapter routes: status and body text."""
    status, _, answer = post(stack.shim_url, f"/v1/{route}", body,
                             {"Authorization": f"Bearer {key}"} if key else {})
    return status, answer.decode()


def answer(sdk: openai.OpenAI, model: str, request_id: str) -> tuple[str, int]:
    """The greedy answer's text and its completion tokens."""
    response = sdk.chat.completions.create(model=model, messages=QUESTION, max_tokens=8, temperature=0,
                                           extra_headers={"X-Request-Id": request_id})
    return response.choices[0].message.content, response.usage.completion_tokens


def kv_lora_names(stack: Stack, index: int) -> list[str]:
    """The adapters named by the blocks replica `index` caches now (its KV events' snapshot)."""
    with stack.client(index=index) as client, client.kv_events() as stream:
        snapshot = next(iter(stream))
    return [event.stored.lora_name for event in snapshot.events if event.WhichOneof("data") == "stored"]


def lora_samples(stack: Stack) -> dict[str, list]:
    """Replica 0's conduit:lora_* samples by name."""
    import urllib.request

    with urllib.request.urlopen(stack.metrics_url, timeout=10) as response:
        text = response.read().decode()
    found: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith("conduit:lora_"):
                found.setdefault(sample.name, []).append(sample)
    return found


def test_an_adapter_loaded_at_run_time_is_listed_used_on_its_replica_only_and_unloaded(stack: Stack,
                                                                                        sdk: openai.OpenAI,
                                                                                        folders: Folders) -> None:
    assert "sql" not in [model.id for model in sdk.models.list()]
    status, text = admin(stack, "load_lora_adapter", {"lora_name": "sql", "lora_path": str(folders.allowed / "sql")})
    assert (status, text) == (200, "Success: LoRA adapter 'sql' added successfully.")
    listed = {model.id: model for model in sdk.models.list()}  # at once: no cache delay
    assert listed["sql"].model_extra["parent"] == MODEL and listed["sql"].model_extra["root"].endswith("sql")

    ids = [f"lora-{uuid.uuid4().hex[:12]}" for _ in range(3)]
    base, _ = answer(sdk, MODEL, f"base-{uuid.uuid4().hex[:12]}")
    adapted = [answer(sdk, "sql", request_id) for request_id in ids]
    assert all(text == adapted[0][0] for text, _ in adapted) and adapted[0][0] != base
    logs = stack.replica_log(0).read_text(), stack.replica_log(1).read_text()
    for request_id in ids:  # only replica 0 serves it, and its log names the adapter
        line = next(line for line in logs[0].splitlines() if request_id in line and "generate:" in line)
        assert "LoRA adapter sql" in line and request_id not in logs[1]
    assert "sql" in kv_lora_names(stack, 0)  # its prompt's blocks, under its name

    expected = {"conduit:lora_request_success_total": 3,
                "conduit:lora_generation_tokens_total": sum(tokens for _, tokens in adapted)}

    def counts() -> dict[str, float]:  # published after the step that sent the last answer
        samples = lora_samples(stack)
        return {sample.name: sample.value for name in expected for sample in samples.get(name, [])
                if sample.labels["lora_name"] == "sql"}
    wait_until(lambda: counts() == expected, 30)
    (info,) = lora_samples(stack)["conduit:lora_requests_info"]
    assert info.labels["max_lora"] == "1" and info.value > 1e9  # a timestamp, as vLLM's
    assert {"running_lora_adapters", "waiting_lora_adapters"} <= set(info.labels)

    # Unloaded while a stream runs with it: the stream finishes; the name is gone at once.
    stream = sdk.chat.completions.create(model="sql", messages=QUESTION, max_tokens=24, temperature=0,
                                         stream=True, extra_body={"ignore_eos": True})
    chunks = iter(stream)
    first = next(chunks)
    status, text = admin(stack, "unload_lora_adapter", {"lora_name": "sql"})
    assert (status, text) == (200, "Success: LoRA adapter 'sql' removed successfully.")
    assert "sql" not in [model.id for model in sdk.models.list()]
    rest = list(chunks)
    assert [c.choices[0].finish_reason for c in [first, *rest] if c.choices and c.choices[0].finish_reason] == [
        "length"]
    with pytest.raises(openai.NotFoundError) as refused:
        answer(sdk, "sql", "after-unload")
    assert refused.value.code == "model_not_found"
    wait_until(lambda: "sql" not in kv_lora_names(stack, 0), 30)  # its blocks go once its stream is done
    assert answer(sdk, MODEL, "base-after")[0] == base


def test_adapters_beyond_max_loras_take_turns_and_each_request_gets_what_it_gets_alone(stack: Stack, sdk: openai.OpenAI,
                                                                                      folders: Folders) -> None:
    """Replica 0 keeps one adapter resident (--max-loras 1) of the loaded ones (--max-cpu-loras 3): requests over
    two adapters and the base model at once each get their answer alone; the adapters took turns in the slot."""
    for name, folder in (("sql-a", "sql"), ("support-b", "support")):
        assert admin(stack, "load_lora_adapter", {"lora_name": name, "lora_path": str(folders.allowed / folder)})[0] == 200
    models = ["sql-a", "support-b", MODEL] * 2
    alone = {model: answer(sdk, model, f"alone-{model}")[0] for model in models}
    assert len(set(alone.values())) == 3
    with ThreadPoolExecutor(len(models)) as pool:
        together = list(pool.map(lambda model: answer(sdk, model, f"together-{uuid.uuid4().hex[:8]}")[0], models))
    assert together == [alone[model] for model in models]
    assert "evicted from slot 1" in stack.replica_log(0).read_text()
    with stack.client(index=0) as replica:  # what routers read: one of them resident, the other on the host
        assert len(set(replica.load(timeout=10).resident_adapters) & {"sql-a", "support-b"}) == 1
    for name in ("sql-a", "support-b"):
        assert admin(stack, "unload_lora_adapter", {"lora_name": name})[0] == 200


REFUSALS = [  # (lora_name, lora_path under folders, status, words the message holds)
    ("out", "outside/secret", 403, "outside the folders adapters may be loaded from"),
    ("escape", "allowed/escape", 403, "a symlink to"),
    ("empty", "allowed/no-weights", 400, "is not a PEFT LoRA adapter"),
    ("file", "allowed/sql/adapter_config.json", 400, "is a file, not an adapter"),
    ("other", "allowed/other-base", 400, "an adapter for another base model"),
    ("high", "allowed/high-rank", 400, f"r=16 is above --max-lora-rank {MAX_RANK}"),
    ("none", "allowed/missing", 404, "No adapter found"),
]


def test_each_refusal_is_a_4xx_that_names_the_problem(stack: Stack, sdk: openai.OpenAI, folders: Folders) -> None:
    root = folders.allowed.parent
    for name, path, status, words in REFUSALS:
        got, text = admin(stack, "load_lora_adapter", {"lora_name": name, "lora_path": str(root / path)})
        error = json.loads(text)["error"]
        assert got == status and words in error["message"], (name, got, error)
        assert error["type"] in ("BadRequestError", "NotFoundError", "PermissionDeniedError")
    got, text = admin(stack, "load_lora_adapter", {"lora_name": "sql"})
    assert got == 400 and "Both 'lora_name' and 'lora_path' must be provided." in text
    got, text = admin(stack, "unload_lora_adapter", {"lora_name": "never-loaded"})
    assert got == 404 and "The lora adapter 'never-loaded' cannot be found." in json.loads(text)["error"]["message"]
    got, text = admin(stack, "load_lora_adapter", {"lora_name": "sql", "lora_path": str(folders.allowed / "sql")},
                      key=None)
    assert got == 401
    assert not {name for name, *_ in REFUSALS} & {model.id for model in sdk.models.list()}


def test_an_engine_not_started_to_take_adapters_at_run_time_refuses_naming_the_flag(stack: Stack,
                                                                                     folders: Folders) -> None:
    with stack.client(index=1) as replica, pytest.raises(ConduitError) as refused:
        replica.load_adapter("sql", str(folders.allowed / "sql"), timeout=30)
    assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert "--allow-runtime-lora-updating" in refused.value.message
