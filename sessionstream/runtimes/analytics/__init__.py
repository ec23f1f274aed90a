"""Live analytics over `session.events`: runs, cancel latency, rejections, active runs.

`fold` turns records into idempotent table writes, `stats` aggregates what was folded,
`app` runs both on faust-streaming (`sessionstream analytics`). See docs/analytics.md.
"""

from sessionstream.runtimes.analytics.facts import Cursor, Rejection, RunFacts
from sessionstream.runtimes.analytics.fold import Folder, Write

__all__ = ["Cursor", "Folder", "Rejection", "RunFacts", "Write"]
