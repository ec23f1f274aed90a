"""docs/examples/webhook_receiver.py loaded as a module: the unit tests and the integration
tests check deliveries with the receiver users copy."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

EXAMPLE = Path(__file__).resolve().parents[1] / "docs/examples/webhook_receiver.py"


def example_receiver() -> ModuleType:
    spec = importlib.util.spec_from_file_location("webhook_receiver", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
