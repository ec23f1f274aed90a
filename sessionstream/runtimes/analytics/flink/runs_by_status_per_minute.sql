-- Runs by status per tenant per minute (tumbling event-time windows): `started` counts
-- run.started, the terminal statuses count run.finished by its terminalStatus.
WITH transitions AS (
  SELECT tenantId, event_time,
    CASE type WHEN 'run.started' THEN 'started' ELSE payload.terminalStatus END AS status
  FROM session_events
  WHERE type IN ('run.started', 'run.finished') AND runId <> '_session'
)
SELECT window_start, window_end, tenantId AS tenant, status, COUNT(*) AS runs
FROM TABLE(TUMBLE(TABLE transitions, DESCRIPTOR(event_time), INTERVAL '1' MINUTE))
GROUP BY window_start, window_end, tenantId, status
