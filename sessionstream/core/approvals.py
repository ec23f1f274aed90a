"""Which actions need a person's approval: the policy the decider is given.

The settings name kinds per tenant (`SESSIONSTREAM_APPROVAL_KINDS`, e.g.
`send_email,acme:payment`, `*` a wildcard on either side); a prompt may add kinds for its
own run (`prompt.approvalKinds`, `*`: every kind). A producer can add, never remove, what
the settings require. Pure: parsed once where the settings are read, then part of the
decider's input (`DeciderConfig.approval_policy`).
"""

from __future__ import annotations

from typing import Final

__all__ = ["WILDCARD", "needs_approval", "parse_approval_kinds"]

#: any tenant, or any kind
WILDCARD: Final = "*"


def parse_approval_kinds(text: str) -> tuple[tuple[str, str], ...]:
    """`kind` (any tenant) or `tenant:kind` entries, comma-separated, as (tenant, kind)
    pairs; blanks around entries are ignored. Raises ValueError for an empty side."""
    out: list[tuple[str, str]] = []
    for raw in text.split(","):
        entry = raw.strip()
        if not entry:
            continue
        tenant, sep, kind = entry.partition(":")
        if not sep:
            tenant, kind = WILDCARD, entry
        tenant, kind = tenant.strip(), kind.strip()
        if not tenant or not kind:
            raise ValueError(f"approval kind {entry!r}: expected `kind` or `tenant:kind`")
        if (tenant, kind) not in out:
            out.append((tenant, kind))
    return tuple(out)


def needs_approval(
    policy: tuple[tuple[str, str], ...],
    tenant: str | None,
    kind: str,
    run_kinds: tuple[str, ...] | list[str],
) -> bool:
    """Whether an action of `kind` in a run of `tenant` waits for a person: the settings'
    policy says so for the tenant, or the run's prompt named the kind (or `*`)."""
    for k in run_kinds:
        if k in (WILDCARD, kind):
            return True
    return any(t in (WILDCARD, tenant) and k in (WILDCARD, kind) for t, k in policy)
