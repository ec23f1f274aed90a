"""The stack's other profiles (secured, 3-node cluster) for the tests that need them.

They run next to the default stack, on ports and state of their own; a test module starts
the one it needs with an idempotent `stack/stack.sh up` (`running`) and stops it again when
it started it (three idle brokers would otherwise share the CPUs with the rest of the suite;
a profile that was already running, e.g. a developer's, is left as it was).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from sessionstream.adapters.kafka.config import client_config
from sessionstream.settings import Settings, read_credentials_file
from stack.worlds import delete_world
from tests.integration.worlds import ISOLATED

REPO = Path(__file__).resolve().parents[2]

#: the variable that selects each profile (the rest of the environment is the test's own)
PROFILES = {
    "secure": {"SESSIONSTREAM_STACK_SECURE": "1"},
    "cluster": {"SESSIONSTREAM_KAFKA_BROKERS": "3"},
}


def stack(
    profile: str,
    *args: str,
    timeout: float = 300.0,
    check: bool = True,
    wait_s: float | None = None,
) -> str:
    """Run `stack/stack.sh ARGS` for `profile`; its output (stdout and stderr). `wait_s`:
    how long a starting server may take to answer (`SESSIONSTREAM_STACK_TIMEOUT`)."""
    env = dict(os.environ)
    env.pop("SESSIONSTREAM_STACK_SECURE", None)
    env.pop("SESSIONSTREAM_KAFKA_BROKERS", None)
    env.update(PROFILES[profile])
    if wait_s is not None:
        env["SESSIONSTREAM_STACK_TIMEOUT"] = str(round(wait_s))
    started = time.monotonic()
    proc = subprocess.run(
        ["bash", str(REPO / "stack/stack.sh"), *args],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    output = proc.stdout + proc.stderr
    print(f"$ [{profile}] stack.sh {' '.join(args)}  ({time.monotonic() - started:.1f}s)\n{output}")
    if check:
        assert proc.returncode == 0, f"stack.sh {args} ({profile}) exited {proc.returncode}"
    return output


@dataclass(frozen=True)
class Profile:
    """Where a running profile is: from `stack.sh where`."""

    name: str
    values: dict[str, str]

    @property
    def bootstrap(self) -> str:
        return self.values["KAFKA_BOOTSTRAP"]

    @property
    def nodes(self) -> int:
        return int(self.values["KAFKA_NODES"])

    def node_address(self, n: int) -> str:
        return self.values[f"KAFKA_NODE_{n}"]

    def credentials(self, role: str) -> Path:
        return Path(self.values["CREDENTIALS_DIR"]) / f"{role}.env"

    def settings(self, role: str | None = None, **update: object) -> Settings:
        """Settings of `role` (from its credentials file, beating the environment), or of
        an unauthenticated client of the profile when `role` is None."""
        if role is None:
            values: dict[str, object] = {
                "kafka_bootstrap": self.bootstrap,
                "kafka_security_protocol": "PLAINTEXT",
            }
        else:
            values = {"credentials_file": self.credentials(role)}
            values.update(read_credentials_file(self.credentials(role)))
        values.update(update)
        return Settings(**values)  # type: ignore[arg-type]


def up(profile: str) -> tuple[Profile, str]:
    """`stack.sh up` (idempotent) and where the profile is; also returns up's output."""
    output = stack(profile, "up")
    where = stack(profile, "where")
    values: dict[str, str] = {}
    for line in where.splitlines():
        name, sep, value = line.partition("=")
        if sep and name.isidentifier():
            values[name] = shlex.split(value)[0] if value else ""
    assert values.get("STACK_PROFILE") == profile, where
    return Profile(profile, values), output


#: the topics tests name for themselves: isolated worlds (`it.<kind>.<tag>`) and
#: topic_factory's / the cluster tests' (`it-...`)
TEST_TOPIC_PREFIXES = ("it.", "it-")


def _admin(where: Profile) -> AdminClient:
    """An admin client of the profile (its admin credentials on a secured one)."""
    s = where.settings("admin") if "CREDENTIALS_DIR" in where.values else where.settings()
    return AdminClient(client_config(s))


