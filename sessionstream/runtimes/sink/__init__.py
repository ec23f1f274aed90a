"""The PostgreSQL sink: migrations, batched idempotent writes, projection, replay, audit."""
