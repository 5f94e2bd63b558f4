-- How fn's result becomes the response (docs/how-it-works.md, "Result to jsonb"), and
-- that a replay returns exactly what the first call returned.
\i sql/include/setup.sql
CREATE TABLE result_accounts (id int PRIMARY KEY, balance numeric NOT NULL);
INSERT INTO result_accounts VALUES (7, 485);
CREATE TYPE money_amount AS (currency text, cents bigint);
CREATE DOMAIN positive_int AS int CHECK (VALUE > 0);


-- Zero rows (or a statement that returns none): SQL NULL.
SELECT idempotency.idempotent_call('r-zero', NULL, 'SELECT 1 WHERE false') IS NULL AS is_sql_null;
SELECT idempotency.idempotent_call('r-dml', NULL, 'UPDATE result_accounts SET balance = balance WHERE id = 7') IS NULL AS is_sql_null;
-- One row, one column: that value as jsonb.
SELECT idempotency.idempotent_call('r-int', NULL, 'SELECT 42');
SELECT idempotency.idempotent_call('r-text', NULL, 'SELECT ''forty-two''::text');
SELECT idempotency.idempotent_call('r-numeric', NULL, 'SELECT 12.50::numeric');
SELECT idempotency.idempotent_call('r-jsonb', NULL, 'SELECT ''{"ok": true, "n": [1, 2]}''::jsonb');
SELECT idempotency.idempotent_call('r-json', NULL, 'SELECT ''{"b": 1, "a": 2}''::json');
SELECT idempotency.idempotent_call('r-bool', NULL, 'SELECT true');
SELECT idempotency.idempotent_call('r-ts', NULL, 'SELECT ''2026-01-02 03:04:05+00''::timestamptz AT TIME ZONE ''UTC''');
-- One row whose value is SQL NULL: jsonb null (not SQL NULL).
SELECT idempotency.idempotent_call('r-null', NULL, 'SELECT NULL::int') AS response,
       idempotency.idempotent_call('r-null', NULL, 'SELECT NULL::int') IS NULL AS is_sql_null;
-- One row, several columns: an object keyed by column name.
SELECT idempotency.idempotent_call('r-row', NULL, 'SELECT 1 AS id, ''x'' AS name, NULL::int AS missing');
-- Several rows: an array, one element per row (a value or an object).
SELECT idempotency.idempotent_call('r-rows1', NULL, 'SELECT g FROM generate_series(1, 3) AS g');
SELECT idempotency.idempotent_call('r-rows2', NULL, 'SELECT g AS n, g * g AS square FROM generate_series(1, 3) AS g');
SELECT idempotency.idempotent_call('r-rows-null', NULL, 'SELECT x FROM (VALUES (1), (NULL)) AS v(x)');
-- DML with RETURNING follows the same rule.
SELECT idempotency.idempotent_call('r-returning', NULL, 'UPDATE result_accounts SET balance = balance WHERE id = 7 RETURNING id, balance');
-- Types with no jsonb form of their own become their text output.
SELECT idempotency.idempotent_call('r-point', NULL, 'SELECT point(1, 2)');
SELECT idempotency.idempotent_call('r-bytea', NULL, 'SELECT ''\x0102''::bytea');
SELECT idempotency.idempotent_call('r-composite', NULL, 'SELECT ROW(''EUR'', 1250)::money_amount');
SELECT idempotency.idempotent_call('r-array', NULL, 'SELECT ARRAY[1, 2, NULL]');

-- Arguments of many types bind to $1..$n.
SELECT idempotency.idempotent_call('a-types', NULL,
  'SELECT $1::text || '' '' || $2::text || '' '' || $3::text || '' '' || $4::text || '' '' || coalesce($5::text, ''null'')',
  'untyped', 2.5::numeric, ARRAY[1, 2], ROW('EUR', 5)::money_amount, NULL::int);
SELECT idempotency.idempotent_call('a-domain', NULL, 'SELECT $1 + 1', 5::positive_int);
SELECT idempotency.idempotent_call('a-point', NULL, 'SELECT $1[0]', point(3, 4));

-- Every response above replays byte for byte.
SELECT count(*) AS keys,
       count(*) FILTER (WHERE replayed IS NOT DISTINCT FROM k.response) AS replay_matches
  FROM idempotency.keys AS k,
       LATERAL (SELECT idempotency.idempotent_call(k.key, k.request_hash, 'unused: replays do not run fn')) AS r(replayed)
 WHERE k.key LIKE 'r-%';

-- The fingerprint covers argument types and values: the same call is
-- recognised, a changed type or value is not.
SELECT idempotency.idempotent_call('a-point', NULL, 'SELECT $1[0]', point(3, 4)),
       idempotency.last_call_replayed() AS replayed;
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('a-point', NULL, 'SELECT $1[0]', point(3, 5))$$);
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('a-domain', NULL, 'SELECT $1 + 1', 5)$$);
