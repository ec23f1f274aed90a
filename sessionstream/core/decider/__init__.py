"""The session decider: `decide(state, command, at=..., seen=...) -> Decision`, and
`evolve(state, event) -> state`.

Pure and deterministic: no clock, no randomness, no I/O. "Now" comes in as `at`, the
broker's append time of the command record (`LogAppendTime`), folded monotonically per
session: the decider's clock is `max(state.clock, at)`, so producer clocks (`command.ts`)
never decide anything and a replay of the same log decides the same. Run ids are uuid5 of
the session, the causing command and the session's run counter, so the same commands in the
same order give byte-identical events.

Every command gets exactly one visible outcome: the events it caused, one
`command.rejected` (with its reason), or nothing for an exact re-send of a command id the
session has already decided. Checks run in this order: authorization (tenant) →
duplicates (`seen`: the content digest recorded for this command id, looked up by the
caller) → size → the run the command names → the type's own rules.
"""

from sessionstream.core.decider._base import (
    DEFAULT_CONFIG,
    RUN_ID_NAMESPACE,
    DeciderConfig,
    Decision,
    command_digest,
    run_id_for,
)
from sessionstream.core.decider._decide import HANDLED_COMMAND_TYPES, apply, decide
from sessionstream.core.decider._evolve import evolve, fold
from sessionstream.schemas.events import REJECTION_REASONS

__all__ = [
    "DEFAULT_CONFIG",
    "HANDLED_COMMAND_TYPES",
    "REJECTION_REASONS",
    "RUN_ID_NAMESPACE",
    "DeciderConfig",
    "Decision",
    "apply",
    "command_digest",
    "decide",
    "evolve",
    "fold",
    "run_id_for",
]
