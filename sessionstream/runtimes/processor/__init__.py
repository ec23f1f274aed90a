"""The session processor: the transaction loop (`loop.py`), restore of a partition's
sessions (`restore.py`), the timer wheel (`timer_wheel.py`, pure), the stats observer
(`stats.py`)."""

from sessionstream.runtimes.processor.loop import TransactionalProcessor, default_instance_id
from sessionstream.runtimes.processor.stats import ProcessorStats

__all__ = ["ProcessorStats", "TransactionalProcessor", "default_instance_id"]
