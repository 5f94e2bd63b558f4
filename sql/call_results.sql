-- How fn's result becomes the response (docs/how-it-works.md, "Result to jsonb"), and
-- that a replay returns exactly what the first call returned.
\i sql/include/setup.sql
CREATE TABLE result_accounts (id int PRIMARY KEY, balance numeric NOT NULL);
INSERT INTO result_accounts VALUES (7, 485);
CREATE TYPE money_amount AS (currency text, cents bigint);
CREATE DOMAIN positive_int AS int CHECK (VALUE > 0);
-- A first call whose answer is kept as text, to compare replays with.
CREATE TABLE first_answers (key text PRIMARY KEY, fn text NOT NULL, answer text);
CREATE FUNCTION first_call(k text, fn text) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
  response jsonb := idempotency.idempotent_call(k, NULL, fn);
BEGIN
  INSERT INTO first_answers VALUES (k, fn, response::text);
  RETURN response;
END $$;


-- Zero rows (or a statement that returns none): SQL NULL.
SELECT first_call('r-zero', 'SELECT 1 WHERE false') IS NULL AS is_sql_null;
SELECT first_call('r-dml', 'UPDATE result_accounts SET balance = balance WHERE id = 7') IS NULL AS is_sql_null;
-- One row, one column: that value as jsonb.
SELECT first_call('r-int', 'SELECT 42');
SELECT first_call('r-text', 'SELECT ''forty-two''::text');
SELECT first_call('r-numeric', 'SELECT 12.50::numeric');
SELECT first_call('r-jsonb', 'SELECT ''{"ok": true, "n": [1, 2]}''::jsonb');
SELECT first_call('r-json', 'SELECT ''{"b": 1, "a": 2}''::json');
SELECT first_call('r-bool', 'SELECT true');
SELECT first_call('r-ts', 'SELECT ''2026-01-02 03:04:05+00''::timestamptz AT TIME ZONE ''UTC''');
-- One row whose value is SQL NULL: jsonb null (not SQL NULL).
SELECT idempotency.idempotent_call('r-null', NULL, 'SELECT NULL::int') AS response,
       idempotency.idempotent_call('r-null', NULL, 'SELECT NULL::int') IS NULL AS is_sql_null;
-- One row, several columns: an object keyed by column name.
SELECT first_call('r-row', 'SELECT 1 AS id, ''x'' AS name, NULL::int AS missing');
-- jsonb keeps no column order: its keys come shorter first, then by their
-- bytes, whatever the select list's order.
SELECT first_call('r-order', 'SELECT 1 AS zz, 2 AS a, 3 AS "B", 4 AS b, 5 AS aaa');
-- A repeated column name appears once, with the last column's value.
SELECT first_call('r-repeated', 'SELECT 1 AS x, 2 AS y, 3 AS x');
-- Several rows: an array, one element per row (a value or an object).
SELECT first_call('r-rows1', 'SELECT g FROM generate_series(1, 3) AS g');
SELECT first_call('r-rows2', 'SELECT g AS n, g * g AS square FROM generate_series(1, 3) AS g');
SELECT first_call('r-rows-null', 'SELECT x FROM (VALUES (1), (NULL)) AS v(x)');
-- DML with RETURNING follows the same rule.
SELECT first_call('r-returning', 'UPDATE result_accounts SET balance = balance WHERE id = 7 RETURNING id, balance');
-- Types with no jsonb form of their own become their text output.
SELECT first_call('r-point', 'SELECT point(1, 2)');
SELECT first_call('r-bytea', 'SELECT ''\x0102''::bytea');
SELECT first_call('r-composite', 'SELECT ROW(''EUR'', 1250)::money_amount');
SELECT first_call('r-array', 'SELECT ARRAY[1, 2, NULL]');

-- Arguments of many types bind to $1..$n.
SELECT idempotency.idempotent_call('a-types', NULL,
  'SELECT $1::text || '' '' || $2::text || '' '' || $3::text || '' '' || $4::text || '' '' || coalesce($5::text, ''null'')',
  'untyped', 2.5::numeric, ARRAY[1, 2], ROW('EUR', 5)::money_amount, NULL::int);
SELECT idempotency.idempotent_call('a-domain', NULL, 'SELECT $1 + 1', 5::positive_int);
SELECT idempotency.idempotent_call('a-point', NULL, 'SELECT $1[0]', point(3, 4));

-- Every response above replays byte for byte: the replay's text is the
-- first call's text (jsonb equality would not do: '12.50' and '12.5' are
-- equal jsonb values).
SELECT count(*) AS keys,
       count(*) FILTER (WHERE replayed) AS replayed,
       count(*) FILTER (WHERE replay IS NOT DISTINCT FROM f.answer) AS same_text
  FROM first_answers AS f,
       LATERAL (SELECT idempotency.idempotent_call(f.key, NULL, f.fn)::text,
                       idempotency.last_call_replayed()) AS r(replay, replayed);

-- The fingerprint covers the values fn receives: the same call is
-- recognised, a changed value is not. fn's text gives $1 of `$1 + 1` the
-- type integer, so 5 passed as the domain or as an integer is one request.
SELECT idempotency.idempotent_call('a-point', NULL, 'SELECT $1[0]', point(3, 4)),
       idempotency.last_call_replayed() AS replayed;
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('a-point', NULL, 'SELECT $1[0]', point(3, 5))$$);
SELECT idempotency.idempotent_call('a-domain', NULL, 'SELECT $1 + 1', 5),
       idempotency.last_call_replayed() AS replayed;
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('a-domain', NULL, 'SELECT $1 + 1', 6::positive_int)$$);
DROP FUNCTION first_call(text, text);
DROP TABLE first_answers;
