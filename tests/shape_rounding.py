"""A test double for the CPUs whose dense kernels round a row by the shape of the call it is in.

On Intel Xeons with AMX, oneDNN's bf16 kernels (PyTorch's CPU linears and attention) block a
matrix product by its number of rows, so a row's sums are added in another order, and round
differently, when the call has more or fewer rows; on the AMD machines this suite grew on, one
blocking serves every shape and nothing shows. `rounding_by_call_shape` makes every dense call of
the engine's (PackedLinear, the low-bit linears' full copies, the prompt attention) round its
result one unit in the last place up, down or not at all, by the call's shape, so the numeric
tests can see on any CPU what those CPUs do. The native kernels (int8 matmul, decode attention)
are the engine's own and give a row the same bits whatever the call: they are left alone.
"""

from __future__ import annotations

import pytest
import torch

from engine_service.model import attention, linear


def nudged(y: torch.Tensor, shape: int) -> torch.Tensor:
    """y off by about one unit in its last place, in a direction set by `shape` (one of three)."""
    direction = shape % 3 - 1
    if direction == 0:
        return y
    return (y.float() * (1 + direction * torch.finfo(y.dtype).eps)).to(y.dtype)


def rounding_by_call_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    """From now on in this test, dense calls round by their shape (rows; queries and keys)."""
    dense, attend = linear.PackedLinear.dense, attention._attend

    def dense_by_rows(self: linear.PackedLinear, x: torch.Tensor) -> torch.Tensor:
        return nudged(dense(self, x), x.reshape(-1, x.shape[-1]).shape[0])

    def attend_by_shape(q: torch.Tensor, k: torch.Tensor, *args: object) -> torch.Tensor:
        return nudged(attend(q, k, *args), 7 * q.shape[-2] + k.shape[-2])

    monkeypatch.setattr(linear.PackedLinear, "dense", dense_by_rows)
    monkeypatch.setattr(attention, "_attend", attend_by_shape)
