-- Active runs per tenant at the end of each minute in which a run started or ended:
-- the running sum of (+1 per run.started, -1 per run.finished) over the windows. The
-- value holds until the tenant's next row.
WITH deltas AS (
  SELECT tenantId, event_time, CASE type WHEN 'run.started' THEN 1 ELSE -1 END AS delta
  FROM session_events
  WHERE type IN ('run.started', 'run.finished') AND runId <> '_session'
),
per_minute AS (
  SELECT window_end, window_time, tenantId AS tenant, SUM(delta) AS delta
  FROM TABLE(TUMBLE(TABLE deltas, DESCRIPTOR(event_time), INTERVAL '1' MINUTE))
  GROUP BY window_start, window_end, window_time, tenantId
)
SELECT window_end AS at_time, tenant,
  SUM(delta) OVER (PARTITION BY tenant ORDER BY window_time
                   ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS active
FROM per_minute
