"""Fixtures for the end-to-end tests: the real engine (default model) and shim on free loopback ports."""

from __future__ import annotations

import ast
import asyncio
import atexit
import contextlib
import gc
import io
import json
import os
import re
import shutil
import sys
import tempfile
import tokenize
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from _pytest.mark.expression import Expression  # `-m`'s own parser (pytest_ignore_collect)

from conduit_common.memory import release_freed_memory

# The fixtures import what they start: the controller process, which runs no test, then starts the
# workers ~1 s sooner (the openai SDK alone takes 0.8 s to import).
if TYPE_CHECKING:
    import openai

    from clients import AsyncEngineClient, EngineClient
    from launcher.stack import Stack
    from fake_engine import FakeEngineServer

# Bytecode, even where the environment says not to write it (PYTHONDONTWRITEBYTECODE, common in
# containers and set on our CI machines): this process, the xdist workers and the engines and shims the
# tests start, which inherit the environment. Without it every process compiled the project from
# source and pytest re-did its assertion rewriting of the plugins it loads (schemathesis, hypothesis,
# anyio: ~300 modules, 3.8 s a process). The files land in __pycache__ folders, which git ignores;
# this process wrote none for what it imported before this line, which later runs then read.
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

# Headless chromium on a machine without a network: without the background-networking flags it
# keeps trying to reach Google's services.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
# Below pytest's own timeout (300 s), so a stack that never comes up fails with its logs.
STARTUP_TIMEOUT_S = 180
# The KV cache of every engine the tests start (through CONDUIT_KV_CACHE_GB, which the launcher
# passes on; a test's own flag wins). The default 2 GB is filled with zeros at start, so each engine
# held ~3 GB, and a suite with a few stacks up at once needed more memory than a laptop has; 0.25 GB
# is ~11k tokens of the default model, more than any test keeps in flight.
TEST_KV_CACHE_GB = 0.25
os.environ.setdefault("CONDUIT_KV_CACHE_GB", str(TEST_KV_CACHE_GB))
# Torch threads of every engine the tests start (CONDUIT_THREADS, as the KV cache above). In a test
# the engine shares the cores with the shim and the client it answers (and other engines): with a
# thread per core, each of a step's small ops (masks, sampling) waits at an OpenMP barrier for a
# thread the OS has descheduled. On 2 busy cores a forced tool call's masking took ~125 ms a token
# with 2 threads and 0.6 ms with 1, and tests/test_stack_messages.py ran in 24.6 s against 119.5 s.
# Thread-count invariance is tested where it is the point (test_lean_llama.py, test_native_kernels.py).
TEST_ENGINE_THREADS = 1
os.environ.setdefault("CONDUIT_THREADS", str(TEST_ENGINE_THREADS))
# The Responses API's store of every shim the tests start (in-process or not), out of the home folder.
os.environ.setdefault("CONDUIT_RESPONSES_STORE_DIR", tempfile.mkdtemp(prefix="conduit-responses-"))

# The session stacks, each started once by whichever test first asks for it. Under pytest-xdist
# (the suite runs on 2 or 3 workers, pyproject.toml) a session fixture is per worker, so the modules that
# use one of these all go to one worker (ModuleGroups below): each stack starts once (an engine's
# memory each), and every other module goes whole to one worker (its own engine or shim starts once).
SESSION_STACKS = ("stack", "single_slot_stack")
SESSION_STACKS_GROUP = "the modules on the session stacks"
# The modules marked `in_process_engine` run engine code in the test process (torch, and transformers
# once they build a model: ~2.5 s to import); they also go to one worker, so the other imports neither.
IN_PROCESS_GROUP = "the modules running engine code in the test process"
# Where the workers, which collect the tests, leave each module's group for the controller, which
# schedules them but sees only test ids (set by the controller before it starts the workers).
GROUPS_FILE_ENV = "CONDUIT_TEST_GROUPS_FILE"


def _module(item_or_id: pytest.Item | str) -> str:
    return (item_or_id if isinstance(item_or_id, str) else item_or_id.nodeid).split("::")[0]


