"""The CPU as the engine's numerics see it, and the one place that decides whether oneDNN may use AMX.

oneDNN (behind PyTorch's CPU linears and attention) uses AMX on the Intel Xeons that have it, and its
AMX kernels block a matrix product by its number of rows: a row rounds differently in a call with
more or fewer rows. Prompts compute alike cached or not whatever the kernels, since each prompt
segment is a call of its own (model/step.py). But `--deterministic` also promises a decode row the
same bits alone and in any batch, and a step's decode rows are one call: so with it, oneDNN is kept
off AMX (its ONEDNN_MAX_CPU_ISA, read once, at its first call), unless the operator set that
variable. Without --deterministic, AMX stays on where the CPU has it: it is where prompts are fast.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping
from pathlib import Path

ISA_VARIABLE = "ONEDNN_MAX_CPU_ISA"
# oneDNN's newest ISA below AMX whose bf16 kernels give a row the same bits for any number of rows
# (two or more): AVX-512 with bf16 dot products, as on the AMD EPYC machines the tests grew on.
WITHOUT_AMX = "AVX512_CORE_BF16"
AMX_FLAG = "amx_bf16"


def cpu_facts(cpuinfo: Path = Path("/proc/cpuinfo")) -> tuple[str, set[str]]:
    """(model name, feature flags) of the first CPU; ("unknown", set()) where Linux does not say."""
    try:
        lines = cpuinfo.read_text().splitlines()
    except OSError:
        return "unknown", set()
    fields = dict(line.split(":", 1) for line in lines if ":" in line)  # the last CPU's; all alike
    fields = {key.strip(): value.strip() for key, value in fields.items()}
    return fields.get("model name", "unknown"), set(fields.get("flags", "").split())


def keep_onednn_off_amx(deterministic: bool, flags: set[str],
                        environ: MutableMapping[str, str] = os.environ) -> bool:
    """Before torch's first oneDNN call: with --deterministic on a CPU with AMX, cap oneDNN below it
    (the operator's own ONEDNN_MAX_CPU_ISA wins). Whether it capped."""
    if not deterministic or AMX_FLAG not in flags or ISA_VARIABLE in environ:
        return False
    environ[ISA_VARIABLE] = WITHOUT_AMX
    return True


def describe(flags: set[str], environ: MutableMapping[str, str] = os.environ) -> dict[str, str]:
    """What the start line and /metrics say of the CPU: ATen's kernels, and whether oneDNN uses AMX."""
    import torch

    limit = environ.get(ISA_VARIABLE, "")
    if AMX_FLAG not in flags:
        amx = "absent"
    elif limit and "AMX" not in limit.upper() and limit.upper() not in ("ALL", "DEFAULT"):
        amx = f"off ({ISA_VARIABLE}={limit})"
    else:
        amx = "on"
    return {"aten": torch.backends.cpu.get_cpu_capability(), "amx": amx,
            "avx512_bf16": "yes" if "avx512_bf16" in flags else "no"}
