#!/bin/sh
# The service's database role, made once by the postgres image's superuser when its data volume is empty
# (docker-compose.yml mounts this file into /docker-entrypoint-initdb.d/). The role may log in and owns its one
# database (the API migrates it), and nothing more: no superuser (so no COPY ... TO PROGRAM, no file access on the
# database host), no creating roles or databases, no replication, no bypassing row security. The superuser's
# password stays with the postgres service; the API gets ULAB_DB_USER's.
set -eu
psql -v ON_ERROR_STOP=1 --no-psqlrc --username "$POSTGRES_USER" --dbname "${POSTGRES_DB:-postgres}" \
  -v role="$ULAB_DB_USER" -v password="$ULAB_DB_PASSWORD" -v database="$ULAB_DB_NAME" <<'SQL'
CREATE ROLE :"role" LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS
  PASSWORD :'password';
CREATE DATABASE :"database" OWNER :"role";
REVOKE ALL ON DATABASE :"database" FROM PUBLIC;
GRANT CONNECT, TEMPORARY ON DATABASE :"database" TO :"role";
SQL
