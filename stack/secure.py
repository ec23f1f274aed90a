"""The secured local stack's credentials, users, ACLs and database roles (`stack/stack.sh`).

Run as ``python -m stack.secure COMMAND ...``; DIR is the profile's
credentials directory. stack.sh calls:

    prepare DIR --bootstrap B --database-url URL --jaas FILE
        before the broker starts: write DIR/<role>.env (keeping the passwords of an earlier
        run) and the broker's jaas.conf; print the `kafka-storage format --add-scram`
        arguments of the broker and admin users (salted: no password on a command line)
    apply DIR [--pg-socket S --pg-port P --database NAME]
        once the broker answers, as admin: the roles' SCRAM users, then exactly their ACLs;
        with --pg-socket, as the PostgreSQL superuser (trusted on our cluster's private
        socket): the roles and the database, then as its owner: migrate, then exactly the
        roles' table privileges
    drop --pg-socket S --pg-port P --database NAME      (stack.sh reset)

Passwords are random (`secrets.token_urlsafe`), stored only in the 0600 files of DIR, and
handed to Kafka and PostgreSQL as salted verifiers where the protocol allows it.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import hmac
import os
import secrets
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from confluent_kafka.admin import AclBinding

from sessionstream.adapters.access import KAFKA_ROLES, PG_ROLES, Grant, db_grants, kafka_grants
from sessionstream.settings import Settings, read_credentials_file

__all__ = ["main", "pg_scram_verifier", "salted_kafka_scram"]

BROKER = "broker"
ADMIN = "admin"
#: every credentials file DIR holds; `broker` is the node's own user (a super user)
FILES = (BROKER, ADMIN, *KAFKA_ROLES)
SCRAM_ITERATIONS = 4096  # Kafka's minimum for SCRAM-SHA-512; PostgreSQL's default
PG_OWNER = PG_ROLES[ADMIN]
PG_READER = PG_ROLES["analytics"]


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def salted_kafka_scram(user: str, password: str, salt: bytes | None = None) -> str:
    """An ``--add-scram`` value for SCRAM-SHA-512 that carries the salted password only."""
    salt = salt or secrets.token_bytes(16)
    salted = hashlib.pbkdf2_hmac("sha512", password.encode(), salt, SCRAM_ITERATIONS)
    return (
        f"SCRAM-SHA-512=[name={user},iterations={SCRAM_ITERATIONS},"
        f'salt="{_b64(salt)}",saltedpassword="{_b64(salted)}"]'
    )


def pg_scram_verifier(password: str, salt: bytes | None = None) -> str:
    """PostgreSQL's stored form of a SCRAM-SHA-256 password (what `\\password` sends)."""
    salt = salt or secrets.token_bytes(16)
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, SCRAM_ITERATIONS)
    client_key = hmac.digest(salted, b"Client Key", "sha256")
    stored_key = hashlib.sha256(client_key).digest()
    server_key = hmac.digest(salted, b"Server Key", "sha256")
    return f"SCRAM-SHA-256${SCRAM_ITERATIONS}:{_b64(salt)}${_b64(stored_key)}:{_b64(server_key)}"


# ------------------------------------------------------------------------- credentials
def _write_private(path: Path, text: str) -> None:
    """Write `text` to `path`, readable by its owner only, replacing it atomically."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _passwords(path: Path) -> tuple[str, str]:
    """(Kafka, database) passwords of an existing file, new random ones otherwise."""
    old = read_credentials_file(path) if path.is_file() else {}
    return (
        old.get("kafka_password") or secrets.token_urlsafe(24),
        old.get("database_password") or secrets.token_urlsafe(24),
    )


def _database_url(base: str, pg_role: str) -> str:
    parts = urlsplit(base)
    host = parts.hostname or "127.0.0.1"
    return f"postgresql://{pg_role}@{host}:{parts.port or 5432}{parts.path}"


#: the one user of the secured registry (every role reads and writes schemas)
REGISTRY_USER = "sessionstream"


def registry_password(directory: Path) -> str:
    """The secured registry's password: generated at the first `up`, kept after."""
    path = directory / "registry.secret"
    if path.is_file():
        return path.read_text().strip()
    password = secrets.token_urlsafe(24)
    _write_private(path, password + "\n")
    return password


