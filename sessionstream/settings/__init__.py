"""Runtime configuration, read from ``SESSIONSTREAM_*`` environment variables.

The defaults point at the local stack that ``make up`` starts (Kafka on 127.0.0.1:9092,
PostgreSQL on 127.0.0.1:5432). Nothing else in the code knows those addresses: a user with
their own Kafka or PostgreSQL sets ``SESSIONSTREAM_KAFKA_BOOTSTRAP`` /
``SESSIONSTREAM_DATABASE_URL`` and everything follows.

Credentials come from the same variables, or from a *credentials file* named by
``SESSIONSTREAM_CREDENTIALS_FILE``: ``SESSIONSTREAM_X=value`` lines (what the secured local
stack writes, one file per role). Precedence: arguments, then the environment, then the
file, then the defaults. Passwords are ``SecretStr``: they never show in a repr or a log.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from functools import cache, lru_cache
from typing import Any

from pydantic import SecretStr, ValidationError
from pydantic.fields import FieldInfo

from sessionstream.errors import ConfigurationError
from sessionstream.settings._base import (
    ENV_PREFIX,
    LIBRDKAFKA_DEBUG_CONTEXTS,
    PRODUCER_MARK,
    Part,
    check_instance_id,
    read_credentials_file,
    redact_conninfo,
)
from sessionstream.settings.components import (
    AnalyticsSettings,
    DatabaseSettings,
    GatewaySettings,
    KafkaSettings,
    LimitSettings,
    MetricsSettings,
    ModelSettings,
    ProcessorSettings,
    RegistrySettings,
    SinkSettings,
    TopicSettings,
    WorkerSettings,
)
from sessionstream.settings.webhooks import WebhookSettings

__all__ = [
    "COMPONENTS",
    "ENV_PREFIX",
    "LIBRDKAFKA_DEBUG_CONTEXTS",
    "PROCESS_COMPONENTS",
    "PRODUCER_MARK",
    "AnalyticsSettings",
    "DatabaseSettings",
    "GatewaySettings",
    "KafkaSettings",
    "LimitSettings",
    "MetricsSettings",
    "ModelSettings",
    "ProcessorSettings",
    "RegistrySettings",
    "Settings",
    "SinkSettings",
    "TopicSettings",
    "WebhookSettings",
    "WorkerSettings",
    "check_instance_id",
    "get_settings",
    "read_credentials_file",
    "redact_conninfo",
    "settings_for",
]


class Settings(
    KafkaSettings,
    DatabaseSettings,
    RegistrySettings,
    TopicSettings,
    ProcessorSettings,
    LimitSettings,
    SinkSettings,
    WorkerSettings,
    ModelSettings,
    MetricsSettings,
    AnalyticsSettings,
    GatewaySettings,
    WebhookSettings,
):
    """Every component's settings in one object; field ``x`` is read from ``SESSIONSTREAM_X``.
    A long-running process builds only the components it reads (`settings_for`); the
    commands and tools build them all (`get_settings`)."""

    @property
    def analytics_url(self) -> str:
        """``gateway_analytics_url`` or the analytics app's own address."""
        return self.gateway_analytics_url or f"http://{self.analytics_host}:{self.analytics_port}"


#: the components, by the name errors and the README's table use
COMPONENTS: dict[str, type[Part]] = {
    "kafka": KafkaSettings,
    "database": DatabaseSettings,
    "registry": RegistrySettings,
    "topics": TopicSettings,
    "processor": ProcessorSettings,
    "limits": LimitSettings,
    "sink": SinkSettings,
    "worker": WorkerSettings,
    "model": ModelSettings,
    "metrics": MetricsSettings,
    "analytics": AnalyticsSettings,
    "gateway": GatewaySettings,
    "webhooks": WebhookSettings,
}

