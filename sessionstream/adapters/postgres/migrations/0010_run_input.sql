-- A run's typed input: the prompt's `input`, any JSON value (null: the prompt had none), as
-- `run.started` carries it (its JSON text). Runs started before it have none.

alter table agent_runs add column input jsonb;
