"""Which actions need a person's approval: the policy the decider is given.

The settings name kinds per tenant (`SESSIONSTREAM_APPROVAL_KINDS`, e.g.
`send_email,acme:payment`, `*` a wildcard on either side); a prompt may add kinds for its
own run (`prompt.approvalKinds`, `*`: every kind). A producer can add, never remove, what
the settings require. Pure: parsed once where the settings are read, then part of the
decider's input (`DeciderConfig.approval_policy`).
"""

from __future__ import annotations

from typing import Final

from sessionstream.schemas.events import (
    ActionCompleted,
    ActionDecision,
    ActionPending,
    Event,
    RunStarted,
)

__all__ = ["WILDCARD", "needs_approval", "parse_approval_kinds", "unapproved_actions"]

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


def unapproved_actions(events: list[Event], policy: tuple[tuple[str, str], ...]) -> list[str]:
    """`run/key#seq` of each `action.completed` whose key needed a person and has no
    person's approval before it: an `action.approved` with `decidedBy`, of the same run and
    key, that decided an `action.pending` (the digest the person was shown) written before
    it. A key needed a person when the run wrote `action.pending` for it, when its
    `run.started` named its kind (`approvalKinds`), or when `policy` (the settings') names
    its kind for the run's tenant. `events`: of any runs, each run's in seq order."""
    runs: dict[str, tuple[str | None, tuple[str, ...]]] = {}
    kinds: dict[tuple[str, str], str] = {}
    asked: set[tuple[str, str]] = set()  # a pending request seen, not yet decided
    approved: dict[tuple[str, str], str] = {}  # by a person, after a pending: its digest
    digest: dict[tuple[str, str], str | None] = {}
    out: list[str] = []
    for e in events:
        if e.type == "run.started":
            runs[e.run_id] = (e.tenant_id, tuple(e.payload_as(RunStarted).approval_kinds))
        elif e.type == "action.pending":
            p = e.payload_as(ActionPending)
            k = (e.run_id, p.idempotency_key)
            kinds[k], digest[k] = p.kind, p.args_digest
            asked.add(k)
        elif e.type in ("action.approved", "action.denied"):
            d = e.payload_as(ActionDecision)
            k = (e.run_id, d.idempotency_key)
            kinds.setdefault(k, d.kind)
            if e.type == "action.approved" and d.decided_by and k in asked:
                approved[k] = str(digest.get(k))
            asked.discard(k)
        elif e.type == "action.completed":
            k = (e.run_id, e.payload_as(ActionCompleted).idempotency_key)
            kind = kinds.get(k, "")
            tenant, run_kinds = runs.get(e.run_id, (e.tenant_id, ()))
            needed = k in digest or needs_approval(policy, tenant, kind, run_kinds)
            if needed and k not in approved:
                out.append(f"{e.run_id}/{k[1]}#{e.seq}")
    return out
