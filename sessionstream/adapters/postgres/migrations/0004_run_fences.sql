-- The fencing token of external actions (sessionstream/runtimes/worker/executor.py): per run, the highest
-- lease generation that touched it here. A holder raises it when it is granted the run; an
-- action's claim raises it in its own transaction and is refused when a newer generation
-- already has: a worker that lost its lease (frozen, partitioned) never acts after the
-- next holder took over, whatever it believes.

create table agent_run_fences (
    run_id     text primary key,
    generation bigint not null,
    updated_at timestamptz not null default now()
);
