-- The run event stream as Flink reads it: Avro in the Confluent wire format, the writer
-- schema fetched by id from the registry. The dollar placeholders are filled in by flink_job.py.
--
-- `payload` is a union of records in the writer schema. Declared here as ONE row of the
-- nullable fields the queries need, Avro's schema resolution reads every branch into it
-- by field name (a branch without the field gives NULL): run.finished fills
-- terminalStatus, command.rejected fills reason and commandType. `reason` also exists in
-- other branches (run.cancel_requested's, run.dequeued's), so a query picks its event
-- type first.
-- A record whose schema id the registry lacks fails the job; the format never skips.
CREATE TEMPORARY TABLE session_events (
  sessionId STRING NOT NULL,
  runId STRING NOT NULL,
  seq BIGINT NOT NULL,
  type STRING NOT NULL,
  generation BIGINT NOT NULL,
  commandId STRING NOT NULL,
  ts BIGINT NOT NULL,
  tenantId STRING NOT NULL,
  producerTs BIGINT,
  payload ROW<terminalStatus STRING, reason STRING, commandType STRING>,
  -- event time: the processor's decision time (the projection's created_at/terminal_at)
  event_time AS TO_TIMESTAMP_LTZ(ts, 3),
  WATERMARK FOR event_time AS event_time - INTERVAL '${watermark_delay_s}' SECOND
) WITH (
  'connector' = 'kafka',
  'topic' = '${topic}',
  'properties.bootstrap.servers' = '${bootstrap}',
  'properties.group.id' = '${group_id}',
  'properties.isolation.level' = 'read_committed',
  ${startup}
  ${bounded}
  'scan.watermark.idle-timeout' = '${idle_timeout_s} s',
  'value.format' = 'avro-confluent',
  'value.avro-confluent.url' = '${registry_url}'
)
