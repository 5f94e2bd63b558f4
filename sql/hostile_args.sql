-- Odd arguments for fn: NULLs, VARIADIC arrays, arrays, composite types,
-- domains, types whose jsonb form is only their text output (or that have
-- no binary send function), and parameters fn uses wrongly. The argument
-- types are part of the request fingerprint.
\i sql/include/setup.sql
SET client_min_messages = warning;
DROP SCHEMA IF EXISTS hostile_args CASCADE;
RESET client_min_messages;
CREATE SCHEMA hostile_args;
SET search_path = hostile_args, public;


-- NULL arguments. An untyped NULL binds as text; a typed NULL keeps its
-- type, and the type is part of the request.
SELECT idempotency.idempotent_call('args-null', NULL, 'SELECT $1', NULL);
SELECT idempotency.idempotent_call('args-null', NULL, 'SELECT $1', NULL::text), idempotency.last_call_replayed();
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('args-null', NULL, 'SELECT $1', NULL::int)$$);
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('args-null', NULL, 'SELECT $1', 'NULL')$$);
SELECT idempotency.idempotent_call('args-nulls', NULL, 'SELECT ARRAY[$1, $2, $3]', NULL::int, 2, NULL::int);

-- VARIADIC: a NULL or empty array means no arguments; an array spreads into
-- $1 ... $n and is the same request as the spread arguments.
SELECT idempotency.idempotent_call('args-variadic-none', NULL, 'SELECT 1', VARIADIC NULL::int[]);
SELECT idempotency.idempotent_call('args-variadic-none', NULL, 'SELECT 1'), idempotency.last_call_replayed();
SELECT idempotency.idempotent_call('args-variadic-none', NULL, 'SELECT 1', VARIADIC ARRAY[]::int[]), idempotency.last_call_replayed();
SELECT idempotency.idempotent_call('args-variadic', NULL, 'SELECT $1 + $2', VARIADIC ARRAY[20, 22]);
SELECT idempotency.idempotent_call('args-variadic', NULL, 'SELECT $1 + $2', 20, 22), idempotency.last_call_replayed();
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('args-variadic', NULL, 'SELECT $1 + $2', 20::bigint, 22::bigint)$$);
-- 1000 arguments through a VARIADIC array; a parameter beyond them is 42P02.
SELECT idempotency.idempotent_call('args-thousand', NULL, 'SELECT $1 + $1000',
       VARIADIC ARRAY(SELECT generate_series(1, 1000)));
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('args-thousand-1', NULL, 'SELECT $1001',
       VARIADIC ARRAY(SELECT generate_series(1, 1000)))$$);

-- Arrays as one argument.
SELECT idempotency.idempotent_call('args-array', NULL, 'SELECT $1', ARRAY[1, NULL, 3]);
SELECT idempotency.idempotent_call('args-array-2d', NULL, 'SELECT $1', ARRAY[[1, 2], [3, 4]]);
SELECT idempotency.idempotent_call('args-array-empty', NULL, 'SELECT $1', '{}'::text[]);
SELECT idempotency.idempotent_call('args-array-bounds', NULL, 'SELECT array_lower($1, 1)', '[5:6]={a,b}'::text[]);
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('args-array-bounds', NULL, 'SELECT array_lower($1, 1)', '{a,b}'::text[])$$);

-- Composite types: anonymous records, named types, nested, with NULL
-- fields, and a table's row type.
CREATE TYPE pair AS (a int, b text);
CREATE TYPE nested AS (p pair, tags text[]);
CREATE TABLE items (id int, name text);
INSERT INTO items VALUES (1, 'one');
SELECT idempotency.idempotent_call('args-record', NULL, 'SELECT $1', ROW(1, 'x'));
SELECT idempotency.idempotent_call('args-pair', NULL, 'SELECT $1', ROW(1, 'x')::pair);
SELECT idempotency.idempotent_call('args-pair-field', NULL, 'SELECT ($1).b', ROW(1, NULL)::pair);
SELECT idempotency.idempotent_call('args-nested', NULL, 'SELECT $1', ROW(ROW(2, 'y')::pair, ARRAY['t'])::nested);
SELECT idempotency.idempotent_call('args-row', NULL, 'SELECT $1', i) FROM items AS i;
-- The record is the same request as the named type only if the types match.
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('args-pair', NULL, 'SELECT $1', ROW(1, 'x'))$$);

-- Domains: a value the domain refuses never reaches the call. fn receives
-- the type its text gives $1 (integer for `$1 + 1`), so 41 as the domain
-- and 41 as an integer are one request.
CREATE DOMAIN positive AS int CHECK (VALUE > 0);
SELECT idempotency.idempotent_call('args-domain', NULL, 'SELECT $1 + 1', 41::positive);
SELECT idempotency.idempotent_call('args-domain', NULL, 'SELECT $1 + 1', 41), idempotency.last_call_replayed();
-- A parameter fn declares as the domain receives the domain, checked.
CREATE FUNCTION plus_one(n positive) RETURNS int LANGUAGE sql AS 'SELECT n + 1';
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('args-domain-fn', NULL, 'SELECT hostile_args.plus_one($1)', 0)$$);
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('args-domain-bad', NULL, 'SELECT $1 + 1', (-1)::positive)$$);
CREATE DOMAIN pair_with_a AS pair CHECK ((VALUE).a IS NOT NULL);
SELECT idempotency.idempotent_call('args-domain-composite', NULL, 'SELECT $1', ROW(3, 'z')::pair_with_a);

