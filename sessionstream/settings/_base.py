"""What every component's settings share: the prefix, the credentials file, the helpers that
read and redact them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dotenv import dotenv_values
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

__all__ = [
    "ENV_PREFIX",
    "LIBRDKAFKA_DEBUG_CONTEXTS",
    "PRODUCER_MARK",
    "Part",
    "check_instance_id",
    "read_credentials_file",
    "redact_conninfo",
]

ENV_PREFIX = "SESSIONSTREAM_"


#: separates a processor instance id from its second producer's number (`{group}-{instance}#1`)
PRODUCER_MARK = "#"


def check_instance_id(instance: str) -> str:
    """A processor instance id, or ValueError. Not empty, and without ``#``: an instance's
    second transactional id is ``{group}-{instance}#1``, which must not be another
    instance's first (host names, the default, never contain one)."""
    if not instance or PRODUCER_MARK in instance:
        raise ValueError(
            f"processor instance id {instance!r} must be non-empty and must not contain '#'"
        )
    return instance


def read_credentials_file(path: Path | str) -> dict[str, str]:
    """The settings a credentials file sets, by field name (``SESSIONSTREAM_X`` -> ``x``).

    Lines without the prefix are ignored (a file may also serve ``set -a; . file``)."""
    p = Path(path)
    if not p.is_file():
        # the message names the file, never its content
        raise FileNotFoundError(f"credentials file {p} does not exist")
    out: dict[str, str] = {}
    for key, value in dotenv_values(p).items():
        if key.startswith(ENV_PREFIX) and value is not None:
            out[key[len(ENV_PREFIX) :].lower()] = value
    return out


def redact_conninfo(conninfo: str) -> str:
    """``user@host:port/dbname`` of a libpq URL or ``key=value`` string: no password."""
    from psycopg import ProgrammingError
    from psycopg.conninfo import conninfo_to_dict

    try:
        d = conninfo_to_dict(conninfo)
    except ProgrammingError:
        return "<unparsable conninfo>"
    user = f"{d['user']}@" if d.get("user") else ""
    return f"{user}{d.get('host', '')}:{d.get('port', 5432)}/{d.get('dbname', '')}"


class _CredentialsFileSource(PydanticBaseSettingsSource):
    """Values from the file named by ``credentials_file`` (set by an argument or the env)."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        raise NotImplementedError  # __call__ reads the whole file at once

    def __call__(self) -> dict[str, Any]:
        path = self.current_state.get("credentials_file")
        if not path:
            return {}
        fields = self.settings_cls.model_fields
        return {k: v for k, v in read_credentials_file(path).items() if k in fields}


#: librdkafka's ``debug`` contexts (CONFIGURATION.md, 2.x)
LIBRDKAFKA_DEBUG_CONTEXTS = frozenset(
    [
        "generic",
        "broker",
        "topic",
        "metadata",
        "feature",
        "queue",
        "msg",
        "protocol",
        "cgrp",
        "security",
        "fetch",
        "interceptor",
        "plugin",
        "consumer",
        "admin",
        "eos",
        "mock",
        "assignor",
        "conf",
        "telemetry",
        "all",
    ]
)


class Part(BaseSettings):
    """What every component's settings share: the ``SESSIONSTREAM_`` prefix, frozen values,
    passwords that never show, and the credentials file below the environment."""

    model_config = SettingsConfigDict(
        env_prefix="SESSIONSTREAM_",
        frozen=True,
        extra="ignore",
        # The docstrings below become the fields' descriptions (shown by --help later).
        use_attribute_docstrings=True,
        # a validation error must not echo the input: it may hold a password
        hide_input_in_errors=True,
    )

    credentials_file: Path | None = None
    """A file of ``SESSIONSTREAM_X=value`` lines (a role's Kafka user and password, database
    URL and password, ...) read below the environment; the secured stack writes one per role."""

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # the credentials file sits below the environment: an explicit variable still wins
        return (
            init_settings,
            env_settings,
            _CredentialsFileSource(settings_cls),
            dotenv_settings,
            file_secret_settings,
        )
