-- The backend's cache of fn statements (text and argument types: their
-- received types, conversions, fingerprint prefix and plan). Statements
-- that share a hash are told apart by text and types: with
-- idempotency.debug_statement_hash_bits cut to 0 or 1 bits, different
-- statements collide, and each still gets its own plan, types and
-- fingerprint. The cache keeps 1,024 statements: past them, its memory
-- stops growing and calls still run and replay.
\i sql/include/setup.sql

-- The developer setting: superusers only, 0 to 64 bits.
SHOW idempotency.debug_statement_hash_bits;
SELECT sqlstate_of('SET idempotency.debug_statement_hash_bits = 65');
SELECT sqlstate_of('SET idempotency.debug_statement_hash_bits = -1');
CREATE ROLE regress_cache_user;
SET ROLE regress_cache_user;
SELECT sqlstate_of('SET idempotency.debug_statement_hash_bits = 0');
RESET ROLE;
DROP ROLE regress_cache_user;

-- fn's results name the statement and its run: a replay answers an old
-- run, and a statement that got another's plan would answer its name.
CREATE SEQUENCE cache_runs;
CREATE FUNCTION kept_statements() RETURNS bigint LANGUAGE sql AS $$
  SELECT count(*) FROM pg_backend_memory_contexts WHERE name = 'idempotency statement'
$$;
CREATE FUNCTION cache_call(key text, fn text, OUT response jsonb, OUT replayed boolean)
LANGUAGE plpgsql AS $$
BEGIN
  response := idempotency.idempotent_call(key, NULL, fn);
  replayed := idempotency.last_call_replayed();
END $$;

-- --- every statement shares hash 0 ---------------------------------------
-- The first is kept; the others collide with it and are built per call.
SET idempotency.debug_statement_hash_bits = 0;
SELECT * FROM cache_call('cache-a', 'SELECT jsonb_build_object(''fn'', ''a'', ''run'', nextval(''cache_runs''))');
SELECT * FROM cache_call('cache-b', 'SELECT jsonb_build_object(''fn'', ''b'', ''run'', nextval(''cache_runs''))');
SELECT kept_statements();
SELECT * FROM cache_call('cache-a', 'SELECT jsonb_build_object(''fn'', ''a'', ''run'', nextval(''cache_runs''))');
SELECT * FROM cache_call('cache-b', 'SELECT jsonb_build_object(''fn'', ''b'', ''run'', nextval(''cache_runs''))');
-- A key of one text retried with the other is another request, either way.
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('cache-a', NULL,
  'SELECT jsonb_build_object(''fn'', ''b'', ''run'', nextval(''cache_runs''))')$$);
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('cache-b', NULL,
  'SELECT jsonb_build_object(''fn'', ''a'', ''run'', nextval(''cache_runs''))')$$);

-- One text, three argument types, in a new session (an empty cache) so
-- that the first is kept: each call sees its own type (fn receives the
-- type it was given), and a key's retry with another type is another
-- request.
\c
SET idempotency.debug_statement_hash_bits = 0;
SELECT idempotency.idempotent_call('cache-int', NULL,
  'SELECT jsonb_build_object(''type'', pg_typeof($1)::text, ''run'', nextval(''cache_runs''))', 7);
SELECT idempotency.idempotent_call('cache-text', NULL,
  'SELECT jsonb_build_object(''type'', pg_typeof($1)::text, ''run'', nextval(''cache_runs''))', '7'::text);
SELECT idempotency.idempotent_call('cache-bigint', NULL,
  'SELECT jsonb_build_object(''type'', pg_typeof($1)::text, ''run'', nextval(''cache_runs''))', 7::bigint);
SELECT idempotency.idempotent_call('cache-int', NULL,
  'SELECT jsonb_build_object(''type'', pg_typeof($1)::text, ''run'', nextval(''cache_runs''))', 7),
  idempotency.last_call_replayed();
SELECT idempotency.idempotent_call('cache-text', NULL,
  'SELECT jsonb_build_object(''type'', pg_typeof($1)::text, ''run'', nextval(''cache_runs''))', '7'::text),
  idempotency.last_call_replayed();
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('cache-int', NULL,
  'SELECT jsonb_build_object(''type'', pg_typeof($1)::text, ''run'', nextval(''cache_runs''))', '7'::text)$$);
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('cache-text', NULL,
  'SELECT jsonb_build_object(''type'', pg_typeof($1)::text, ''run'', nextval(''cache_runs''))', 7)$$);

-- One text whose parameter type fn decides ($1 + 1 makes $1 an integer),
-- the integer kept: a bigint and a numeric argument are converted to it,
-- the integer is not; the same value sent as another type is the same
-- request.
\c
SET idempotency.debug_statement_hash_bits = 0;
SELECT idempotency.idempotent_call('cache-sum-int', NULL,
  'SELECT jsonb_build_object(''sum'', $1 + 1, ''type'', pg_typeof($1 + 1)::text)', 41);
