-- The schema Kafka Connect's JDBC sink writes the run stream into (docs/analytics.md:
-- `sessionstream connect deploy` lands session.events in analytics.run_events). The sink
-- creates and widens its tables itself; the schema must exist first.
create schema if not exists analytics;
