"""Which event types a subscription wants: exact types (``run.finished``), a dotted prefix
and everything below it (``run.*``, ``model.request.*``), or everything (``*``)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from sessionstream.schemas.events import EVENT_TYPES

__all__ = ["MAX_PATTERNS", "check_patterns", "matches"]

#: patterns one subscription may hold
MAX_PATTERNS: Final = 50


def _prefixes() -> frozenset[str]:
    out = set()
    for t in EVENT_TYPES:
        parts = t.split(".")
        out |= {".".join(parts[:i]) for i in range(1, len(parts))}
    return frozenset(out)


_PREFIXES: Final = _prefixes()


def check_patterns(patterns: Iterable[str]) -> list[str]:
    """The patterns, stripped, without repeats, in their order; ValueError naming the first
    that names no event type (a typo would otherwise match nothing, silently)."""
    out: list[str] = []
    for raw in patterns:
        p = raw.strip()
        if p in out:
            continue
        known = p == "*" or p in EVENT_TYPES or (p.endswith(".*") and p[:-2] in _PREFIXES)
        if known:
            out.append(p)
        else:
            prefixes = ", ".join(sorted(f"{x}.*" for x in _PREFIXES if "." not in x))
            raise ValueError(
                f"event type {p!r} is none of the protocol's (docs/protocol.md#events): "
                f"write a type such as run.finished, a prefix such as {prefixes}, or *"
            )
    if not out:
        raise ValueError("a webhook needs at least one event type (* for all)")
    if len(out) > MAX_PATTERNS:
        raise ValueError(f"a webhook holds at most {MAX_PATTERNS} event types")
    return out


def matches(patterns: Iterable[str], event_type: str) -> bool:
    """`event_type` is one the patterns want."""
    for p in patterns:
        if p == "*" or p == event_type:
            return True
        if p.endswith(".*") and event_type.startswith(p[:-1]):
            return True
    return False