def write_registry_config(directory: Path, registry_dir: Path) -> None:
    """The secured registry's `config/application.properties` (Quarkus reads it from the
    process's working directory): HTTP basic authentication on every path, one user."""
    conf = registry_dir / "config"
    conf.mkdir(parents=True, exist_ok=True)
    conf.chmod(0o700)
    password = registry_password(directory)
    _write_private(
        conf / "application.properties",
        "\n".join(
            [
                "# the secured local stack's schema registry (written by stack/stack.sh)",
                "quarkus.http.auth.basic=true",
                "quarkus.security.users.embedded.enabled=true",
                "quarkus.security.users.embedded.plain-text=true",
                f"quarkus.security.users.embedded.users.{REGISTRY_USER}={password}",
                f"quarkus.security.users.embedded.roles.{REGISTRY_USER}=sr-admin",
                "quarkus.http.auth.permission.all.paths=/*",
                "quarkus.http.auth.permission.all.policy=authenticated",
            ]
        )
        + "\n",
    )


def write_credentials(
    directory: Path, bootstrap: str, database_url: str, registry_url: str | None = None
) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)
    for role in FILES:
        path = directory / f"{role}.env"
        kafka_pw, db_pw = _passwords(path)
        lines = [
            f"# sessionstream secured local stack: role `{role}` (written by stack/stack.sh;",
            "# the passwords were generated at the first `up` and survive later ones).",
            f"# Use: SESSIONSTREAM_CREDENTIALS_FILE={path} sessionstream ...",
            "#  or: set -a; . <this file>; set +a",
            f"SESSIONSTREAM_KAFKA_BOOTSTRAP={bootstrap}",
            "SESSIONSTREAM_KAFKA_SECURITY_PROTOCOL=SASL_PLAINTEXT",
            "SESSIONSTREAM_KAFKA_SASL_MECHANISM=SCRAM-SHA-512",
            f"SESSIONSTREAM_KAFKA_USERNAME={role}",
            f"SESSIONSTREAM_KAFKA_PASSWORD={kafka_pw}",
        ]
        pg_role = PG_ROLES.get(role)
        if pg_role is not None:
            lines += [
                f"SESSIONSTREAM_DATABASE_URL={_database_url(database_url, pg_role)}",
                f"SESSIONSTREAM_DATABASE_PASSWORD={db_pw}",
            ]
        if registry_url:
            lines += [
                f"SESSIONSTREAM_SCHEMA_REGISTRY_URL={registry_url}",
                f"SESSIONSTREAM_SCHEMA_REGISTRY_USERNAME={REGISTRY_USER}",
                f"SESSIONSTREAM_SCHEMA_REGISTRY_PASSWORD={registry_password(directory)}",
            ]
        _write_private(path, "\n".join(lines) + "\n")


def role_settings(directory: Path, role: str) -> Settings:
    """The settings a process of `role` gets from its file (arguments beat the env)."""
    values = read_credentials_file(directory / f"{role}.env")
    return Settings(credentials_file=directory / f"{role}.env", **values)  # type: ignore[arg-type]


def write_jaas(directory: Path, jaas: Path) -> None:
    """The broker's login: SCRAM on the client listener, PLAIN (static) on the controller's."""
    pw = role_settings(directory, BROKER).kafka_password
    assert pw is not None
    secret = pw.get_secret_value()
    _write_private(
        jaas,
        "// written by stack/stack.sh: the node's own user on each listener\n"
        "client.KafkaServer {\n"
        "  org.apache.kafka.common.security.scram.ScramLoginModule required\n"
        f'  username="{BROKER}" password="{secret}";\n'
        "};\n"
        "controller.KafkaServer {\n"
        "  org.apache.kafka.common.security.plain.PlainLoginModule required\n"
        f'  username="{BROKER}" password="{secret}" user_{BROKER}="{secret}";\n'
        "};\n",
    )


def prepare(
    directory: Path, bootstrap: str, database_url: str, jaas: Path, registry_url: str | None = None
) -> None:
    write_credentials(directory, bootstrap, database_url, registry_url)
    write_jaas(directory, jaas)
    for user in (BROKER, ADMIN):
        pw = role_settings(directory, user).kafka_password
        assert pw is not None
        print(salted_kafka_scram(user, pw.get_secret_value()))


