"""The action gate: requests, approvals by a person, denials, results."""

from __future__ import annotations

from sessionstream.core.approvals import needs_approval
from sessionstream.core.decider._base import _DIGEST_MISMATCH, _LEASE_LOST, _TOO_MANY_ACTIONS
from sessionstream.core.decider._emit import _Emitter
from sessionstream.core.state import (
    ActionRecord,
    RunState,
)
from sessionstream.schemas._base import make
from sessionstream.schemas.commands import (
    ActionApprovePayload,
    ActionDenyPayload,
    ActionRequestPayload,
    ActionResultPayload,
    Command,
)
from sessionstream.schemas.events import (
    ActionCompleted,
    ActionDecision,
    ActionDecisionReplayed,
    ActionPending,
)


def _action_request(em: _Emitter, cmd: Command, run: RunState) -> None:
    p = cmd.payload_as(ActionRequestPayload)
    key = p.idempotency_key
    first = run.actions.get(key)
    if (
        first is not None
        and run.status == "cancelling"
        and first.decision == "approved"
        and (not first.completed)
    ):
        # a worker retrying an approved action it has not finished (it crashed, or lost the
        # result) must not act once the run is being cancelled: the email that arrives
        # minutes after the user pressed stop is what the gate exists to prevent
        _deny(em, key, first.kind, "cancelling", "approved before the cancel; not retried")
    elif first is not None and first.needed_approval and p.args_digest != first.args_digest:
        # a person approved (or is asked to approve) these arguments, not others
        _deny(
            em,
            key,
            first.kind,
            _DIGEST_MISMATCH,
            f"argsDigest {p.args_digest!r} is not the key's {first.args_digest!r}",
        )
    elif first is not None and first.decision == "denied" and first.reason == _LEASE_LOST:
        _ask_again(em, run, key, first, p.detail)
    elif first is not None:
        em.on_run(
            "action.decision_replayed",
            make(
                ActionDecisionReplayed,
                idempotency_key=key,
                kind=first.kind,
                decision=first.decision,
            ),
        )
    elif len(run.actions) >= em.config.max_actions:
        _deny(
            em,
            key,
            p.kind,
            _TOO_MANY_ACTIONS,
            f"the run has asked for {len(run.actions)} keys (maxActions)",
        )
    elif run.status == "running":
        cfg = em.config
        if needs_approval(cfg.approval_policy, em.state.tenant_id, p.kind, run.approval_kinds):
            _pending(em, key, p.kind, p.args_digest, p.detail, em.now + cfg.approval_ttl_ms)
        else:
            em.on_run(
                "action.approved",
                make(ActionDecision, idempotency_key=key, kind=p.kind, detail=p.detail),
            )
    else:
        _deny(em, key, p.kind, run.status, p.detail)


def _ask_again(
    em: _Emitter, run: RunState, key: str, first: ActionRecord, detail: str | None
) -> None:
    """The next holder asks for a key its predecessor was waiting on when it lost the
    lease: pending again, for the new generation, within the same window (a takeover never
    extends a person's time)."""
    expires_at = first.expires_at or 0
    if run.status != "running":
        _deny(em, key, first.kind, run.status, detail)
    elif em.now >= expires_at:
        _deny(em, key, first.kind, "approval_expired", f"no decision by {expires_at}")
    else:
        _pending(em, key, first.kind, first.args_digest, detail, expires_at)


def _pending(
    em: _Emitter,
    key: str,
    kind: str,
    args_digest: str | None,
    detail: str | None,
    expires_at: int,
) -> None:
    em.on_run(
        "action.pending",
        make(
            ActionPending,
            idempotency_key=key,
            kind=kind,
            args_digest=args_digest,
            detail=detail,
            expires_at=expires_at,
        ),
    )


def _deny(
    em: _Emitter,
    key: str,
    kind: str,
    reason: str,
    detail: str | None,
    decided_by: str | None = None,
) -> None:
    em.on_run(
        "action.denied",
        make(
            ActionDecision,
            idempotency_key=key,
            kind=kind,
            reason=reason,
            detail=detail,
            decided_by=decided_by,
        ),
    )


def _decide_action(em: _Emitter, cmd: Command) -> None:
    """`action.approve` / `action.deny`: a person decides a key of the run the command
    names (checked active already) that is waiting for them, for the request they saw."""
    p = cmd.payload
    assert isinstance(p, ActionApprovePayload | ActionDenyPayload)
    run = em.state.active
    assert run is not None
    key = p.idempotency_key
    rec = run.actions.get(key)
    if rec is None:
        em.reject("unknown_action", f"run {run.run_id} never asked for {key!r}")
    elif rec.decision != "pending":
        why = f"{rec.decision} ({rec.reason})" if rec.reason else rec.decision
        em.reject("action_not_pending", f"{key!r} is {why}")
    elif p.generation is not None and p.generation != rec.generation:
        em.reject(
            "approval_stale",
            f"the pending request of {key!r} is generation {rec.generation}, not {p.generation}",
        )
    elif p.args_digest != rec.args_digest:
        em.reject("digest_mismatch", f"argsDigest {p.args_digest!r} is not the pending request's")
    elif em.now >= (rec.expires_at or 0):
        # the state is the timer's to change: it denies every expired key at once
        em.reject("approval_expired", f"the approval window closed at {rec.expires_at}")
    elif isinstance(p, ActionApprovePayload):
        em.on_run(
            "action.approved",
            make(ActionDecision, idempotency_key=key, kind=rec.kind, decided_by=cmd.actor),
        )
    else:
        _deny(em, key, rec.kind, "denied", p.reason, decided_by=cmd.actor)


def _action_result(em: _Emitter, cmd: Command, run: RunState) -> None:
    p = cmd.payload_as(ActionResultPayload)
    first = run.actions.get(p.idempotency_key)
    if first is None or first.decision != "approved":
        em.reject("unknown_action", f"no approved action {p.idempotency_key!r}")
    elif first.completed:
        em.reject("action_already_completed", p.idempotency_key)
    else:
        em.on_run(
            "action.completed",
            make(ActionCompleted, idempotency_key=p.idempotency_key, ok=p.ok, result=p.result),
        )
