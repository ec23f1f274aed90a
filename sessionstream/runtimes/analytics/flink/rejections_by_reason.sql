-- Rejections per tenant per minute by reason and the rejected command's type.
WITH rejected AS (
  SELECT tenantId, payload.reason AS reason, payload.commandType AS command_type, event_time
  FROM session_events
  WHERE type = 'command.rejected'
)
SELECT window_start, window_end, tenantId AS tenant, reason, command_type,
  COUNT(*) AS rejections
FROM TABLE(TUMBLE(TABLE rejected, DESCRIPTOR(event_time), INTERVAL '1' MINUTE))
GROUP BY window_start, window_end, tenantId, reason, command_type
