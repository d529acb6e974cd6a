"""What the route modules of every API share, built once by app.py and passed to each `register_*`."""

from __future__ import annotations

from dataclasses import dataclass

from .drain import Drain
from .limits import RequestLimits
from .metrics import ShimMetrics
from .models import ServedModels
from .relay import Relay


@dataclass(frozen=True)
class ShimContext:
    relay: Relay
    models: ServedModels
    drain: Drain
    metrics: ShimMetrics
    limits: RequestLimits
    request_timeout_s: float | None  # each engine call's deadline; None: as long as the engine works
    started: int  # the shim's start (Unix seconds): the `created` of models that name none
