"""Every numeric engine setting has bounds (engine_service/core/config.py's BOUNDS): a value out of them
stops the engine at start with a usage error naming the flag (exit 2), before the model loads. Before,
`--max-step-tokens 0` left every request waiting forever and `--block-size 0` died dividing by zero."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from launcher.stack import REPO_ROOT
from conduit_common.lifetime import child_env
from engine_service.__main__ import build_parser, parse_args
from engine_service.core.config import BOUNDS, EngineConfig


def numeric_flags() -> dict[str, argparse.Action]:
    """The engine's flags that take a number, by flag."""
    return {action.option_strings[0]: action for action in build_parser()._actions
            if action.option_strings and action.type is not None and action.type.__name__ in ("int", "float")}


def test_every_numeric_flag_checks_bounds() -> None:
    flags = numeric_flags()
    assert {"--max-step-tokens", "--block-size", "--max-batch-size", "--max-queue", "--kv-cache-gb",
            "--kv-cache-tokens", "--max-model-len", "--threads", "--drain-seconds", "--port",
            "--metrics-port"} <= set(flags)
    for flag, action in flags.items():
        with pytest.raises(argparse.ArgumentTypeError):
            action.type("-1")
        with pytest.raises(argparse.ArgumentTypeError):
            action.type("99999999999")
        if action.type.__name__ == "float":
            with pytest.raises(argparse.ArgumentTypeError):
                action.type("nan")
        parse_args([flag, str(action.default)])  # the defaults are within bounds


def test_the_config_checks_the_same_bounds() -> None:
    for setting, bounds in BOUNDS.items():
        if setting in EngineConfig.__dataclass_fields__:
            with pytest.raises(ValueError, match=setting):
                EngineConfig(**{setting: type(bounds.high)(bounds.high * 2)})
    EngineConfig(max_batch_size=8, max_step_tokens=8)
    with pytest.raises(ValueError, match="max_step_tokens"):
        EngineConfig(max_batch_size=8, max_step_tokens=7)


@pytest.mark.parametrize("argv, env, message", [
    (["--max-step-tokens", "0"], {}, "argument --max-step-tokens: must be from 1 to"),
    (["--block-size", "0"], {}, "argument --block-size: must be from 1 to"),
    ([], {"CONDUIT_MAX_BATCH_SIZE": "0"}, "CONDUIT_MAX_BATCH_SIZE: must be from 1 to"),
    (["--max-batch-size", "64", "--max-step-tokens", "32"], {}, "must be at least max_batch_size"),
    # A missing model path is not taken for a hub id (a hub traceback once torch and transformers loaded).
    (["--model", "/no/such/model"], {}, "--model /no/such/model: no such file or folder"),
    (["--model", "missing.gguf"], {}, "--model missing.gguf: no such file or folder"),
])
def test_the_engine_refuses_to_start_with_a_setting_out_of_bounds(argv, env, message) -> None:
    done = subprocess.run([sys.executable, "-m", "engine_service", "--port", "0", *argv], cwd=REPO_ROOT,
                          env={**child_env(), **env}, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and message in done.stderr, done.stderr


@pytest.mark.parametrize("argv, compiled_step", [
    ([], "auto"), (["--compiled-step", "on"], "on"), (["--enforce-eager"], "off"),
    (["--compiled-step", "on", "--enforce-eager"], "off"),  # vLLM's flag wins: eager is what it asks for
])
def test_the_compiled_step_flags(argv: list[str], compiled_step: str) -> None:
    assert parse_args(argv).config.compiled_step == compiled_step


def test_an_unknown_compiled_step_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="compiled_step must be one of auto, on, off"):
        EngineConfig(compiled_step="maybe")
