"""KV_MEMORY_MB on the Generator path (a vision model, DECODE_BATCH_ROWS=1, prompt-lookup drafts,
a family the batched decoder cannot drive).

A Generator allocates the KV of its whole capacity (prompt and max_tokens) when it is made, and
four of them at once can hold more than the container has: four photo chats on Phi-3.5-vision
are about 9 GiB of fp32 KV beside a 4.5 GB model on an 8 GB plan. So each generator made for one
reply and not kept by the conversation cache reserves its bytes against the bound when it
starts; the cache's generators are bounded by its own budget (PROMPT_CACHE_MB), which the bound
sets aside. A reply that does not fit beside the running ones waits in the worker
(kv.tiers.NoRoom, as on the batched path) until one ends; one alone always runs, the context
capped to what the bound holds.

On a device (cuda, dml) the KV lives in the device's memory, which the container's limit says
nothing of: there the bound holds only where KV_MEMORY_MB is set.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from sidecar.model.kv.tiers import Memory, NoRoom
from sidecar.model.memory import chosen_kv_bound

log = logging.getLogger("sidecar.model.generator_memory")  # the name its log lines always had


@dataclass
class GeneratorMemory:
    """The bound and the running generators' reservations; unbounded until `size`."""

    device: str = "cpu"  # MODEL_DEVICE
    memory: Memory = field(default_factory=lambda: Memory(0))

    @property
    def bounded(self) -> bool:
        return self.memory.bound_bytes > 0

    def size(
        self, wanted_bytes: int, bytes_per_token: int, cache_budget: int, max_length: int
    ) -> int:
        """Set the bound once the model is loaded (KV_MEMORY_MB, else from the memory limit
        on the CPU); the context capped to what it holds. Returns that context."""
        if not wanted_bytes and self.device != "cpu":
            log.info(
                "kv memory", extra={"fields": {"kv_memory_bytes": None, "device": self.device}}
            )
            return max_length
        bound, fields = chosen_kv_bound(wanted_bytes)
        self.memory.bound_bytes = bound
        self.memory.set_aside = min(cache_budget, bound)
        capped = max(1, min(max_length, bound // max(bytes_per_token, 1)))
        fields |= {
            "context_tokens": capped,
            "path": "generator",
            "cache_budget_bytes": cache_budget,
        }
        log.info("kv memory", extra={"fields": fields})
        return capped

    def reserve(self, nbytes: int) -> int:
        """Reserve a new generator's KV (NoRoom: it must wait for a running reply to end);
        returns what was reserved, to `release` when the reply is over."""
        memory = self.memory
        if not self.bounded:
            return 0
        if not memory.fits(nbytes):
            memory.waits += 1
            raise NoRoom(f"{nbytes} bytes of KV do not fit beside the running replies")
        memory.reserved_bytes += nbytes
        return nbytes

    def release(self, nbytes: int) -> None:
        self.memory.reserved_bytes -= nbytes
