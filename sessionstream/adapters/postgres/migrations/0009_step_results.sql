-- Durable steps' results over the log's inline bound: a worker stores such a result here
-- and records its pointer (`pg:{key}`) in the step's event; the run's next holder reads it
-- back. The key is the step's idempotency id and a digest of the result, so two holders
-- that each finished the same step (one fenced before it recorded) never overwrite each
-- other: the pointer the log holds always names the bytes it was recorded with.
create table if not exists step_results (
    key        text primary key,
    data       text not null,
    created_at timestamptz not null default now()
);
