"""The Flink SQL source table as sessionstream/runtimes/analytics/flink_job.py renders it."""

from __future__ import annotations

import pytest

from sessionstream.runtimes.analytics.flink_job import render_source

BASE = {
    "bootstrap": "127.0.0.1:9092",
    "topic": "session.events",
    "registry_url": "http://127.0.0.1:8081/apis/ccompat/v7",
    "group_id": "g",
}


def test_it_reads_committed_avro_confluent_from_the_earliest_offsets() -> None:
    sql = render_source(**BASE, bounded=False)
    assert "'properties.isolation.level' = 'read_committed'" in sql
    assert "'value.format' = 'avro-confluent'" in sql
    assert "'scan.startup.mode' = 'earliest-offset'" in sql
    assert "scan.bounded.mode" not in sql


def test_bounded_stops_at_the_offsets_of_the_start() -> None:
    assert "'scan.bounded.mode' = 'latest-offset'" in render_source(**BASE, bounded=True)


def test_start_offsets_name_every_partition() -> None:
    sql = render_source(**BASE, bounded=True, start_offsets="0:57,1:105,2:0,3:0")
    assert "'scan.startup.mode' = 'specific-offsets'" in sql
    assert (
        "'scan.startup.specific-offsets' = "
        "'partition:0,offset:57;partition:1,offset:105;partition:2,offset:0;partition:3,offset:0'"
    ) in sql
    assert "earliest-offset" not in sql


@pytest.mark.parametrize("bad", ["0:x", "0", "a:1", "0:1;1:2"])
def test_malformed_start_offsets_are_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        render_source(**BASE, bounded=False, start_offsets=bad)
