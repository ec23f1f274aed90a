"""PostgreSQL: the schema's migrations (shared by the sink, the workers and the gateway)."""