# ------------------------------------------------------------------------------- Kafka
def _bindings(grants: Iterable[Grant]) -> list[AclBinding]:
    from confluent_kafka.admin import (
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    types = {
        "topic": ResourceType.TOPIC,
        "group": ResourceType.GROUP,
        "transactional_id": ResourceType.TRANSACTIONAL_ID,
    }
    patterns = {"literal": ResourcePatternType.LITERAL, "prefixed": ResourcePatternType.PREFIXED}
    return [
        AclBinding(
            types[g.resource],
            g.name,
            patterns[g.pattern],
            g.principal,
            "*",
            AclOperation[g.operation],
            AclPermissionType.ALLOW,
        )
        for g in grants
    ]


def kafka_apply(directory: Path, timeout: float = 30.0) -> str:
    """As admin: upsert the roles' SCRAM users, then make their ACLs exactly the spec."""
    from confluent_kafka.admin import (
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
        AdminClient,
        ResourcePatternType,
        ResourceType,
        ScramCredentialInfo,
        ScramMechanism,
        UserScramCredentialAlteration,
        UserScramCredentialUpsertion,
    )

    from sessionstream.adapters.kafka import client_config

    admin_settings = role_settings(directory, ADMIN)
    admin = AdminClient(client_config(admin_settings))
    # Step 1: one SCRAM user per role; the password in its file is the truth
    upserts: list[UserScramCredentialAlteration] = []
    for role in KAFKA_ROLES:
        pw = role_settings(directory, role).kafka_password
        assert pw is not None
        info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, SCRAM_ITERATIONS)
        upserts.append(UserScramCredentialUpsertion(role, info, pw.get_secret_value().encode()))
    for fut in admin.alter_user_scram_credentials(upserts, request_timeout=timeout).values():
        fut.result()
    # Step 2: the ACLs of our principals: add what is missing, remove what the spec lacks
    spec = kafka_grants(admin_settings)
    want = {b for role in KAFKA_ROLES for b in _bindings(spec[role])}
    have: set[AclBinding] = set()
    for role in KAFKA_ROLES:
        flt = AclBindingFilter(
            ResourceType.ANY,
            None,  # type: ignore[arg-type]  # None matches any name (documented)
            ResourcePatternType.ANY,
            f"User:{role}",
            None,  # type: ignore[arg-type]
            AclOperation.ANY,
            AclPermissionType.ANY,
        )
        have.update(admin.describe_acls(flt, request_timeout=timeout).result())
    missing, extra = list(want - have), list(have - want)
    if missing:
        for fut in admin.create_acls(missing, request_timeout=timeout).values():
            fut.result()
    if extra:
        exact = [
            AclBindingFilter(
                b.restype,
                b.name,
                b.resource_pattern_type,
                b.principal,
                b.host,
                b.operation,
                b.permission_type,
            )
            for b in extra
        ]
        for fut in admin.delete_acls(exact, request_timeout=timeout).values():
            fut.result()
    # Step 3: every role can log in (its user may take a moment to reach the listener)
    for role in KAFKA_ROLES:
        _wait_login(role_settings(directory, role), timeout)
    return (
        f"{len(KAFKA_ROLES)} SCRAM users, {len(want)} ACLs "
        f"({len(missing)} added, {len(extra)} removed)"
    )


def _wait_login(settings: Settings, timeout: float) -> None:
    import logging
    import time

    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    from sessionstream.adapters.kafka import client_config

    quiet = logging.getLogger("sessionstream.secure_stack.librdkafka")
    quiet.addHandler(logging.NullHandler())
    quiet.propagate = False
    deadline = time.monotonic() + timeout
    while True:
        client = AdminClient(client_config(settings, logger=quiet))
        try:
            client.list_topics(timeout=5)
            return
        except KafkaException as e:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{settings.kafka_username} cannot log in: {e}") from e
            time.sleep(0.2)


# -------------------------------------------------------------------------- PostgreSQL
def _superuser(socket_dir: str, port: int, dbname: str = "postgres") -> Any:
    import psycopg

    return psycopg.connect(
        host=socket_dir, port=port, user="postgres", dbname=dbname, autocommit=True
    )


def pg_roles_and_database(directory: Path, socket_dir: str, port: int, database: str) -> None:
    """As the superuser: the roles (passwords sent as verifiers) and the database."""
    from psycopg import sql

    others = [r for r in PG_ROLES.values() if r != PG_OWNER]
    with _superuser(socket_dir, port) as conn:
        for role, pg_role in PG_ROLES.items():
            pw = role_settings(directory, role).database_password
            assert pw is not None
            ident = sql.Identifier(pg_role)
            if conn.execute("select 1 from pg_roles where rolname = %s", (pg_role,)).fetchone():
                pass
            else:
                conn.execute(sql.SQL("create role {}").format(ident))
            conn.execute(
                sql.SQL(
                    "alter role {} login nosuperuser nocreatedb nocreaterole password {}"
                ).format(ident, sql.Literal(pg_scram_verifier(pw.get_secret_value())))
            )
        db = sql.Identifier(database)
        if not conn.execute("select 1 from pg_database where datname = %s", (database,)).fetchone():
            conn.execute(
                sql.SQL("create database {} owner {}").format(db, sql.Identifier(PG_OWNER))
            )
        # only these roles may connect (not even the dev stack's `sessionstream`)
        conn.execute(sql.SQL("revoke all on database {} from public").format(db))
        conn.execute(
            sql.SQL("grant connect on database {} to {}").format(
                db, sql.SQL(", ").join(sql.Identifier(r) for r in others)
            )
        )
        # the sink stages COPY batches in a temporary table
        conn.execute(
            sql.SQL("grant temporary on database {} to {}").format(
                db, sql.Identifier(PG_ROLES["sink"])
            )
        )


