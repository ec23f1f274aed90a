"""sessionstream: the single-writer protocol for AI-agent sessions, on Kafka."""

from importlib.metadata import PackageNotFoundError, version

__all__ = ["__version__"]

try:
    __version__ = version("sessionstream")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"
