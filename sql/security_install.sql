-- CREATE EXTENSION refuses to install into a schema idempotency that
-- someone prepared: one owned by another role, one holding objects, or one
-- where another role may create objects. Any of these would let that role
-- put objects next to the extension's own (an overload of idempotent_call
-- that callers' calls resolve to, say). An empty schema a superuser owns
-- and nobody else may create in is accepted. Each attempt runs in a fresh
-- database.
\set regress_database :DBNAME
CREATE ROLE regress_install_mallory;

-- A schema owned by another role, holding an overload of idempotent_call.
CREATE DATABASE regress_install_owned;
\c regress_install_owned
CREATE SCHEMA idempotency AUTHORIZATION regress_install_mallory;
SET ROLE regress_install_mallory;
CREATE FUNCTION idempotency.idempotent_call(key text, request_hash text, fn text, amount integer)
  RETURNS jsonb LANGUAGE sql AS $$ SELECT '"captured"'::jsonb $$;
RESET ROLE;
-- Runs CREATE EXTENSION and reports whether it installed (one per session:
-- it lives in pg_temp).
CREATE FUNCTION pg_temp.install() RETURNS text LANGUAGE plpgsql AS $$
BEGIN
  CREATE EXTENSION idempotency;
  RETURN 'installed';
EXCEPTION WHEN OTHERS THEN
  RETURN 'refused: ' || SQLSTATE || ' ' || SQLERRM;
END $$;
SELECT pg_temp.install();
SELECT count(*) AS extensions FROM pg_extension WHERE extname = 'idempotency';
-- The same schema, empty, but still owned by that role.
DROP FUNCTION idempotency.idempotent_call(text, text, text, integer);
SELECT pg_temp.install();

-- A superuser's schema in which another role may create objects.
\c :regress_database
CREATE DATABASE regress_install_create_granted;
\c regress_install_create_granted
CREATE SCHEMA idempotency;
GRANT CREATE ON SCHEMA idempotency TO regress_install_mallory;
CREATE FUNCTION pg_temp.install() RETURNS text LANGUAGE plpgsql AS $$
BEGIN
  CREATE EXTENSION idempotency;
  RETURN 'installed';
EXCEPTION WHEN OTHERS THEN
  RETURN 'refused: ' || SQLSTATE || ' ' || SQLERRM;
END $$;
SELECT pg_temp.install();
-- ... or already holds an object another role owns.
REVOKE CREATE ON SCHEMA idempotency FROM regress_install_mallory;
CREATE TABLE idempotency.leftover (x int);
ALTER TABLE idempotency.leftover OWNER TO regress_install_mallory;
SELECT pg_temp.install();
-- ... or a table in the way of the extension's own.
DROP TABLE idempotency.leftover;
CREATE TABLE idempotency.keys (x int);
SELECT pg_temp.install();
SELECT count(*) AS extensions FROM pg_extension WHERE extname = 'idempotency';

-- An empty schema of a superuser's, nobody else allowed to create in it.
DROP TABLE idempotency.keys;
SELECT pg_temp.install();
SELECT has_schema_privilege('regress_install_mallory', 'idempotency', 'CREATE') AS others_may_create;

-- Without any schema prepared, CREATE EXTENSION creates it, owned by the
-- installing superuser, and only that superuser may create in it.
\c :regress_database
CREATE DATABASE regress_install_clean;
\c regress_install_clean
CREATE EXTENSION idempotency;
SELECT nspowner = (SELECT oid FROM pg_roles WHERE rolname = current_user) AS owned_by_installer
  FROM pg_namespace WHERE nspname = 'idempotency';
SELECT has_schema_privilege('regress_install_mallory', 'idempotency', 'CREATE') AS others_may_create,
       has_schema_privilege('regress_install_mallory', 'idempotency', 'USAGE') AS others_may_use;

\c :regress_database
DROP DATABASE regress_install_owned;
DROP DATABASE regress_install_create_granted;
DROP DATABASE regress_install_clean;
DROP ROLE regress_install_mallory;