@pytest.hookimpl(wrapper=True)  # around every other plugin's: before `-m` deselects
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> Iterator[None]:
    """The fast tier is `-m "not model"`: it leaves out the slow tests (marked `slow`, or driving a
    browser) too, which `make test` runs with the rest. On an xdist worker, also writes each
    module's group (see ModuleGroups)."""
    _give_each_item_its_own_id(items)
    stacks_by_module: dict[str, set[str]] = {}
    in_process: set[str] = set()
    for item in items:
        if item.get_closest_marker("slow") or "browser" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.model)
        stacks_by_module.setdefault(_module(item), set()).update(_session_stacks_used(item))
        if item.get_closest_marker("in_process_engine"):
            in_process.add(_module(item))
    groups = {module: SESSION_STACKS_GROUP if stacks else IN_PROCESS_GROUP if module in in_process else module
              for module, stacks in stacks_by_module.items()}
    groups_file = os.environ.get(GROUPS_FILE_ENV)
    if groups_file and hasattr(config, "workerinput"):
        partial = f"{groups_file}.{config.workerinput['workerid']}"
        Path(partial).write_text(json.dumps(groups))
        os.replace(partial, groups_file)  # the workers write the same: whole, any one
    yield
    # The order the workers take the selected units (a group, or a module) in: the session stacks'
    # (the longest), then the others that run a model (in file order: a few tests can take long
    # there), then the rest longest first, by their tests' seconds in the last run (DURATIONS_KEY),
    # the short ones evening out the workers at the end. By their number of tests alone, one-test
    # modules of 3 to 5 s (a frozen engine, a killed one) came last and held one worker alone.
    def unit(item: pytest.Item) -> str:
        return groups[_module(item)]

    last_run = getattr(config, "workerinput", {}).get(DURATIONS_KEY, {})
    with_model = Counter(unit(item) for item in items if item.get_closest_marker("model"))
    seconds: Counter[str] = Counter()
    for item in items:
        seconds[unit(item)] += last_run.get(item.nodeid, UNKNOWN_TEST_S)
    items.sort(key=lambda item: (unit(item) != SESSION_STACKS_GROUP, not with_model[unit(item)],
                                 0 if with_model[unit(item)] else -seconds[unit(item)]))


