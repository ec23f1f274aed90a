"""Every exception sessionstream defines descends from `SessionstreamError`: a caller
handles the project's failures with one `except`, whatever module raised them."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

from sessionstream.errors import SessionstreamError

PACKAGES = ("sessionstream",)


def _modules() -> list[str]:
    names = []
    for root in PACKAGES:
        pkg = importlib.import_module(root)
        names.append(root)
        for info in pkgutil.walk_packages(pkg.__path__, prefix=f"{root}."):
            names.append(info.name)
    return names


def _defined_exceptions() -> list[type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for name in _modules():
        module = importlib.import_module(name)
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if issubclass(obj, BaseException) and obj.__module__ == module.__name__:
                found[f"{obj.__module__}.{obj.__qualname__}"] = obj
    return list(found.values())


def test_the_packages_define_exceptions_at_all() -> None:
    names = {e.__name__ for e in _defined_exceptions()}
    assert {"ApiError", "Stopping", "ReadError", "KafkaUnavailable"} <= names


@pytest.mark.parametrize("exc", _defined_exceptions(), ids=lambda e: e.__qualname__)
def test_every_exception_descends_from_the_one_root(exc: type[BaseException]) -> None:
    assert issubclass(exc, SessionstreamError), f"{exc.__module__}.{exc.__qualname__}"
