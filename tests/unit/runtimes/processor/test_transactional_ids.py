"""A processor instance's transactional ids: its two producers take turns, and no two
instances (nor an instance and an older version with one producer) may share an id."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from sessionstream.adapters.access import kafka_grants
from sessionstream.runtimes.processor.loop import (
    PRODUCERS,
    TransactionalProcessor,
    transactional_ids,
)
from sessionstream.settings import Settings, check_instance_id


def test_the_first_id_is_the_single_producer_versions_so_an_upgrade_fences_it() -> None:
    ids = transactional_ids("sessionstream-processor", "host-1")
    assert ids[0] == "sessionstream-processor-host-1"
    assert len(ids) == len(set(ids)) == PRODUCERS >= 2


def test_no_two_instances_share_a_transactional_id() -> None:
    """Instance ids may not contain '#', so `{instance}#1` is nobody's first id."""
    instances = ["a", "a-1", "a1", "a.1", "a_1", "b", "host", "host-0", "1", "x"]
    owners: dict[str, str] = {}
    for instance in instances:
        for tid in transactional_ids("g", instance):
            assert owners.setdefault(tid, instance) == instance, (tid, owners[tid], instance)


@pytest.mark.parametrize("bad", ["a#1", "#", "", "x#"])
def test_an_instance_id_that_could_be_anothers_second_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="must not contain '#'"):
        check_instance_id(bad)
    with pytest.raises(ValueError, match="must not contain '#'"):
        TransactionalProcessor(Settings(), instance_id=bad or "#")
    if bad:
        with pytest.raises(ValidationError, match="must not contain '#'"):
            Settings(processor_instance=bad)


def test_the_processors_acl_covers_both_ids() -> None:
    s = Settings()
    grants = [g for g in kafka_grants(s)["processor"] if g.resource == "transactional_id"]
    assert {g.operation for g in grants} >= {"WRITE", "DESCRIBE"}
    for tid in transactional_ids(s.processor_group, "host-1"):
        for g in grants:
            assert g.pattern == "prefixed" and tid.startswith(g.name), (tid, g)


def test_an_empty_instance_setting_means_the_host_name() -> None:
    """`SESSIONSTREAM_PROCESSOR_INSTANCE=` (empty) must not fail every service's settings."""
    assert Settings(processor_instance="").processor_instance is None
    assert Settings(processor_instance="  ").processor_instance is None
