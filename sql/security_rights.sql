-- Rights. fn runs as the caller, never as the extension's owner, so it can
-- do nothing the caller could not do directly. Keys belong to the calling
-- role (current_user): another role can neither replay, read, overwrite
-- nor plant them, through the functions or the table.
\i sql/include/setup.sql
SET client_min_messages = warning;
DROP SCHEMA IF EXISTS security_rights CASCADE;
RESET client_min_messages;
CREATE SCHEMA security_rights;
SET search_path = security_rights, public;
CREATE ROLE regress_sec_alice;
CREATE ROLE regress_sec_bob;
CREATE ROLE regress_sec_auditor BYPASSRLS;
GRANT USAGE ON SCHEMA security_rights TO PUBLIC;
GRANT CREATE ON SCHEMA security_rights TO regress_sec_bob;

CREATE TABLE orders (owner text, item text);
GRANT SELECT, INSERT ON orders TO regress_sec_alice, regress_sec_bob;
CREATE TABLE payroll (name text, salary int);
INSERT INTO payroll VALUES ('alice', 100);

-- fn has the caller's rights and no more: superuser-only functions,
-- altering roles and writing where the caller may not all fail with 42501.
-- (Changing the session's identity inside fn is covered by
-- test/tap/205_security.pl, with roles that log in.)
SET SESSION AUTHORIZATION regress_sec_alice;
SELECT idempotency.idempotent_call('sec-who', NULL, 'SELECT ARRAY[current_user, session_user]');
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('sec-payroll', NULL, 'UPDATE security_rights.payroll SET salary = 1000')$$);
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('sec-file', NULL, 'SELECT pg_read_file(''postgresql.conf'')')$$);
-- (The SQLSTATE alone: the message differs between PostgreSQL majors.)
SELECT left(sqlstate_of($$SELECT idempotency.idempotent_call('sec-alter', NULL, 'ALTER ROLE regress_sec_alice SUPERUSER')$$), 5) AS sqlstate;
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('sec-create', NULL, 'CREATE TABLE idempotency.planted (x int)')$$);
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('sec-create', NULL, 'CREATE FUNCTION idempotency.current_scope(x int) RETURNS regrole LANGUAGE sql AS ''SELECT 10::regrole''')$$);
SELECT current_user;
RESET SESSION AUTHORIZATION;
SELECT count(*) AS stored FROM idempotency.keys WHERE scope::text = 'regress_sec_alice' AND key <> 'sec-who';
SELECT salary FROM payroll;

