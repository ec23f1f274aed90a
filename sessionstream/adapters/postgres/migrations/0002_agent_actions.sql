-- External actions of run workers (sessionstream/runtimes/worker/executor.py) and the reference agent's
-- outbox. The unique idempotency key is what makes an approved action run once: the
-- executor inserts the key before (or in the same transaction as) the effect.

create table agent_actions (
    idempotency_key text primary key,
    kind            text not null,
    session_id      text not null,
    run_id          text not null,
    generation      bigint not null,      -- the generation that executed it
    worker_id       text not null,
    status          text not null check (status in ('executing', 'done', 'failed')),
    result          text,
    started_at      timestamptz not null default now(),
    finished_at     timestamptz
);
create index agent_actions_run_idx on agent_actions (run_id);

-- the reference agent's "emails": written in the same transaction as the action's key
create table agent_outbox (
    id              bigserial primary key,
    idempotency_key text not null unique references agent_actions (idempotency_key),
    session_id      text not null,
    run_id          text not null,
    recipient       text not null,
    subject         text not null,
    body            text not null,
    created_at      timestamptz not null default now()
);
create index agent_outbox_run_idx on agent_outbox (run_id);
