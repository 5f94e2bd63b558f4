-- idempotency.role_scope: a key's role is an OID inside the cluster and a
-- role name in text and binary I/O, so it maps to the role of the same name
-- wherever the key is copied, and a rename keeps the role's keys.
\i sql/include/setup.sql
CREATE ROLE regress_rs_alice;
CREATE ROLE "Regress_RS Bob";

SELECT pg_catalog.format_type(atttypid, atttypmod) AS scope_type
  FROM pg_attribute
 WHERE attrelid = 'idempotency.keys'::regclass AND attname = 'scope';

-- Text: a role name as an identifier, quoted where needed, as regrole
-- writes it; the value is the role's OID.
SELECT 'regress_rs_alice'::idempotency.role_scope AS alice,
       '"Regress_RS Bob"'::idempotency.role_scope AS bob,
       'REGRESS_RS_ALICE'::idempotency.role_scope::regrole = 'regress_rs_alice'::regrole AS folded,
       '"Regress_RS Bob"'::idempotency.role_scope::regrole = '"Regress_RS Bob"'::regrole AS same_oid;
-- A role that does not exist here is an error (42704). An OID is not a
-- role name: it would name another role, or none, on another node. A
-- number is how regrole (the scope of 0.1 and 0.2) writes a role that no
-- longer exists, in their dumps too: it reads as no role ("-").
SELECT sqlstate_of($$SELECT 'regress_rs_nobody'::idempotency.role_scope$$);
SELECT '10'::idempotency.role_scope AS bootstrap_superuser_oid,
       '10'::idempotency.role_scope::regrole::oid AS read_as_oid;
SELECT sqlstate_of($$SELECT 'a.b'::idempotency.role_scope$$);
-- No role: "-", read as OID 0, never a caller's scope. A role that no longer
-- exists is written "-" too, not as its OID.
SELECT '-'::idempotency.role_scope AS no_role,
       '-'::idempotency.role_scope::regrole::oid AS no_role_oid,
       '4000000000'::oid::regrole::idempotency.role_scope AS dropped_role;

-- Binary: the same name, not the OID.
SELECT convert_from(idempotency.role_scope_send('"Regress_RS Bob"'), 'UTF8') AS bob_sent,
       convert_from(idempotency.role_scope_send('4000000000'::oid::regrole::idempotency.role_scope), 'UTF8') AS dropped_sent;

-- Comparisons are the OIDs': the operators live in schema idempotency.
SELECT 'regress_rs_alice'::idempotency.role_scope OPERATOR(idempotency.=) 'REGRESS_RS_ALICE' AS eq,
       'regress_rs_alice'::idempotency.role_scope OPERATOR(idempotency.<>) '"Regress_RS Bob"' AS ne,
       ('regress_rs_alice'::idempotency.role_scope OPERATOR(idempotency.<) '"Regress_RS Bob"')
         = ('regress_rs_alice'::regrole::oid < '"Regress_RS Bob"'::regrole::oid) AS lt_as_oid;

-- Keys: each role replays its own and sees only its own.
CREATE TABLE rs_runs (who text);
GRANT INSERT, SELECT ON rs_runs TO PUBLIC;
SET ROLE regress_rs_alice;
SELECT idempotency.idempotent_call('rs-key', NULL, 'INSERT INTO rs_runs VALUES (current_user) RETURNING who'),
       idempotency.last_call_replayed();
RESET ROLE;
SET ROLE "Regress_RS Bob";
SELECT idempotency.idempotent_call('rs-key', NULL, 'INSERT INTO rs_runs VALUES (current_user) RETURNING who'),
       idempotency.last_call_replayed();
SELECT scope, key, response FROM idempotency.keys WHERE key = 'rs-key';
RESET ROLE;
SET ROLE regress_rs_alice;
SELECT scope, key, response FROM idempotency.keys WHERE key = 'rs-key';
RESET ROLE;

-- A rename keeps the role's keys: the renamed role replays, under its new name.
ALTER ROLE regress_rs_alice RENAME TO regress_rs_alicia;
SET ROLE regress_rs_alicia;
SELECT idempotency.idempotent_call('rs-key', NULL, 'INSERT INTO rs_runs VALUES (current_user) RETURNING who'),
       idempotency.last_call_replayed();
RESET ROLE;
SELECT scope, key, response FROM idempotency.keys WHERE key = 'rs-key' ORDER BY scope::text;
SELECT who, count(*) FROM rs_runs GROUP BY who ORDER BY who;

-- A lookup by scope and key digest is a scan of the primary key, as it was
-- with the regrole column.
SET enable_seqscan = off;
EXPLAIN (COSTS OFF)
SELECT response FROM idempotency.keys
 WHERE scope OPERATOR(idempotency.=) idempotency.current_scope()
   AND key_digest = idempotency.key_digest('rs-key');
RESET enable_seqscan;

DELETE FROM idempotency.keys WHERE key = 'rs-key';
DROP TABLE rs_runs;
-- A role that has keys is dropped after DROP OWNED BY, which deletes them.
DROP OWNED BY regress_rs_alicia, "Regress_RS Bob";
DROP ROLE regress_rs_alicia;
DROP ROLE "Regress_RS Bob";
