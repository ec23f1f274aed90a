"""Live analytics over `session.events`: runs, cancel latency, rejections, active runs.

`fold` turns records into idempotent table writes, `stats` aggregates what was folded,
`app` runs both on faust-streaming (`sessionstream analytics`). See docs/analytics.md.
"""

from consumers.analytics.facts import Cursor, Rejection, RunFacts
from consumers.analytics.fold import Folder, Write

__all__ = ["Cursor", "Folder", "Rejection", "RunFacts", "Write"]
