"""The LoRA adapters an engine serves (`--enable-lora`, `--lora-modules`, and at run time LoadAdapter and
UnloadAdapter), by the name clients pass as `model`: each loaded once into the model runner's linears
under a slot of its own (model/lora.py), so requests of different adapters and of the base model share a
step.

The prefix cache keys a prompt's first block under the adapter's salt (block_manager.py), so keys and
values computed with one adapter never serve another, nor the base model. Each load gets a salt of its
own, so an adapter reloaded under the same name never meets its predecessor's blocks.

Loaded is not resident: up to `--max-cpu-loras` adapters are loaded (read, checked, their pairs kept on
the host), and up to `--max-loras` of them are resident, their pairs in the linears under a slot, which is
what a step can use. The scheduler makes a waiting request's adapter resident when it admits it (`resident`,
on the engine thread), evicting the least recently used resident adapter no running request holds; when
every slot is held, the request waits, as for want of KV blocks.

Unloading is immediate for clients (the name leaves the list; new requests for it are NOT_FOUND) and
gentle for the requests running with it: they finish; then, on the engine thread (`reap`), its slot's
weights and its cached blocks are dropped.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field

from engine_service.core.adapter_dirs import AdapterNotFound, allowed_folder
from engine_service.core.block_manager import BlockManager
from engine_service.core.config import LoraConfig, LoraModule
from engine_service.model.lora import AdapterError, read_adapter
from engine_service.model.runner import ModelRunner

log = logging.getLogger(__name__)

# A name clients pass as `model`, and that metrics labels join with commas (vLLM's lora_requests_info).
NAME_FORBIDDEN = frozenset(",\"'\\") | frozenset(map(chr, range(33)))
MAX_NAME_CHARS = 256


class RuntimeUpdatingOff(AdapterError):
    """LoadAdapter / UnloadAdapter on an engine not started to take them (FAILED_PRECONDITION)."""


@dataclass(eq=False)  # one per load: sets and the scheduler's checks tell two loads of one name apart
class Adapter:
    name: str
    path: str
    slot: int  # >= 1 while resident in the model runner's linears; 0: on the host only
    rank: int
    cache_salt: bytes = field(repr=False)  # the parent key of its prompts' first blocks
    pairs: dict = field(default_factory=dict, repr=False)  # linear -> (A, scale * B) on the host (runner.py)
    retiring: bool = False  # unloaded: no new requests; its weights go once its running ones end
    last_used: int = 0  # when the scheduler last admitted a request of it (a counter): least recent out


class Adapters:
    """The served adapters by name. gRPC threads load and unload; the engine thread reaps the unloaded."""

    def __init__(self, runner: ModelRunner, config: LoraConfig, base_model: str) -> None:
        self.runner = runner
        self.config = config
        self.base_model = base_model
        self._by_name: dict[str, Adapter] = {}
        self._retiring: list[Adapter] = []  # unloaded, their weights still in place
        self._lock = threading.Lock()  # the two collections above
        self._loading = threading.Lock()  # one load at a time: its name and slot stay free while it reads
        self._loads = itertools.count(1)
        self._uses = 0  # admissions of adapters' requests (engine thread): their order, for eviction

    def load(self, module: LoraModule) -> Adapter:
        """Loads the adapter at start (any path the operator gave) or at run time (after load_at_runtime's
        checks): read, checked against the model and kept on the host; resident once a request needs it.
        Raises AdapterError naming the problem."""
        with self._loading:
            self._check_name(module.name)
            if module.base_model_name and module.base_model_name != self.base_model:
                raise AdapterError(f"{module.name}: base_model_name {module.base_model_name!r} is not this engine's "
                                   f"model {self.base_model!r}")
            with self._lock:
                loaded, unloading = len(self._by_name) + len(self._retiring), len(self._retiring)
            if loaded >= self.config.loaded_limit:
                raise AdapterError(f"{self.config.loaded_limit} adapters are loaded already (--max-cpu-loras; "
                                   f"--max-loras {self.config.max_loras} resident at once)"
                                   + (f", {unloading} of them unloading" if unloading else "") + "; unload one first")
            weights = read_adapter(module.path, self.runner.linear_shapes, self.config.max_lora_rank)
            pairs = self.runner.adapter_pairs(weights)  # refuses a target the model does not run as a linear
            salt = hashlib.sha256(f"lora\0{module.name}\0{module.path}\0{next(self._loads)}".encode()).digest()
            adapter = Adapter(module.name, module.path, 0, weights.rank, salt, pairs)
            with self._lock:
                self._by_name[module.name] = adapter
        log.info("LoRA adapter %s loaded (r=%d, %d linears) from %s", module.name, weights.rank,
                 len(weights.pairs), module.path)
        return adapter

    def resident(self, adapter: Adapter, held: Iterable[Adapter]) -> bool:
        """On the engine thread, as the scheduler admits a request of `adapter`: True once its pairs are in the
        linears (placed now in a free slot, or in that of the least recently used resident adapter that no
        running request holds, `held`); False when every slot is held (the request waits)."""
        self._uses += 1
        adapter.last_used = self._uses
        if adapter.slot:
            return True
        with self._lock:
            resident = [a for a in (*self._by_name.values(), *self._retiring) if a.slot]
        used = {a.slot for a in resident}
        free = next((slot for slot in range(1, self.config.max_loras + 1) if slot not in used), 0)
        if not free:
            kept = set(held)
            victims = sorted((a for a in resident if a not in kept), key=lambda a: a.last_used)
            if not victims:
                return False
            free, victims[0].slot = victims[0].slot, 0
            self.runner.unload_adapter(free)
            log.info("LoRA adapter %s evicted from slot %d for %s (--max-loras %d)", victims[0].name, free,
                     adapter.name, self.config.max_loras)
        self.runner.place_adapter(free, adapter.pairs)
        adapter.slot = free
        return True

    def load_at_runtime(self, name: str, path: str) -> Adapter:
        """LoadAdapter: only with --allow-runtime-lora-updating, only from under --lora-dirs."""
        self._check_runtime()
        if not name or not path:
            raise AdapterError("Both 'lora_name' and 'lora_path' must be provided.")
        self._check_name(name)
        folder = allowed_folder(path, self.config.lora_dirs)
        return self.load(LoraModule(name, str(folder)))

    def unload(self, name: str) -> Adapter:
        """UnloadAdapter: out of the list and closed to new requests now; reap() drops the rest."""
        self._check_runtime()
        with self._lock:
            adapter = self._by_name.pop(name, None)
            if adapter is None:
                raise AdapterNotFound(f"The lora adapter '{name}' cannot be found.")
            adapter.retiring = True
            self._retiring.append(adapter)
        log.info("LoRA adapter %s unloading: no new requests; its weights go when its running requests end", name)
        return adapter

    @property
    def retiring(self) -> bool:
        return bool(self._retiring)

    def reap(self, in_use: Iterable[Adapter], blocks: BlockManager) -> None:
        """On the engine thread between steps: the unloaded adapters no request holds any more lose their
        weights and their cached blocks; their slots are free again."""
        held = set(in_use)
        with self._lock:
            done = [adapter for adapter in self._retiring if adapter not in held]
            self._retiring = [adapter for adapter in self._retiring if adapter in held]
        for adapter in done:
            if adapter.slot:
                self.runner.unload_adapter(adapter.slot)
                adapter.slot = 0
            dropped = blocks.drop_salted(adapter.cache_salt)
            log.info("LoRA adapter %s unloaded (%d cached blocks dropped)", adapter.name, dropped)

    def get(self, name: str) -> Adapter | None:
        return self._by_name.get(name)

    def all(self) -> list[Adapter]:
        with self._lock:
            return list(self._by_name.values())

    def _check_runtime(self) -> None:
        if not self.config.allow_runtime_updating:
            raise RuntimeUpdatingOff("loading and unloading LoRA adapters at run time is off: start the engine with "
                                     "--allow-runtime-lora-updating (or VLLM_ALLOW_RUNTIME_LORA_UPDATING=true) and "
                                     "--lora-dirs")

    def _check_name(self, name: str) -> None:
        if not name or len(name) > MAX_NAME_CHARS or NAME_FORBIDDEN.intersection(name):
            raise AdapterError(f"lora_name {name[:MAX_NAME_CHARS]!r}: give 1 to {MAX_NAME_CHARS} characters without "
                               "spaces, control characters, commas, quotes or backslashes")
        if name == self.base_model or name in self._by_name:
            raise AdapterError(f"The lora adapter '{name}' has already been loaded."
                               if name in self._by_name else f"lora_name {name!r} is the base model's name")
