-- Every run's current status per tenant, as the projection has it
-- (agent_runs: coalesce(terminal_status, status)): the status its last status-changing
-- event set, by seq.
SELECT tenantId AS tenant, status, COUNT(*) AS runs
FROM (
  SELECT tenantId, status,
    ROW_NUMBER() OVER (PARTITION BY sessionId, runId ORDER BY seq DESC) AS rn
  FROM (
    SELECT sessionId, runId, seq, tenantId,
      CASE type
        WHEN 'run.started' THEN 'running'
        WHEN 'run.compaction_started' THEN 'compacting'
        WHEN 'run.compaction_finished' THEN 'running'
        WHEN 'run.compaction_abandoned' THEN 'running'
        WHEN 'run.cancel_requested' THEN 'cancelling'
        ELSE payload.terminalStatus
      END AS status
    FROM session_events
    WHERE runId <> '_session' AND type IN ('run.started', 'run.compaction_started',
      'run.compaction_finished', 'run.compaction_abandoned', 'run.cancel_requested',
      'run.finished')
  )
)
WHERE rn = 1
GROUP BY tenantId, status
