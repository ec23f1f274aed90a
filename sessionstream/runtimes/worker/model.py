"""The model seam: anything with `complete(prompt, signal=...)` plugs in as the run's LLM.

No network here. A real LLM client implements `Model.complete` (streaming or not) and
stops its HTTP request when `signal` is aborted — typically by racing the request task
against `signal.wait()`, which is what `RunContext.model` does around any Model anyway.
"""

from __future__ import annotations

import hashlib
from typing import Protocol, runtime_checkable

from sessionstream.runtimes.worker._signal import AbortSignal

__all__ = ["FakeModel", "Model"]


@runtime_checkable
class Model(Protocol):
    """An LLM. `signal` is aborted when the run is cancelled; stop work when it is."""

    name: str

    async def complete(self, prompt: str, *, signal: AbortSignal) -> str: ...


class FakeModel:
    """Deterministic: the answer is a digest of the prompt, after `latency_s` (abortable)."""

    def __init__(self, name: str = "fake-1", latency_s: float = 0.05) -> None:
        self.name = name
        self.latency_s = latency_s

    async def complete(self, prompt: str, *, signal: AbortSignal) -> str:
        await signal.sleep(self.latency_s)
        signal.raise_if_aborted()
        digest = hashlib.sha256(prompt.encode()).hexdigest()[:12]
        return f"answer[{digest}] to: {prompt[:80]}"
