-- docker-compose.yml: the schema registry's own database, next to sessionstream's
-- (the native stack creates the same in stack/stack.sh, registry_database).
CREATE DATABASE sessionstream_registry OWNER sessionstream;