def pg_drop(socket_dir: str, port: int, database: str) -> None:
    from psycopg import sql

    with _superuser(socket_dir, port) as conn:
        conn.execute(
            sql.SQL("drop database if exists {} with (force)").format(sql.Identifier(database))
        )
        for pg_role in PG_ROLES.values():
            conn.execute(sql.SQL("drop role if exists {}").format(sql.Identifier(pg_role)))


def pg_apply(directory: Path) -> str:
    """As the owner: apply the migrations, then set exactly the roles' table privileges."""
    import psycopg
    from psycopg import sql

    from sessionstream.adapters.postgres.migrate import migrate

    owner = role_settings(directory, ADMIN)
    # Step 1: the tables exist before anything is granted on them
    applied = migrate(owner.database_conninfo)
    limited = sorted({g.role for g in db_grants()})
    with psycopg.connect(owner.database_conninfo, autocommit=False) as conn:
        tables = {
            row[0]
            for row in conn.execute(
                "select tablename from pg_tables where schemaname = current_schema()"
            )
        }
        # Step 2: start from nothing (so a privilege removed from the spec goes away)
        for role in limited:
            conn.execute(
                sql.SQL("revoke all on all tables in schema public from {}").format(
                    sql.Identifier(role)
                )
            )
            conn.execute(
                sql.SQL("revoke all on all sequences in schema public from {}").format(
                    sql.Identifier(role)
                )
            )
        # Step 3: the spec, on the tables that exist; their serial columns' sequences
        granted = 0
        for g in db_grants():
            if g.table not in tables:
                continue
            conn.execute(
                sql.SQL("grant {} on table {} to {}").format(
                    sql.SQL(", ").join(sql.SQL(p) for p in g.privileges),
                    sql.Identifier(g.table),
                    sql.Identifier(g.role),
                )
            )
            granted += 1
            if "INSERT" in g.privileges:
                for (seq,) in conn.execute(
                    "select s.relname from pg_class s join pg_depend d on d.objid = s.oid"
                    " join pg_class t on d.refobjid = t.oid"
                    " where s.relkind = 'S' and t.relname = %s and d.deptype in ('a', 'i')",
                    (g.table,),
                ).fetchall():
                    conn.execute(
                        sql.SQL("grant usage on sequence {} to {}").format(
                            sql.Identifier(seq), sql.Identifier(g.role)
                        )
                    )
        # Step 4: readers read every table, also the ones later migrations create
        reader = sql.Identifier(PG_READER)
        conn.execute(sql.SQL("grant select on all tables in schema public to {}").format(reader))
        conn.execute(
            sql.SQL(
                "alter default privileges for role {} in schema public grant select on tables to {}"
            ).format(sql.Identifier(PG_OWNER), reader)
        )
        conn.commit()
    return f"{len(applied)} migrations applied, {granted} table grants, {PG_READER} reads all"


# --------------------------------------------------------------------------------- CLI
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stack.secure")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("dir", type=Path)
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--database-url", required=True)
    p.add_argument("--jaas", type=Path, required=True)
    p.add_argument("--registry-url", default=None)
    reg = sub.add_parser("registry-config")
    reg.add_argument("dir", type=Path)
    reg.add_argument("registry_dir", type=Path)
    apply = sub.add_parser("apply")
    apply.add_argument("dir", type=Path)
    drop = sub.add_parser("drop")
    for q in (apply, drop):
        q.add_argument("--pg-socket", default=None)
        q.add_argument("--pg-port", type=int, default=5432)
        q.add_argument("--database", default="sessionstream_secure")
    args = parser.parse_args(argv)
    if args.cmd == "prepare":
        prepare(args.dir, args.bootstrap, args.database_url, args.jaas, args.registry_url)
    elif args.cmd == "registry-config":
        write_registry_config(args.dir, args.registry_dir)
    elif args.cmd == "apply":
        print(f"kafka-secure: {kafka_apply(args.dir)}", flush=True)
        if args.pg_socket:
            pg_roles_and_database(args.dir, args.pg_socket, args.pg_port, args.database)
            print(
                f"postgres-secure: database {args.database}, roles "
                f"{' '.join(PG_ROLES.values())} ({pg_apply(args.dir)})"
            )
    else:
        pg_drop(args.pg_socket, args.pg_port, args.database)
        print(
            f"postgres-secure: dropped database {args.database} and roles "
            f"{' '.join(PG_ROLES.values())}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
