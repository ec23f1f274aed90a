"""The schema registry adapter: sessionstream's Avro schemas registered under their topics'
subjects, their ids resolved once, writer schemas fetched by id for the codec.

Subjects follow Confluent's TopicNameStrategy (``<topic>-value``): the three command topics
carry the command schema, the events topic the event schema. Each subject's compatibility
level is ``BACKWARD_TRANSITIVE``: every new version must read everything any earlier
version wrote, which is what replaying a whole log with the newest code needs. (FULL would
also let old readers read new records, but then no version could add an event type: an
old reader cannot take a union branch it does not know. Readers upgrade first.)

Driver errors (confluent-kafka's `SchemaRegistryClient`, which speaks the
Confluent-compatible API of Apicurio and of Confluent's registry) become `RegistryUnavailable`,
`SchemaIncompatible` or `UnknownSchema` here. A schema asked for by id while the registry
does not answer is waited for, with back-off, and never guessed: a reader never skips a
record and never crashes on it (`stop` ends the wait, for a process that is stopping).
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any, Final

from sessionstream.errors import RegistryUnavailable, SchemaIncompatible
from sessionstream.schemas._avro import command_schema, event_schema, outcome_schema
from sessionstream.schemas.codec import Codec
from sessionstream.schemas.errors import UnknownSchema
from sessionstream.settings import Settings

__all__ = [
    "COMPATIBILITY",
    "SchemaRegistry",
    "attach_registry",
    "reader_codec",
    "registry_codec",
    "subjects_of",
]

log = logging.getLogger("sessionstream.adapters.registry")

COMPATIBILITY: Final = "BACKWARD_TRANSITIVE"

#: the schema of each kind, as this version writes it
_SCHEMAS: Final[dict[str, Callable[[], dict[str, Any]]]] = {
    "command": command_schema,
    "event": event_schema,
    "outcome": outcome_schema,
}


def subjects_of(settings: Settings) -> dict[str, str]:
    """Subject -> kind of every topic sessionstream writes Avro to."""
    return {
        f"{settings.commands_topic}-value": "command",
        f"{settings.worker_commands_topic}-value": "command",
        f"{settings.timers_topic}-value": "command",
        f"{settings.events_topic}-value": "event",
        f"{settings.outcomes_topic}-value": "outcome",
    }


def _status(e: Exception) -> int | None:
    code = getattr(e, "http_status_code", None)
    return code if isinstance(code, int) else None


class SchemaRegistry:
    """One process's view of the registry: `resolve` once, then `writer_id` / `schema`
    (the codec's `SchemaSource`). No network in `__init__`."""

    def __init__(
        self,
        settings: Settings,
        *,
        stop: threading.Event | None = None,
        max_wait_s: float = 10.0,
    ) -> None:
        self.settings = settings
        self.url = settings.schema_registry_url.rstrip("/")
        self.stop = stop or threading.Event()
        self.max_wait_s = max_wait_s
        self._client: Any = None
        self._ids: dict[str, int] = {}
        self._schemas: dict[int, dict[str, Any]] = {}

    # -- the client -------------------------------------------------------------------------
    @property
    def client(self) -> Any:
        if self._client is None:
            from confluent_kafka.schema_registry import SchemaRegistryClient

            conf: dict[str, Any] = {"url": self.url, "timeout": 10, "max.retries": 0}
            s = self.settings
            if s.schema_registry_username:
                secret = s.schema_registry_password
                password = secret.get_secret_value() if secret else ""
                conf["basic.auth.user.info"] = f"{s.schema_registry_username}:{password}"
            self._client = SchemaRegistryClient(conf)
        return self._client

    def _call(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn(*args)`; a registry that does not answer (a connection error, a 5xx) is
        `RegistryUnavailable`; its HTTP answers (4xx) are raised as they are."""
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        try:
            return fn(*args)
        except SchemaRegistryError as e:
            status = _status(e)
            if status is not None and status < 500:
                raise
            raise RegistryUnavailable(f"{what}: {e}", url=self.url) from e
        except Exception as e:  # httpx's connection errors, timeouts, a proxy's garbage
            raise RegistryUnavailable(f"{what}: {type(e).__name__}: {e}", url=self.url) from e

    # -- resolving ids ------------------------------------------------------------------------
    def resolve(
        self,
        kinds: tuple[str, ...] = ("command", "event", "outcome"),
        *,
        register: bool = True,
        topics: tuple[str, ...] | None = None,
    ) -> dict[str, int]:
        """The id of this version's schema of each of `kinds`, in every subject that
        carries it; unregistered, it is registered (`register`) when the subject's
        history allows, else `SchemaIncompatible` names the subject and the reason.
        Every subject of a kind must give the same id (a registry that keys ids by content
        does): one id a kind, so the same model is always the same bytes. `topics`: only
        the subjects of these topics (what the process writes to)."""
        from confluent_kafka.schema_registry import Schema
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        ids: dict[str, int] = {}
        for subject, kind in subjects_of(self.settings).items():
            if kind not in kinds or (
                topics is not None and subject[: -len("-value")] not in topics
            ):
                continue
            text = json.dumps(_SCHEMAS[kind]())
            schema = Schema(text, "AVRO")
            try:
                found = self._call(
                    f"looking up {subject}", self.client.lookup_schema, subject, schema
                )
                schema_id = int(found.schema_id)
            except SchemaRegistryError as e:
                if _status(e) != 404 or not register:
                    if _status(e) == 404:
                        raise SchemaIncompatible(
                            f"{subject}: this version's {kind} schema is not registered "
                            "(run `sessionstream topics create`)",
                            subject=subject,
                            detail=str(e),
                        ) from e
                    raise
                schema_id = self._register(subject, kind, text)
            prior = ids.setdefault(kind, schema_id)
            if prior != schema_id:
                raise SchemaIncompatible(
                    f"the {kind} schema has id {prior} in one subject and {schema_id} in "
                    f"{subject}: this registry gives one schema different ids per subject, "
                    "which sessionstream does not support",
                    subject=subject,
                    detail="ids differ",
                )
        self._ids.update(ids)
        return ids

    def _register(self, subject: str, kind: str, text: str) -> int:
        from confluent_kafka.schema_registry import Schema
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        existing = self._call(f"listing {subject}", self._versions, subject)
        if not existing:
            try:
                self._call(
                    f"setting {subject}'s compatibility",
                    self.client.set_compatibility,
                    subject,
                    COMPATIBILITY,
                )
            except SchemaRegistryError as e:
                if _status(e) != 409:  # 409: another process set it a moment ago
                    raise
        try:
            schema_id = int(
                self._call(
                    f"registering {subject}",
                    self.client.register_schema,
                    subject,
                    Schema(text, "AVRO"),
                )
            )
        except SchemaRegistryError as e:
            if _status(e) == 409:
                raise SchemaIncompatible(
                    f"{subject}: this version's {kind} schema is not compatible with the "
                    f"versions registered before ({COMPATIBILITY}): {e}",
                    subject=subject,
                    detail=str(e),
                ) from e
            raise
        log.info("registry: registered %s as id %d", subject, schema_id)
        return schema_id

    def _versions(self, subject: str) -> list[int]:
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        try:
            versions: list[int] = self.client.get_versions(subject)
        except SchemaRegistryError as e:
            if _status(e) == 404:
                return []
            raise
        return versions

    def check(self) -> list[str]:
        """What is wrong with the registry for this version, as sentences (none: fine):
        a subject without this version's schema that its history would refuse, or with
        another compatibility level than `COMPATIBILITY`."""
        from confluent_kafka.schema_registry import Schema
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        problems = []
        for subject, kind in subjects_of(self.settings).items():
            text = json.dumps(_SCHEMAS[kind]())
            versions = self._call(f"listing {subject}", self._versions, subject)
            if not versions:
                problems.append(
                    f"{subject}: no schema registered (run `sessionstream topics create`)"
                )
                continue
            try:
                found = self._call(
                    f"looking up {subject}",
                    self.client.lookup_schema,
                    subject,
                    Schema(text, "AVRO"),
                )
                if found.version is not None and found.version < max(versions):
                    problems.append(
                        f"{subject}: a newer schema than this version's is registered "
                        f"(version {max(versions)}; this version's is {found.version}): "
                        "records written with it need a newer sessionstream to be read"
                    )
            except SchemaRegistryError as e:
                if _status(e) != 404:
                    raise
                detail = self._why_incompatible(subject, text)
                if detail is not None:
                    problems.append(
                        f"{subject}: this version's {kind} schema is not compatible with the "
                        f"{len(versions)} version(s) registered ({COMPATIBILITY}): {detail}"
                    )
                else:
                    problems.append(
                        f"{subject}: this version's {kind} schema is not registered yet; "
                        "it is compatible (`sessionstream topics create` registers it)"
                    )
            level = self._call(f"reading {subject}'s compatibility", self._compatibility, subject)
            if level != COMPATIBILITY:
                problems.append(f"{subject}: compatibility {level}, expected {COMPATIBILITY}")
        return problems

    def _compatibility(self, subject: str) -> str | None:
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        try:
            level = self.client.get_compatibility(subject)
        except SchemaRegistryError as e:
            if _status(e) == 404:
                return None
            raise
        return str(level)

    def _why_incompatible(self, subject: str, text: str) -> str | None:
        """The registry's own reason the schema would be refused, or None if it would not.
        The compatibility endpoint answers only yes or no, so the history is copied into
        a scratch subject and the schema registered there: the refusal says why."""
        from confluent_kafka.schema_registry import Schema
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        ok = self._call(
            f"testing {subject}", self.client.test_compatibility, subject, Schema(text, "AVRO")
        )
        if ok:
            return None
        scratch = f"sessionstream-check-{uuid.uuid4().hex}"
        try:
            self.client.set_compatibility(scratch, COMPATIBILITY)
            for version in self._versions(subject):
                old = self.client.get_version(subject, version).schema
                self.client.register_schema(scratch, old)
            self.client.register_schema(scratch, Schema(text, "AVRO"))
        except SchemaRegistryError as e:
            return str(e)
        finally:
            try:
                self.client.delete_subject(scratch, permanent=False)
                self.client.delete_subject(scratch, permanent=True)
            except SchemaRegistryError:
                log.warning("registry: could not delete the scratch subject %s", scratch)
        return "refused by the registry's compatibility test"

    def delete_subjects(self) -> list[str]:
        """Delete this settings' subjects (a test world's); returns what was deleted."""
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        gone = []
        for subject in subjects_of(self.settings):
            try:
                self.client.delete_subject(subject, permanent=False)
                self.client.delete_subject(subject, permanent=True)
                gone.append(subject)
            except SchemaRegistryError as e:
                if _status(e) != 404:
                    raise
        return gone

    # -- the codec's SchemaSource -----------------------------------------------------------
    def writer_id(self, kind: str) -> int | None:
        return self._ids.get(kind)

    def schema(self, schema_id: int) -> dict[str, Any]:
        """The writer schema of `schema_id`, waited for while the registry does not answer."""
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        hit = self._schemas.get(schema_id)
        if hit is not None:
            return hit
        wait, warned = 0.25, 0.0
        while True:
            try:
                got = self._call(f"schema id {schema_id}", self.client.get_schema, schema_id)
                break
            except SchemaRegistryError as e:
                if _status(e) == 404:
                    raise UnknownSchema(
                        f"the schema registry has no schema with id {schema_id}",
                        schema_id=schema_id,
                    ) from e
                raise
            except RegistryUnavailable as e:
                if self.stop.is_set():
                    raise
                now = time.monotonic()
                if now - warned > 30:
                    log.warning(
                        "registry: schema id %d: %s; waiting (never skipping the record)",
                        schema_id,
                        str(e).splitlines()[0],
                    )
                    warned = now
                self.stop.wait(wait)
                wait = min(wait * 2, self.max_wait_s)
        if got.schema_type not in (None, "AVRO"):
            raise UnknownSchema(
                f"schema id {schema_id} is a {got.schema_type} schema, not Avro",
                schema_id=schema_id,
            )
        try:
            parsed: dict[str, Any] = json.loads(got.schema_str)
        except ValueError as e:
            raise UnknownSchema(
                f"schema id {schema_id} is not JSON: {e}", schema_id=schema_id
            ) from e
        self._schemas[schema_id] = parsed
        return parsed


def attach_registry(
    codec: Codec,
    settings: Settings,
    *,
    writes: tuple[str, ...] = (),
    topics: tuple[str, ...] | None = None,
    register: bool = True,
    stop: threading.Event | None = None,
    patience_s: float = 60.0,
) -> SchemaRegistry | None:
    """Attach the registry to `codec`: the kinds in `writes` are written in the Confluent
    framing with this version's ids (registered when missing and allowed; a registry that
    does not answer is waited for up to `patience_s`, an incompatible schema refused at
    once). The other kinds' ids are looked up too, so their records take the compiled path;
    a reader whose registry does not answer yet starts anyway and waits when it meets an
    id it does not know."""
    if not settings.schema_registry_url:
        # no registry: single-object encoding, as before registries (a deployment that
        # upgrades sets the URL; records of both framings are read alike)
        log.warning(
            "registry: SESSIONSTREAM_SCHEMA_REGISTRY_URL is empty; writing Avro "
            "single-object records, which Kafka's registry-aware tools cannot read"
        )
        return None
    reg = SchemaRegistry(settings, stop=stop)
    wanted = tuple(k for k in _SCHEMAS if k in writes)
    others = tuple(k for k in _SCHEMAS if k not in writes)
    deadline = time.monotonic() + patience_s
    wait = 0.5
    while wanted:
        try:
            reg.resolve(wanted, register=register, topics=topics)
            break
        except RegistryUnavailable:
            if reg.stop.is_set() or time.monotonic() + wait > deadline:
                raise
            log.warning("registry: %s does not answer; retrying in %.1f s", reg.url, wait)
            reg.stop.wait(wait)
            wait = min(wait * 2, 5.0)
    if others:
        try:
            reg.resolve(others, register=False)
        except (SchemaIncompatible, RegistryUnavailable) as e:
            # not registered yet, or no registry yet: records are read by id when met
            log.info("registry: %s not resolved now (%s); reading by id", others, e)
    codec.attach(reg)
    return reg


def reader_codec(settings: Settings, *, stop: threading.Event | None = None) -> Codec:
    """A codec that reads records of any registry id (each schema fetched once, when first
    met) and of the single-object encoding; nothing is asked of the registry before
    then. What it would write is single-object: writers use `attach_registry`."""
    if not settings.schema_registry_url:
        return Codec()
    return Codec(schemas=SchemaRegistry(settings, stop=stop))


def registry_codec(
    settings: Settings,
    *,
    writes: tuple[str, ...] = (),
    register: bool = True,
    stop: threading.Event | None = None,
) -> Codec:
    """A new codec with the registry attached (`attach_registry`)."""
    codec = Codec()
    attach_registry(codec, settings, writes=writes, register=register, stop=stop)
    return codec
