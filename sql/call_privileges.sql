-- Keys belong to the role that calls; fn runs with the caller's rights; the
-- key table is written only through the functions.
\i sql/include/setup.sql
CREATE ROLE regress_alice;
CREATE ROLE regress_bob;
CREATE TABLE secrets (v text);
INSERT INTO secrets VALUES ('top secret');
CREATE TABLE alice_data (v int);
GRANT SELECT, INSERT ON alice_data TO regress_alice;
GRANT EXECUTE ON FUNCTION sqlstate_of(text) TO PUBLIC;

-- A session that logged in as alice (SET ROLE inside fn is checked against
-- the session user).
SET SESSION AUTHORIZATION regress_alice;
SELECT idempotency.idempotent_call('shared-key', NULL, 'INSERT INTO alice_data VALUES (1) RETURNING ''alice''::text');
-- fn runs as the caller: a table alice may not read stays closed (42501)
-- even though the extension's owner could read it.
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('peek', NULL, 'SELECT v FROM secrets')$$);
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('become-bob', NULL, 'SET ROLE regress_bob')$$);
SELECT idempotency.idempotent_call('whoami', NULL, 'SELECT current_user::text');
-- Callers cannot write the key table directly.
SELECT sqlstate_of($$INSERT INTO idempotency.keys VALUES ('regress_bob', 'planted', 'h', '"evil"', now(), now() + interval '1 day')$$);
SELECT sqlstate_of($$UPDATE idempotency.keys SET response = '"evil"'$$);
SELECT sqlstate_of($$DELETE FROM idempotency.keys$$);
SELECT sqlstate_of($$TRUNCATE idempotency.keys$$);
-- and see only their own keys.
SELECT scope, key, response FROM idempotency.keys ORDER BY key;
RESET SESSION AUTHORIZATION;

SET SESSION AUTHORIZATION regress_bob;
-- The same key text from another role is another key: bob's call runs.
SELECT idempotency.idempotent_call('shared-key', NULL, 'SELECT ''bob''::text'), idempotency.last_call_replayed();
SELECT scope, key, response FROM idempotency.keys ORDER BY key;
RESET SESSION AUTHORIZATION;

SELECT scope, key, response FROM idempotency.keys WHERE key = 'shared-key' ORDER BY scope::text;
SELECT * FROM alice_data;

-- idempotent_call runs with the caller's rights, and is not strict so that
-- a NULL key is an error rather than a silent NULL.
SELECT p.oid::regprocedure AS function, p.prosecdef AS security_definer, p.proisstrict AS strict
  FROM pg_proc AS p
 WHERE p.pronamespace = 'idempotency'::regnamespace AND p.proname = 'idempotent_call'
 ORDER BY p.pronargs;

DELETE FROM idempotency.keys WHERE scope::text IN ('regress_alice', 'regress_bob');
DROP TABLE alice_data, secrets;
-- A role that has keys is dropped after DROP OWNED BY, which deletes them.
DROP OWNED BY regress_alice, regress_bob;
DROP ROLE regress_alice;
DROP ROLE regress_bob;