def named_test_topics(admin: AdminClient) -> set[str]:
    names = admin.list_topics(timeout=30).topics
    return {t for t in names if t.startswith(TEST_TOPIC_PREFIXES)}


def remove_test_topics(where: Profile, keep: frozenset[str] = frozenset()) -> list[str]:
    """Delete the tests' topics on the profile but `keep`; the names deleted.

    A profile's state outlives the test session (on a CI machine too): topics left behind
    pile up, and every broker restart loads and recovers each of their partitions (838 of
    them took 146 s on a loaded machine and made a fault test's restart miss its limit)."""
    admin = _admin(where)  # alive until its futures are done
    names = sorted(named_test_topics(admin) - keep)
    if names:
        for name, fut in admin.delete_topics(names, operation_timeout=60).items():
            try:
                fut.result(timeout=120)
            except KafkaException as e:  # deleted meanwhile: gone is what we want
                print(f"{name}: {e}")
    return names


def release_worlds(where: Profile) -> None:
    """Delete the isolated worlds made on this profile now, while it still runs (the
    session's end, which deletes the others, comes after the profile is stopped)."""
    mine = [s for s in ISOLATED if s.kafka_bootstrap == where.bootstrap]
    if mine:
        failed = delete_world(mine)
        ISOLATED[:] = [s for s in ISOLATED if s.kafka_bootstrap != where.bootstrap]
        if failed:
            print(f"[{where.name}] not deleted: {failed}")


@contextmanager
def running(profile: str) -> Iterator[Profile]:
    """The profile up for the block; stopped afterwards if this `up` started any of it.

    The tests' topics made during the block are deleted before it ends; a profile this
    `up` started also loses the test topics earlier runs left (killed runs, old versions).
    """
    where, output = up(profile)
    started = "ready on" in output  # a node that was down (already running: says so)
    before: frozenset[str] = frozenset()
    try:
        if started:
            left = remove_test_topics(where)
            print(f"[{profile}] removed {len(left)} test topics left by earlier runs")
        else:
            before = frozenset(named_test_topics(_admin(where)))  # may be someone's
        yield where
    finally:
        try:
            release_worlds(where)
            remove_test_topics(where, keep=before)
        finally:
            if started:
                stack(profile, "down", check=False)


# -- the cluster profile's partitions, replicas and transaction coordinators ------------------
#: transaction.state.log.num.partitions in stack/kafka/server.properties.in
TXN_PARTITIONS = 4


def partitions(admin: AdminClient, topic: str) -> dict[int, tuple[int, list[int], list[int]]]:
    """partition -> (leader, replicas, in-sync replicas); empty while the broker asked does
    not know the topic yet (metadata reaches each node on its own time)."""
    meta = admin.list_topics(topic, timeout=10).topics[topic]
    if meta.error is not None:
        return {}
    return {p: (m.leader, list(m.replicas), list(m.isrs)) for p, m in meta.partitions.items()}


def isr_full(admin: AdminClient, topic: str, size: int) -> bool:
    try:
        parts = partitions(admin, topic)
    except KafkaException:
        return False
    return bool(parts) and all(
        len(isr) == size and leader >= 0 for leader, _, isr in parts.values()
    )


def java_hash(text: str) -> int:
    h = 0
    for ch in text:
        h = (31 * h + ord(ch)) & 0xFFFFFFFF
    return h


def txn_coordinator(admin: AdminClient, transactional_id: str) -> int:
    """The node leading the transaction-log partition of `transactional_id` (Kafka's
    `Utils.abs(id.hashCode) % partitions`: the absolute value of the signed hash, not the
    hash with its sign bit masked, which names another partition for negative hashes)."""
    h = java_hash(transactional_id)
    signed = h - (1 << 32) if h & 0x80000000 else h
    partition = (0 if signed == -(1 << 31) else abs(signed)) % TXN_PARTITIONS
    return partitions(admin, "__transaction_state")[partition][0]
