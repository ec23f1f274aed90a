-- Cancel latency (run.finished ts - the last run.cancel_requested ts, ms) of the runs
-- that ended `cancelled`, per tenant: count and continuous percentiles.
SELECT
  f.tenantId AS tenant,
  COUNT(*) AS n,
  PERCENTILE(f.ts - c.requested, 0.5) AS p50,
  PERCENTILE(f.ts - c.requested, 0.95) AS p95,
  PERCENTILE(f.ts - c.requested, 0.99) AS p99
FROM session_events AS f
JOIN (
  SELECT sessionId, runId, MAX(ts) AS requested
  FROM session_events
  WHERE type = 'run.cancel_requested' AND runId <> '_session'
  GROUP BY sessionId, runId
) AS c
  ON c.sessionId = f.sessionId AND c.runId = f.runId
WHERE f.type = 'run.finished' AND f.payload.terminalStatus = 'cancelled'
GROUP BY f.tenantId
