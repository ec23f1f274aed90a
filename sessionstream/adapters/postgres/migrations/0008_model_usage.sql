-- Model usage per run, session and tenant, summed from the `model.request.finished` events
-- (each carries what the worker knew of its request: the model, tokens in and out, time to
-- the first token, duration, cost when prices are configured). Views over the event
-- table: current as soon as the sink has written the events, nothing more to write.
create index agent_run_events_model_usage_idx on agent_run_events (run_id)
    where type = 'model.request.finished';

create view run_model_usage as
select session_id,
       run_id,
       tenant_id,
       count(*)                                                    as model_requests,
       coalesce(sum((payload ->> 'inputTokens')::bigint), 0)       as input_tokens,
       coalesce(sum((payload ->> 'outputTokens')::bigint), 0)      as output_tokens,
       sum((payload ->> 'costUsd')::numeric)                       as cost_usd,
       coalesce(sum((payload ->> 'durationMs')::bigint), 0)        as model_ms
from agent_run_events
where type = 'model.request.finished'
group by session_id, run_id, tenant_id;

create view session_model_usage as
select session_id,
       tenant_id,
       count(*)            as runs,
       sum(model_requests) as model_requests,
       sum(input_tokens)   as input_tokens,
       sum(output_tokens)  as output_tokens,
       sum(cost_usd)       as cost_usd
from run_model_usage
group by session_id, tenant_id;

create view tenant_model_usage as
select tenant_id,
       count(distinct session_id) as sessions,
       count(*)                   as runs,
       sum(model_requests)        as model_requests,
       sum(input_tokens)          as input_tokens,
       sum(output_tokens)         as output_tokens,
       sum(cost_usd)              as cost_usd
from run_model_usage
group by tenant_id;
