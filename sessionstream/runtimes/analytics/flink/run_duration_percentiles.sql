-- Run duration (run.finished ts - run.started ts, ms) per tenant: count and the
-- continuous percentiles (linear interpolation, PostgreSQL's percentile_cont).
SELECT
  s.tenantId AS tenant,
  COUNT(*) AS n,
  PERCENTILE(f.ts - s.ts, 0.5) AS p50,
  PERCENTILE(f.ts - s.ts, 0.95) AS p95,
  PERCENTILE(f.ts - s.ts, 0.99) AS p99
FROM session_events AS s
JOIN session_events AS f
  ON f.sessionId = s.sessionId AND f.runId = s.runId
WHERE s.type = 'run.started' AND f.type = 'run.finished' AND s.runId <> '_session'
GROUP BY s.tenantId
