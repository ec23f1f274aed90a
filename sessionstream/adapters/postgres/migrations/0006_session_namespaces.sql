-- Session ids are namespaced by tenant from this version on (sessionstream/schemas/sessions.py): the
-- gateway names tenant T's session S `T:S`, so two tenants may both have a session S.
-- Sessions that exist already keep their ids: their state lives in Kafka under the old key
-- and their events carry it. Each one gets an alias here, so the gateway still finds it at
-- the URL it had (T's S -> S) instead of starting `T:S` beside it. Only this migration
-- writes aliases: sessions created later are namespaced, or (an SDK producer's unscoped
-- id) reached by their full id through Kafka and the CLI.

create table session_aliases (
    tenant_id  text not null,
    local_id   text not null,          -- the id the tenant uses in gateway URLs
    session_id text not null,          -- the full id in Kafka and the other tables
    primary key (tenant_id, local_id)
);
create index session_aliases_session_idx on session_aliases (session_id);

insert into session_aliases (tenant_id, local_id, session_id)
select tenant_id, session_id, session_id from agent_sessions
on conflict do nothing;