SELECT idempotency.idempotent_call('cache-sum-bigint', NULL,
  'SELECT jsonb_build_object(''sum'', $1 + 1, ''type'', pg_typeof($1 + 1)::text)', 41::bigint);
SELECT idempotency.idempotent_call('cache-sum-numeric', NULL,
  'SELECT jsonb_build_object(''sum'', $1 + 1, ''type'', pg_typeof($1 + 1)::text)', 41.4);
SELECT idempotency.idempotent_call('cache-sum-int', NULL,
  'SELECT jsonb_build_object(''sum'', $1 + 1, ''type'', pg_typeof($1 + 1)::text)', 41::bigint),
  idempotency.last_call_replayed();
SELECT kept_statements();

-- --- one bit: of three statements, at least two share a hash ------------
\c
SET idempotency.debug_statement_hash_bits = 1;
SELECT * FROM cache_call('cache-1bit-x', 'SELECT jsonb_build_object(''fn'', ''x'', ''run'', nextval(''cache_runs''))');
SELECT * FROM cache_call('cache-1bit-y', 'SELECT jsonb_build_object(''fn'', ''y'', ''run'', nextval(''cache_runs''))');
SELECT * FROM cache_call('cache-1bit-z', 'SELECT jsonb_build_object(''fn'', ''z'', ''run'', nextval(''cache_runs''))');
SELECT * FROM cache_call('cache-1bit-x', 'SELECT jsonb_build_object(''fn'', ''x'', ''run'', nextval(''cache_runs''))');
SELECT * FROM cache_call('cache-1bit-y', 'SELECT jsonb_build_object(''fn'', ''y'', ''run'', nextval(''cache_runs''))');
SELECT * FROM cache_call('cache-1bit-z', 'SELECT jsonb_build_object(''fn'', ''z'', ''run'', nextval(''cache_runs''))');
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('cache-1bit-x', NULL,
  'SELECT jsonb_build_object(''fn'', ''y'', ''run'', nextval(''cache_runs''))')$$);
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('cache-1bit-y', NULL,
  'SELECT jsonb_build_object(''fn'', ''z'', ''run'', nextval(''cache_runs''))')$$);
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('cache-1bit-z', NULL,
  'SELECT jsonb_build_object(''fn'', ''x'', ''run'', nextval(''cache_runs''))')$$);
SELECT kept_statements() < 3 AS collided;
RESET idempotency.debug_statement_hash_bits;

-- --- the bound: 1,024 statements ----------------------------------------
-- In a new session (an empty cache): 1,100 fn texts, then 500 more. The
-- memory of the cache - its statements, the hash tables, the parameter
-- types kept beside them - and the plans kept (SPI plans, each a
-- CachedPlanSource named by its text) stop at the bound.
\c
CREATE FUNCTION cache_memory() RETURNS TABLE (statements bigint, plans bigint, bytes numeric)
LANGUAGE sql AS $$
  SELECT count(*) FILTER (WHERE name = 'idempotency statement'),
         count(*) FILTER (WHERE name = 'CachedPlanSource' AND ident ~ '/\* cache bound \d+ \*/$'),
         sum(total_bytes) FILTER (WHERE name IN ('idempotency statement', 'idempotency statements',
                                                 'idempotency parameter types')
                                  OR ident IN ('idempotency statements', 'idempotency parameter types'))
    FROM pg_backend_memory_contexts
$$;
-- Calls the fn texts first .. last, each under a key of its own; fails
-- unless each answers its own number, run or replayed as `replay` says.
CREATE FUNCTION cache_calls(first int, last int, replay boolean) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
  response jsonb;
BEGIN
  FOR n IN first .. last LOOP
    response := idempotency.idempotent_call('cache-bound-' || n, NULL,
      format('SELECT jsonb_build_object(''n'', %s, ''run'', nextval(''cache_runs'')) /* cache bound %s */', n, n));
    IF (response ->> 'n')::int <> n OR idempotency.last_call_replayed() <> replay THEN
      RAISE EXCEPTION 'fn text %: answered %, replayed %', n, response,
        idempotency.last_call_replayed();
    END IF;
  END LOOP;
END $$;
SELECT cache_calls(1, 1100, false);
SELECT statements, plans FROM cache_memory();
SELECT bytes AS bytes_at_bound FROM cache_memory() \gset
SELECT cache_calls(1101, 1600, false);
SELECT statements, plans, bytes - :bytes_at_bound AS bytes_grown FROM cache_memory();
-- Kept (1 .. 1,024) or not, every key replays its own response.
SELECT cache_calls(1, 1600, true);
SELECT statements, plans, bytes - :bytes_at_bound AS bytes_grown FROM cache_memory();
SELECT count(*) AS keys, count(DISTINCT response ->> 'run') AS runs
  FROM idempotency.keys WHERE key LIKE 'cache-bound-%';

DELETE FROM idempotency.keys WHERE key LIKE 'cache-%';
DROP FUNCTION cache_memory(), cache_calls(int, int, boolean), kept_statements(),
  cache_call(text, text);
DROP SEQUENCE cache_runs;