#: the components each long-running process reads (a unit test derives them from the code
#: the process runs, so a process never runs on a default it was meant to be told)
PROCESS_COMPONENTS: dict[str, tuple[str, ...]] = {
    "processor": ("kafka", "registry", "topics", "processor", "limits", "metrics"),
    # the sink's group is named after the processor's (`{processor_group}-sink`)
    "sink": ("kafka", "registry", "topics", "database", "processor", "sink", "metrics"),
    "worker": ("kafka", "registry", "topics", "database", "worker", "limits", "model", "metrics"),
    # the gateway names the access grants' groups (`processor_group`), reads the live
    # analytics at their address, and seals and checks new webhook subscriptions
    "gateway": (
        "kafka",
        "registry",
        "topics",
        "database",
        "processor",
        "gateway",
        "analytics",
        "webhooks",
    ),
    "analytics": ("kafka", "registry", "topics", "analytics"),
    "webhooks": ("kafka", "registry", "topics", "database", "webhooks", "metrics"),
}


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, every component, read from the environment on first use."""
    return Settings()


@cache
def settings_for(process: str) -> Settings:
    """The settings of a long-running process (a key of `PROCESS_COMPONENTS`): only the
    components it reads are built from the environment, each on its own, so an error names
    its component and a value meant for another process (a gateway port, a model key) can
    neither stop it nor be read by it; the other fields keep their defaults."""
    values: dict[str, Any] = {}
    for name in PROCESS_COMPONENTS[process]:
        try:
            part = COMPONENTS[name]()
        except ValidationError as e:
            raise ConfigurationError(f"{process}: invalid {name} settings: {e}") from None
        values.update((field, getattr(part, field)) for field in type(part).model_fields)
    return Settings.model_construct(_fields_set=set(values), **values)


#: ``SESSIONSTREAM_*`` variables read by the local stack, the tests and the benchmarks (not
#: by the processes): known, so they are not warned about
TOOLING_VARIABLES: frozenset[str] = frozenset(
    f"SESSIONSTREAM_{name}"
    for name in [
        "STATE_DIR",
        "PG_DIR",
        "KAFKA_LIBS",
        "KAFKA_HEAP",
        "KAFKA_FORMAT_ARGS",
        "STACK_TIMEOUT",
        "STACK_SECURE",
        "KAFKA_BROKERS",
        "SECURE_STATE_DIR",
        "SECURE_DATABASE",
        "SECURE_KAFKA_PORT",
        "SECURE_CONTROLLER_PORT",
        "SECURE_REGISTRY_PORT",
        "CLUSTER_STATE_DIR",
        "CLUSTER_KAFKA_PORT",
        "CLUSTER_CONTROLLER_PORT",
        "CLUSTER_SETTLE_S",
        "CLUSTER_RATE",
        "REGISTRY_HOME",
        "REGISTRY_HEAP",
        "MAVEN_CENTRAL",
        "CONNECT_LIBS",
        "CONNECT_HEAP",
        "FLINK_HOME",
        "FLINK_VENV",
        "FLINK_JARS",
        "SOAK",
        "HOLD_ON_FAILURE",
    ]
)


def setting_variables() -> frozenset[str]:
    """The environment variable of every setting (``SESSIONSTREAM_<FIELD>``)."""
    return frozenset(f"SESSIONSTREAM_{name.upper()}" for name in Settings.model_fields)


def unknown_variables(environ: Mapping[str, str]) -> list[str]:
    """One line per ``SESSIONSTREAM_*`` variable in `environ` that no setting and no tool
    reads (a typo, or a setting that does not exist): it would be ignored in silence."""
    known = setting_variables() | TOOLING_VARIABLES
    lines = []
    for name in sorted(environ):
        if name.startswith("SESSIONSTREAM_") and name not in known:
            close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.75)
            hint = f" (did you mean {close[0]}?)" if close else ""
            lines.append(f"{name} is not a sessionstream setting and is ignored{hint}")
    return lines


def settings_table() -> str:
    """The settings as markdown tables (variable, default, meaning), one per component, from
    the fields and their docstrings: the README's configuration section is this (a test
    keeps it so)."""
    out: list[str] = []
    shared = ("credentials_file",)
    groups = [("shared", Part, shared)] + [
        (name, part, tuple(f for f in part.model_fields if f not in shared))
        for name, part in COMPONENTS.items()
    ]
    for name, part, fields in groups:
        readers = [p for p, parts in PROCESS_COMPONENTS.items() if name in parts]
        doc = " ".join((part.__doc__ or "").split()).replace("``", "`")
        if name == "shared":
            doc = "read by every component, below the environment."
        read_by = f" Read by: {', '.join(readers)}." if readers and name != "shared" else ""
        out += [f"**{name}** — {doc}{read_by}", ""]
        out += ["| variable | default | meaning |", "|---|---|---|"]
        for field_name in fields:
            out.append(_row(field_name, Settings.model_fields[field_name]))
        out.append("")
    return "\n".join(out).rstrip("\n")


def _row(name: str, field: FieldInfo) -> str:
    default = field.get_default(call_default_factory=True)
    if isinstance(default, SecretStr):
        default = "(set)"
    shown = "unset" if default is None or default == "" else f"`{default}`"
    if name == "store_dir":
        shown = "`$XDG_STATE_HOME/sessionstream/store`"
    bounds = _bounds(field)
    if bounds:
        shown = f"{shown} ({bounds})"
    meaning = " ".join((field.description or "").split()).replace("``", "`")
    meaning = meaning.replace("|", "\\|")
    return f"| `SESSIONSTREAM_{name.upper()}` | {shown} | {meaning} |"


def _bounds(field: FieldInfo) -> str:
    """A field's allowed range as the table shows it: `≥ 1`, `> 0`, `1 … 100000`."""
    low = high = ""
    for m in field.metadata:
        for attr, sign in (("ge", "≥"), ("gt", ">")):
            if getattr(m, attr, None) is not None:
                low, low_sign = str(getattr(m, attr)), sign
        for attr in ("le", "lt"):
            if getattr(m, attr, None) is not None:
                high = str(getattr(m, attr))
    if low and high:
        return f"{low} … {high}"
    if low:
        return f"{low_sign} {low}"
    return f"≤ {high}" if high else ""
