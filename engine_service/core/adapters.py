"""The LoRA adapters an engine serves (`--enable-lora`, `--lora-modules`), by the name clients pass as
`model`: each loaded once into the model runner's linears under a slot of its own (model/lora.py), so
requests of different adapters and of the base model share a step.

The prefix cache keys a prompt's first block under the adapter's salt (block_manager.py), so keys and
values computed with one adapter never serve another, nor the base model.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field

from engine_service.core.config import LoraConfig, LoraModule
from engine_service.model.lora import AdapterError, read_adapter
from engine_service.model.runner import ModelRunner

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Adapter:
    name: str
    path: str
    slot: int  # >= 1 in the model runner's linears
    rank: int
    cache_salt: bytes = field(repr=False)  # the parent key of its prompts' first blocks


class Adapters:
    """The served adapters by name (engine thread and gRPC threads read it; loading is at start)."""

    def __init__(self, runner: ModelRunner, config: LoraConfig, base_model: str) -> None:
        self.runner = runner
        self.config = config
        self.base_model = base_model
        self._by_name: dict[str, Adapter] = {}

    def load(self, module: LoraModule) -> Adapter:
        if module.name == self.base_model or module.name in self._by_name:
            raise AdapterError(f"the adapter name {module.name!r} is already served")
        if module.base_model_name and module.base_model_name != self.base_model:
            raise AdapterError(f"{module.name}: base_model_name {module.base_model_name!r} is not this engine's "
                               f"model {self.base_model!r}")
        if len(self._by_name) >= self.config.max_loras:
            raise AdapterError(f"--max-loras {self.config.max_loras} adapters are loaded already")
        weights = read_adapter(module.path, self.runner.linear_shapes, self.config.max_lora_rank)
        slot = 1 + max((adapter.slot for adapter in self._by_name.values()), default=0)
        self.runner.load_adapter(slot, weights)
        salt = hashlib.sha256(f"lora\0{module.name}\0{module.path}".encode()).digest()
        adapter = Adapter(module.name, module.path, slot, weights.rank, salt)
        self._by_name[module.name] = adapter
        log.info("LoRA adapter %s (r=%d, %d linears) from %s", module.name, weights.rank,
                 len(weights.pairs), module.path)
        return adapter

    def get(self, name: str) -> Adapter | None:
        return self._by_name.get(name)

    def all(self) -> list[Adapter]:
        return list(self._by_name.values())