# Each test's seconds (setup to teardown) in the last run that ran it, in pytest's cache: the
# controller reads them at start and hands them to the workers, which order the units by them,
# and keeps this run's at the end. A test never run counts as UNKNOWN_TEST_S (all of them: the order
# by number of tests).
DURATIONS_KEY = "conduit/test_seconds"
UNKNOWN_TEST_S = 0.1
_this_run_seconds: Counter[str] = Counter()


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    cache = getattr(node.config, "cache", None)
    node.workerinput[DURATIONS_KEY] = cache.get(DURATIONS_KEY, {}) if cache is not None else {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _this_run_seconds[report.nodeid] += report.duration  # the controller's, and the workers' own (unused)


def pytest_sessionfinish(session: pytest.Session) -> None:
    cache = getattr(session.config, "cache", None)
    if cache is None or hasattr(session.config, "workerinput") or not _this_run_seconds:
        return
    kept = cache.get(DURATIONS_KEY, {})
    kept.update({nodeid: round(seconds, 3) for nodeid, seconds in _this_run_seconds.items()})
    cache.set(DURATIONS_KEY, kept)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """A module that `-m` would deselect whole (by its module-level `pytestmark`) is not imported:
    the fast tier imported the model tests' SDKs and the fuzzer only to deselect them (~3 s a worker)."""
    if not config.option.markexpr or not collection_path.name.startswith("test_") or collection_path.suffix != ".py":
        return None
    marks = _module_marks(collection_path)
    if "slow" in marks:
        marks.add("model")  # as pytest_collection_modifyitems does
    if marks and not Expression.compile(config.option.markexpr).evaluate(lambda name, **_: name in marks):
        return True
    return None


def _module_marks(path: Path) -> set[str]:
    """The names of the marks in a module's top-level `pytestmark = pytest.mark.X` (or a list of them).
    Only that statement is parsed: the whole modules took each worker ~0.25 s of CPU."""
    source = path.read_text()
    found = re.search(r"^pytestmark\s*=", source, re.MULTILINE)
    if found is None:
        return set()
    rest = source[found.start():]
    end_row = next(token.end[0] for token in tokenize.generate_tokens(io.StringIO(rest).readline)
                   if token.type == tokenize.NEWLINE)  # the statement's end, past its brackets
    value = ast.parse("\n".join(rest.splitlines()[:end_row])).body[0].value
    return {n.attr for n in ast.walk(value) if isinstance(n, ast.Attribute)
            and isinstance(n.value, ast.Attribute) and n.value.attr == "mark"}


def _session_stacks_used(item: pytest.Item) -> set[str]:
    """The session stacks `item` uses (a module's own fixture of the same name is not one)."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return set()
    return {name for name in SESSION_STACKS
            if name in info.name2fixturedefs and info.name2fixturedefs[name][-1].scope == "session"}


def _give_each_item_its_own_id(items: list[pytest.Item]) -> None:
    """schemathesis's items (one per API operation, tests/test_*_fuzz.py) carry the operation in their
    name but not in their id under pytest 9, so all of a test's operations shared one id, and xdist,
    which schedules by id, ran one of them. Each gets its name's parameters in its id too."""
    for item in items:
        if item.name.endswith("]") and "[" in item.name and item._id.params is None:
            item._id = item._id.with_params(item.name[item.name.index("[") + 1:-1])


# Whether a test of the module running now was marked `model` (pytest_runtest_teardown).
_RAN_A_MODEL = pytest.StashKey[bool]()


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """After a module that ran a model: hand back to the OS what its in-process models freed (a
    worker held ~2 GB). Only then: a full collection over a worker's heap (torch, transformers, the
    SDKs) takes ~0.4 s, which after every module was a third of the fast tier's test time."""
    if item.get_closest_marker("model"):
        item.session.stash[_RAN_A_MODEL] = True
    if (nextitem is None or _module(nextitem) != _module(item)) and item.session.stash.get(_RAN_A_MODEL, False):
        gc.collect()
        release_freed_memory()
        item.session.stash[_RAN_A_MODEL] = False


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput") and config.pluginmanager.hasplugin("xdist") \
            and config.getoption("numprocesses", None):
        os.environ[GROUPS_FILE_ENV] = os.path.join(tempfile.mkdtemp(prefix="conduit-test-groups-"), "groups.json")
    if hasattr(config, "workerinput"):
        atexit.register(_exit_now)  # early, so it runs after the exit handlers of what the tests import


def _exit_now() -> None:
    """A worker's last exit handler: it has reported every result, and its tests stopped every process
    they started; what is left is the interpreter's teardown of a heap holding torch, transformers and
    the SDKs, which took ~3 s that the controller, and so the whole run, waited for."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """The workers of `-n auto` (pyproject.toml): 4 for a run without the model tests (the fast tier),
    else 2. The fast tier's tests mostly wait (on shims and fakes starting, timeouts, streams paced by
    the fake), so two workers left the cores idle half the time: on the loaded 2-core machine a third
    took the fast tier from 114 s to 86 s; on a quiet one a fourth from 28.0-33.0 s to 25.5-30.9 s
    (three runs each). The model tests keep two: each worker's engines hold their models in memory."""
    model_only = lambda name, **_: name == "model"  # noqa: E731
    if config.option.markexpr and not Expression.compile(config.option.markexpr).evaluate(model_only):
        return 4
    return 2


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """xdist's module-scope scheduling, with the modules on the session stacks as one unit, and the
    units in collection order (pytest_collection_modifyitems's), not by their number of tests. Its
    own `loadgroup` would group with markers, but it marks test ids in a way pytest 9 no longer reads."""
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False

    class ModuleGroups(LoadScopeScheduling):
        groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.groups is None:  # the workers have collected (and so written it) before any scheduling
                self.groups = json.loads(Path(os.environ[GROUPS_FILE_ENV]).read_text())
            return self.groups.get(_module(nodeid), _module(nodeid))

    return ModuleGroups(config, log)


@pytest.fixture(scope="session", autouse=True)
def forked_stack_processes() -> Iterator[None]:
    """The stacks the tests start (launcher.stack.Stack) fork their engines and shims from processes
    that imported them already (forked.py): an engine's start took ~7 s, ~4 s of it importing torch
    and transformers, and the suite starts ~20."""
    import launcher.stack
    import forked

    launcher.stack.spawn = forked.spawn
    yield
    launcher.stack.spawn = forked.launch_spawn


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeEngineServer]:
    """A scripted fake engine (tests/fake_engine.py) on loopback, for shim tests that need no model."""
    from fake_engine import FakeEngineServer

    server = FakeEngineServer().start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def embedder() -> Iterator[FakeEngineServer]:
    """A fake engine serving an embedding model (fake_engine.EMBEDDER_ID: vectors from bags of words)."""
    from fake_engine import EMBEDDER_ID, FakeEngineServer

    server = FakeEngineServer(model_id=EMBEDDER_ID).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def stack() -> Iterator[Stack]:
    """The default stack; its `base_url` is for the openai SDK, `engine_address` for gRPC, and
    `metrics_url` shows what the engine is doing. Its engine holds the tokenization of a text with
    faults.HOLD_MARKER until a test releases it (in the folder `engine_env[TOKENIZE_HOLD_ENV]`)."""
    from launcher.stack import Stack, free_port
    from engine_service.core.faults import TOKENIZE_HOLD_ENV

    with Stack(metrics_port=free_port(), engine_env={TOKENIZE_HOLD_ENV: tempfile.mkdtemp(prefix="conduit-hold-")},
               startup_timeout=STARTUP_TIMEOUT_S) as running:
        yield running


