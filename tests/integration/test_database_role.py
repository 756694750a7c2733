"""The service's database role as docker-compose.yml makes it (scripts/postgres-init.sh, run by the superuser on the
real PostgreSQL): the API migrates its database with it, and it can neither run a program on the database host
(`COPY ... TO PROGRAM`), read the host's files, make itself a superuser, nor create roles."""
from __future__ import annotations

import subprocess
import uuid
from urllib.parse import urlsplit

import psycopg
import pytest

from tests.services import PG_ADMIN_URL, REPO, ULAB

INIT = REPO / "scripts" / "postgres-init.sh"


@pytest.fixture
def service_role():
    admin = urlsplit(PG_ADMIN_URL)
    name = f"ulab_role_{uuid.uuid4().hex[:10]}"
    env = {"PATH": "/usr/bin:/bin", "PGHOST": admin.hostname or "127.0.0.1", "PGPORT": str(admin.port or 5432),
           "POSTGRES_USER": admin.username or "postgres", "POSTGRES_DB": admin.path.lstrip("/"),
           "ULAB_DB_USER": name, "ULAB_DB_NAME": name, "ULAB_DB_PASSWORD": uuid.uuid4().hex}
    subprocess.run(["sh", str(INIT)], env=env, check=True, capture_output=True, timeout=60)
    url = f"postgresql://{name}:{env['ULAB_DB_PASSWORD']}@{env['PGHOST']}:{env['PGPORT']}/{name}"
    try:
        yield name, url
    finally:
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(f'DROP ROLE IF EXISTS "{name}"')


def refused(url: str, sql: str) -> bool:
    """Whether PostgreSQL refuses `sql` from this role for want of a privilege (SQLSTATE 42501)."""
    with psycopg.connect(url, autocommit=True) as conn, pytest.raises(psycopg.Error) as e:
        conn.execute(sql)
    return isinstance(e.value, psycopg.errors.InsufficientPrivilege)


def test_the_service_role_migrates_its_database_and_nothing_more(service_role, tmp_path):
    name, url = service_role
    r = subprocess.run([str(ULAB), "migrate"], cwd=REPO, capture_output=True, text=True, timeout=300,
                       env={"PATH": "/usr/bin:/bin", "ULAB_HOME": str(tmp_path),
                            "ULAB_DATABASE_URL": url.replace("postgresql://", "postgresql+psycopg://", 1)})
    assert r.returncode == 0, r.stderr[-2000:]
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT count(*) FROM runs").fetchone() == (0,)
        assert conn.execute("SELECT rolsuper, rolcreaterole, rolcreatedb FROM pg_roles WHERE rolname = %s",
                            (name,)).fetchone() == (False, False, False)
    assert refused(url, "COPY (SELECT 1) TO PROGRAM 'id'")
    assert refused(url, "SELECT pg_read_file('/etc/passwd')")
    assert refused(url, f'ALTER ROLE "{name}" SUPERUSER')
    assert refused(url, 'CREATE ROLE "ulab_minted" LOGIN')
    assert refused(url, "CREATE DATABASE ulab_minted")
