-- The session's client_encoding changes neither keys nor requests: keys and
-- arguments are compared in the database encoding, so a retry from a
-- session with another client_encoding replays, and a value the client
-- encoding cannot represent is no obstacle (fn's arguments never travel to
-- the client). Every literal here is ASCII (U& escapes), so the file reads
-- the same under any client_encoding.
\i sql/include/setup.sql
\set regress_database :DBNAME
CREATE DATABASE regress_hostile_encoding TEMPLATE template0 ENCODING 'UTF8' LOCALE 'C';
\c regress_hostile_encoding
CREATE EXTENSION idempotency;
CREATE TABLE runs (label text);
CREATE FUNCTION run(label text, value text) RETURNS int LANGUAGE sql
  AS $$ INSERT INTO runs VALUES (label) RETURNING char_length(value) $$;

SET client_encoding = 'UTF8';
SELECT idempotency.idempotent_call(U&'caf\00E9', NULL, 'SELECT run($1, $2)', 'text', U&'caf\00E9');
SELECT idempotency.idempotent_call('name', NULL, 'SELECT run($1, $2::text)', 'name', U&'caf\00E9'::name);
SELECT idempotency.idempotent_call('jsonb', NULL, 'SELECT run($1, $2::text)', 'jsonb', jsonb_build_object('v', U&'caf\00E9'));
SELECT idempotency.idempotent_call('array', NULL, 'SELECT run($1, $2::text)', 'array', ARRAY[U&'caf\00E9']);
SELECT idempotency.idempotent_call('record', NULL, 'SELECT run($1, $2::text)', 'record', ROW(U&'caf\00E9'::varchar));

SET client_encoding = 'LATIN1';
SELECT idempotency.idempotent_call(U&'caf\00E9', NULL, 'SELECT run($1, $2)', 'text', U&'caf\00E9'), idempotency.last_call_replayed();
SELECT idempotency.idempotent_call('name', NULL, 'SELECT run($1, $2::text)', 'name', U&'caf\00E9'::name), idempotency.last_call_replayed();
SELECT idempotency.idempotent_call('jsonb', NULL, 'SELECT run($1, $2::text)', 'jsonb', jsonb_build_object('v', U&'caf\00E9')), idempotency.last_call_replayed();
SELECT idempotency.idempotent_call('array', NULL, 'SELECT run($1, $2::text)', 'array', ARRAY[U&'caf\00E9']), idempotency.last_call_replayed();
SELECT idempotency.idempotent_call('record', NULL, 'SELECT run($1, $2::text)', 'record', ROW(U&'caf\00E9'::varchar)), idempotency.last_call_replayed();
-- The euro sign has no LATIN1 form; the call does not need one.
SELECT idempotency.idempotent_call('euro', NULL, 'SELECT run($1, $2)', 'euro', U&'\20AC 5');
SELECT idempotency.idempotent_call('euro', NULL, 'SELECT run($1, $2)', 'euro', U&'\20AC 5'), idempotency.last_call_replayed();
-- Errors show the key in their message. What the client encoding cannot
-- represent is escaped there (as its code point), the rest shown as is, so
-- the error keeps its SQLSTATE instead of failing to convert (22P05).
SELECT idempotency.idempotent_call(U&'order-\+01F600', NULL, 'SELECT run($1, $2)', 'emoji', 'first');
SELECT idempotency.idempotent_call(U&'order-\+01F600', NULL, 'SELECT run($1, $2)', 'emoji', 'second');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.idempotent_call(U&'caf\00E9 \20AC', NULL, 'SELECT run($1, $2)', 'mixed', 'first');
SELECT idempotency.idempotent_call(U&'caf\00E9 \20AC', NULL, 'SELECT run($1, $2)', 'mixed', 'second');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.idempotent_call(U&'\+01F600', NULL, $$SELECT idempotency.idempotent_call(U&'\+01F600', NULL, 'SELECT 1')$$);
\echo :LAST_ERROR_SQLSTATE

SET client_encoding = 'UTF8';
SELECT idempotency.idempotent_call('euro', NULL, 'SELECT run($1, $2)', 'euro', U&'\20AC 5'), idempotency.last_call_replayed();
SELECT label, count(*) AS runs FROM runs GROUP BY label ORDER BY label;

\c :regress_database
DROP DATABASE regress_hostile_encoding;