@pytest.fixture(scope="session")
def single_slot_stack() -> Iterator[Stack]:
    """An engine that runs one sequence at a time with two waiting: a leaked generation blocks the
    next request, and a fourth concurrent request finds the queue full. Its shim writes a heartbeat
    after a second of silence (not 5): a queued stream's response starts, and a departed client is
    noticed, a heartbeat after the request."""
    from launcher.stack import Stack

    with Stack(engine_args=["--max-batch-size", "1", "--max-queue", "2"], shim_args=["--heartbeat-interval", "1"],
               startup_timeout=STARTUP_TIMEOUT_S) as running:
        yield running


@contextlib.contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """torch on `count` threads inside the block (a test of thread invariance computes its reference
    on two: the tests in this process run on one, below)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """For a test running a model in the test process: torch on one thread. Beside the other worker and
    the engines the tests start, torch's thread pool waits on preempted threads (the default model's
    comparison in test_lean_llama.py took 9 to 24 s on two threads, 8.5 s on one)."""
    with torch_threads(1):
        yield


@pytest.fixture(autouse=True)
def in_process_engine_on_one_thread(request: pytest.FixtureRequest) -> Iterator[None]:
    """Every test marked `in_process_engine` on one torch thread, as one_torch_thread. Their ops are
    small, each a barrier of the thread pool: on the 2 cores shared with others (load ~11),
    test_lean_llama.py took 9.9 s on two threads and 0.9 s on one, test_native_kernels.py 31 s and 3.7 s."""
    if request.node.get_closest_marker("in_process_engine") is None:
        yield
        return
    with torch_threads(1):
        yield


@pytest.fixture(scope="module")
def browser():
    """Headless Debian chromium under Playwright (which never downloads a browser here)."""
    from playwright.sync_api import sync_playwright

    executable = shutil.which("chromium") or "/usr/bin/chromium"
    if not Path(executable).exists():
        pytest.fail("chromium is not installed: run `make test` (it installs Debian's chromium package)")
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        yield launched
        launched.close()


@pytest.fixture(scope="session")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    """One event loop for every async test, so async clients can be shared across tests."""
    event_loop = asyncio.new_event_loop()
    yield event_loop
    event_loop.close()


@pytest.fixture(scope="session")
def openai_client(stack: Stack) -> Iterator[openai.OpenAI]:
    # No retries: a 429 or 5xx must show up in the test, not be hidden by the SDK.
    import openai

    with openai.OpenAI(base_url=stack.base_url, api_key="unused", max_retries=0, timeout=120) as client:
        yield client


@pytest.fixture(scope="session")
def async_openai_client(stack: Stack, loop: asyncio.AbstractEventLoop) -> Iterator[openai.AsyncOpenAI]:
    import openai

    client = openai.AsyncOpenAI(base_url=stack.base_url, api_key="unused", max_retries=0, timeout=120)
    yield client
    loop.run_until_complete(client.close())


@pytest.fixture(scope="session")
def engine_client(stack: Stack) -> Iterator[EngineClient]:
    from clients import EngineClient

    with EngineClient(stack.engine_address, timeout=120) as client:
        yield client


@pytest.fixture(scope="session")
def async_engine_client(stack: Stack, loop: asyncio.AbstractEventLoop) -> Iterator[AsyncEngineClient]:
    from clients import AsyncEngineClient

    async def connect() -> AsyncEngineClient:  # grpc.aio binds a channel to the loop it is made in
        return AsyncEngineClient(stack.engine_address, timeout=120)

    client = loop.run_until_complete(connect())
    yield client
    loop.run_until_complete(client.close())
