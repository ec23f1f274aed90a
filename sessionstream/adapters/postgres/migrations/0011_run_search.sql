-- Run search (GET /v1/runs, the filters of GET /v1/sessions, `sessionstream runs list`):
-- the queries are `sessionstream/runtimes/sink/search.py`, newest first by creation, a
-- keyset page at a time. Each filter shape has an index that yields its rows in that
-- order, so a page costs about the same at any depth and any table size
-- (bench/results/run-search.md). It needs nothing after 0009.
--
-- The order matters on a big table (the file is one transaction, and a lock taken is held
-- to its end): the B-tree indexes first, each under a SHARE lock (the sink's writes wait,
-- reads go on); the new column last, whose ACCESS EXCLUSIVE lock then covers only the
-- labels index. `if not exists`: an operator may build the indexes beforehand with
-- `create index concurrently` (same names, docs/operations.md), and this file skips them.

-- runs of a tenant; by status; by who started them
create index if not exists agent_runs_search_idx
    on agent_runs (tenant_id, created_at desc, run_id desc);
create index if not exists agent_runs_search_status_idx
    on agent_runs (tenant_id, status, created_at desc, run_id desc);
create index if not exists agent_runs_search_actor_idx
    on agent_runs (tenant_id, started_by, created_at desc, run_id desc);

-- sessions of a tenant; by user (the first run's actor); those with an active run (the
-- few a status filter other than idle looks for, out of every session)
create index if not exists agent_sessions_search_idx
    on agent_sessions (tenant_id, created_at desc, session_id desc);
create index if not exists agent_sessions_search_user_idx
    on agent_sessions (tenant_id, user_id, created_at desc, session_id desc);
create index if not exists agent_sessions_search_active_idx
    on agent_sessions (tenant_id, created_at desc, session_id desc)
    where active_run_id is not null;

-- A run's labels (bounded key/value pairs of the prompt that started it), a JSON object
-- of strings. Null until the projection writes them; `label=key:value` matches a run
-- whose labels contain the pair (`@>`). The check is `not valid` only so that adding it
-- does not read the table: every existing row is null, which it allows, and new writes
-- are checked.
alter table agent_runs add column labels jsonb;
alter table agent_runs add constraint agent_runs_labels_object
    check (jsonb_typeof(labels) = 'object') not valid;
-- containment only (jsonb_path_ops: smaller than the default opclass); runs without
-- labels are not in it
create index if not exists agent_runs_labels_idx
    on agent_runs using gin (labels jsonb_path_ops) where labels is not null;