-- Alice's keys; nobody else ever uses sec-alice-only before bob below.
SET SESSION AUTHORIZATION regress_sec_alice;
SELECT idempotency.idempotent_call('sec-order', NULL, 'INSERT INTO security_rights.orders VALUES (current_user, ''book'') RETURNING owner');
SELECT idempotency.idempotent_call('sec-alice-only', NULL, 'SELECT ''alice''''s answer''::text');
RESET SESSION AUTHORIZATION;

SET SESSION AUTHORIZATION regress_sec_bob;
-- Bob cannot replay it: the same key and request run fn again, as bob.
SELECT idempotency.idempotent_call('sec-order', NULL, 'INSERT INTO security_rights.orders VALUES (current_user, ''book'') RETURNING owner'),
       idempotency.last_call_replayed();
-- Nor learn that a key exists: a different request under a key text only
-- alice holds, sent before bob ever used that key, runs bob's fn (no IK422,
-- no replay of alice's response).
SELECT idempotency.idempotent_call('sec-alice-only', NULL, 'SELECT current_user::text') AS response,
       idempotency.last_call_replayed() AS replayed;
-- Nor read it, by query, by COPY or through the planner's statistics.
SELECT scope, key FROM idempotency.keys ORDER BY key;
COPY (SELECT key FROM idempotency.keys WHERE key LIKE 'sec-%' ORDER BY key) TO STDOUT;
RESET SESSION AUTHORIZATION;
ANALYZE idempotency.keys;
SET SESSION AUTHORIZATION regress_sec_bob;
SELECT count(*) AS visible_statistics FROM pg_stats WHERE schemaname = 'idempotency' AND tablename = 'keys';
-- Nor overwrite, delete or plant a key in anyone's scope through the table.
SELECT sqlstate_of($$UPDATE idempotency.keys SET response = '"bob"' WHERE key = 'sec-order'$$);
SELECT sqlstate_of($$DELETE FROM idempotency.keys WHERE key = 'sec-order'$$);
SELECT sqlstate_of($$INSERT INTO idempotency.keys VALUES ('regress_sec_alice', 'sec-planted', 'h', '"bob"', now(), now() + interval '1 day')$$);
SELECT sqlstate_of($$ALTER TABLE idempotency.keys DISABLE ROW LEVEL SECURITY$$);
SELECT sqlstate_of($$DROP POLICY keys_own_scope ON idempotency.keys$$);
-- Nor through the functions, by taking alice's identity.
SELECT sqlstate_of($$SET ROLE regress_sec_alice$$);
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('sec-planted', NULL, 'SET ROLE regress_sec_alice')$$);
-- A SECURITY DEFINER function bob owns calls in bob's scope, whoever runs
-- it: current_user inside it is bob.
CREATE FUNCTION bob_calls(key text) RETURNS jsonb LANGUAGE sql SECURITY DEFINER
  AS $$ SELECT idempotency.idempotent_call(key, NULL, 'SELECT ''planted by bob''::text') $$;
RESET SESSION AUTHORIZATION;
SET SESSION AUTHORIZATION regress_sec_alice;
SELECT security_rights.bob_calls('sec-planted');
-- ... so alice's own call with that key still runs fn, and her original key
-- still replays her own response.
SELECT idempotency.idempotent_call('sec-planted', NULL, 'SELECT ''alice''::text'), idempotency.last_call_replayed();
SELECT idempotency.idempotent_call('sec-order', NULL, 'INSERT INTO security_rights.orders VALUES (current_user, ''book'') RETURNING owner'),
       idempotency.last_call_replayed();
SELECT key, response FROM idempotency.keys ORDER BY key;
RESET SESSION AUTHORIZATION;

-- A replay does not run fn, so it needs none of fn's privileges: revoking
-- alice's INSERT on orders leaves her stored response replayable, while a
-- new key now fails.
REVOKE INSERT ON orders FROM regress_sec_alice;
SET SESSION AUTHORIZATION regress_sec_alice;
SELECT idempotency.idempotent_call('sec-order', NULL, 'INSERT INTO security_rights.orders VALUES (current_user, ''book'') RETURNING owner'),
       idempotency.last_call_replayed();
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('sec-order-3', NULL, 'INSERT INTO security_rights.orders VALUES (current_user, ''book'') RETURNING owner')$$);
RESET SESSION AUTHORIZATION;

-- Who sees what: each role its own keys; a BYPASSRLS role and superusers
-- all of them.
SELECT scope, key FROM idempotency.keys WHERE key LIKE 'sec-%' ORDER BY key, scope::text;
SET SESSION AUTHORIZATION regress_sec_auditor;
SELECT scope, key FROM idempotency.keys WHERE key LIKE 'sec-%' ORDER BY key, scope::text;
RESET SESSION AUTHORIZATION;
SELECT owner, item FROM orders ORDER BY owner;

DELETE FROM idempotency.keys WHERE key LIKE 'sec-%';
SET client_min_messages = warning;
DROP SCHEMA security_rights CASCADE;
RESET client_min_messages;
-- A role that has keys is dropped after DROP OWNED BY, which deletes them.
DROP OWNED BY regress_sec_alice, regress_sec_bob;
DROP ROLE regress_sec_alice;
DROP ROLE regress_sec_bob;
DROP ROLE regress_sec_auditor;
RESET search_path;
