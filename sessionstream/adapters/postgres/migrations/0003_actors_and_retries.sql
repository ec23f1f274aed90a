-- Who started and who cancelled a run (the command's `actor`: a user or service id, set by
-- the gateway from the caller's credentials), whether a failed run may be retried, and the
-- run a retry retries. A session's user is the first run's actor.

alter table agent_runs add column started_by text;
alter table agent_runs add column cancelled_by text;
alter table agent_runs add column retryable boolean not null default false;
alter table agent_runs add column retry_of text;
alter table agent_sessions add column user_id text;

create index agent_runs_retry_of_idx on agent_runs (retry_of) where retry_of is not null;

-- the causing command's own `ts` (epoch ms), kept as information beside the decider's `ts`
alter table agent_run_events add column producer_ts bigint;