-- Types with no jsonb form of their own become their text output; types
-- without a binary send function (aclitem, cstring) are fingerprinted by
-- their text output. Each works as an argument and as a response.
CREATE ROLE regress_hostile_args;
CREATE TABLE odd_values (label text, call text);
INSERT INTO odd_values VALUES
  ('point', $$'(1,2)'::point$$), ('money', $$'12.50'::money$$),
  ('interval', $$'1 day 2 hours'::interval$$), ('bytea', $$'\x00ff'::bytea$$),
  ('tsvector', $$'b a'::tsvector$$), ('xml', $$'<a/>'::xml$$),
  ('NaN', $$'NaN'::numeric$$), ('Infinity', $$'Infinity'::float8$$),
  ('infinity', $$'infinity'::timestamptz$$), ('range', $$'[1,3)'::int4range$$),
  ('"char"', $$'c'::"char"$$), ('name', $$'n'::name$$), ('uuid', $$'00000000-0000-0000-0000-000000000001'::uuid$$),
  ('inet', $$'10.0.0.1/8'::inet$$), ('bit', $$B'101'$$), ('pg_lsn', $$'16/B374D848'::pg_lsn$$),
  ('regclass', $$'pg_class'::regclass$$), ('regtype', $$'int4'::regtype$$),
  ('json', $$'{"b": 1, "a": [true]}'::json$$), ('jsonb', $$'{"b": 1, "a": [true]}'::jsonb$$),
  ('aclitem', $$'regress_hostile_args=r/regress_hostile_args'::aclitem$$),
  ('cstring', $$'c string'::cstring$$);
CREATE FUNCTION call_with(label text, call text) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
  response jsonb;
BEGIN
  EXECUTE format('SELECT idempotency.idempotent_call(%L, NULL, ''SELECT $1'', %s)', 'args-odd-' || label, call)
    INTO response;
  RETURN response;
END $$;
SELECT label, call_with(label, call) AS response, idempotency.last_call_replayed() AS replayed
  FROM odd_values ORDER BY label;
SELECT label, call_with(label, call) AS response, idempotency.last_call_replayed() AS replayed
  FROM odd_values ORDER BY label;
-- A polymorphic value (anyarray, as pg_stats shows it) works as well.
CREATE TABLE analyzed (v int);
INSERT INTO analyzed SELECT g % 3 FROM generate_series(1, 300) AS g;
ANALYZE analyzed;
SELECT idempotency.idempotent_call('args-anyarray', NULL, 'SELECT $1', most_common_vals)
  FROM pg_stats WHERE schemaname = 'hostile_args' AND tablename = 'analyzed';

-- A request refused with IK422 is never applied, nor even started: fn
-- writes a row and draws a number from a sequence (which no rollback
-- gives back), and after every refused variant (another value, a NULL,
-- another fn text) only the first request's row and number are there. The
-- same amount as another type is the same request (the column's numeric
-- is what fn receives): replayed, not applied again.
CREATE TABLE applied (amount numeric, run bigint);
CREATE SEQUENCE fn_runs;
SELECT idempotency.idempotent_call('args-applied', NULL, 'INSERT INTO hostile_args.applied VALUES ($1, nextval(''hostile_args.fn_runs'')) RETURNING amount', 5);
SELECT idempotency.idempotent_call('args-applied', NULL, 'INSERT INTO hostile_args.applied VALUES ($1, nextval(''hostile_args.fn_runs'')) RETURNING amount', 5::bigint),
       idempotency.last_call_replayed();
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('args-applied', NULL, 'INSERT INTO hostile_args.applied VALUES ($1, nextval(''hostile_args.fn_runs'')) RETURNING amount', 6)$$);
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('args-applied', NULL, 'INSERT INTO hostile_args.applied VALUES ($1, nextval(''hostile_args.fn_runs'')) RETURNING amount', NULL::int)$$);
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('args-applied', NULL, 'INSERT INTO hostile_args.applied VALUES ($1 + 1, nextval(''hostile_args.fn_runs'')) RETURNING amount', 5)$$);
SELECT amount, run FROM applied;
SELECT last_value AS numbers_drawn FROM fn_runs;

-- fn uses its parameters wrongly, or a value does not convert to the type
-- fn's text gives it: PostgreSQL's error, nothing stored.
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('args-missing', NULL, 'SELECT $2', 1)$$);
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('args-mistyped', NULL, 'SELECT $1 + 1', 'one'::text)$$);
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('args-inline', NULL, 'SELECT $1 || $1', 'a')$$);
SELECT count(*) AS stored FROM idempotency.keys WHERE key IN ('args-missing', 'args-mistyped', 'args-thousand-1', 'args-domain-bad');

-- A caller's own request_hash is taken as given, even an empty or a very
-- long one; a NULL hash on the same key is another request, and so is the
-- same hash with another fn.
SELECT idempotency.idempotent_call('args-hash-empty', '', 'SELECT 1');
SELECT idempotency.idempotent_call('args-hash-empty', '', 'SELECT 1'), idempotency.last_call_replayed();
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('args-hash-empty', '', 'SELECT 2')$$);
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('args-hash-empty', NULL, 'SELECT 1')$$);
SELECT idempotency.idempotent_call('args-hash-long', repeat('h', 1000000), 'SELECT 1');
SELECT idempotency.idempotent_call('args-hash-long', repeat('h', 1000000), 'SELECT 1'), idempotency.last_call_replayed();
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('args-hash-long', repeat('h', 999999), 'SELECT 1')$$);

DELETE FROM idempotency.keys WHERE key LIKE 'args-%';
SET client_min_messages = warning;
DROP SCHEMA hostile_args CASCADE;
RESET client_min_messages;
DROP ROLE regress_hostile_args;
RESET search_path;
