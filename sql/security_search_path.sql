-- search_path attacks. A role with CREATE on public plants objects named
-- like the ones the extension uses (functions, operators, a table keys);
-- the victim's session puts pg_temp (with its own temporary table keys) and
-- public before pg_catalog. Calls that run fn, replay, answer IK422 and
-- replace an expired key still use only the extension's own objects: no
-- planted object is ever called or written. The victim connects afresh, so
-- the extension prepares its statements under the hostile search_path.
\i sql/include/setup.sql
\set regress_user :USER
CREATE ROLE regress_sp_mallory;
CREATE ROLE regress_sp_victim LOGIN;
-- Its expired key is replaced, not remembered (tombstones.sql has those).
ALTER ROLE regress_sp_victim SET idempotency.remember = 0;
GRANT CREATE ON SCHEMA public TO regress_sp_mallory;
-- Every planted object that runs leaves a line here.
CREATE TABLE public.trojan_log (what text);
GRANT INSERT ON public.trojan_log TO PUBLIC;

SET SESSION AUTHORIZATION regress_sp_mallory;
CREATE FUNCTION public.trojan_regrole_eq(regrole, regrole) RETURNS bool LANGUAGE sql
  AS $$ INSERT INTO public.trojan_log VALUES ('regrole =') RETURNING true $$;
CREATE OPERATOR public.= (LEFTARG = regrole, RIGHTARG = regrole, FUNCTION = public.trojan_regrole_eq);
CREATE FUNCTION public.trojan_oid_eq(oid, oid) RETURNS bool LANGUAGE sql
  AS $$ INSERT INTO public.trojan_log VALUES ('oid =') RETURNING true $$;
CREATE OPERATOR public.= (LEFTARG = oid, RIGHTARG = oid, FUNCTION = public.trojan_oid_eq);
CREATE FUNCTION public.trojan_text_eq(text, text) RETURNS bool LANGUAGE sql
  AS $$ INSERT INTO public.trojan_log VALUES ('text =') RETURNING true $$;
CREATE OPERATOR public.= (LEFTARG = text, RIGHTARG = text, FUNCTION = public.trojan_text_eq);
CREATE FUNCTION public.trojan_timestamptz_le(timestamptz, timestamptz) RETURNS bool LANGUAGE sql
  AS $$ INSERT INTO public.trojan_log VALUES ('timestamptz <=') RETURNING true $$;
CREATE OPERATOR public.<= (LEFTARG = timestamptz, RIGHTARG = timestamptz, FUNCTION = public.trojan_timestamptz_le);
CREATE FUNCTION public.trojan_int_ge(int, int) RETURNS bool LANGUAGE sql
  AS $$ INSERT INTO public.trojan_log VALUES ('int >=') RETURNING true $$;
CREATE OPERATOR public.>= (LEFTARG = int, RIGHTARG = int, FUNCTION = public.trojan_int_ge);
CREATE FUNCTION public.current_scope() RETURNS regrole LANGUAGE sql
  AS $$ INSERT INTO public.trojan_log VALUES ('current_scope') RETURNING 'regress_sp_mallory'::regrole $$;
CREATE FUNCTION public.octet_length(text) RETURNS int LANGUAGE sql
  AS $$ INSERT INTO public.trojan_log VALUES ('octet_length') RETURNING 1 $$;
CREATE FUNCTION public.now() RETURNS timestamptz LANGUAGE sql
  AS $$ INSERT INTO public.trojan_log VALUES ('now') RETURNING 'epoch'::timestamptz $$;
CREATE FUNCTION public.text(regrole) RETURNS text LANGUAGE sql
  AS $$ INSERT INTO public.trojan_log VALUES ('text(regrole)') RETURNING 'x' $$;
CREATE FUNCTION public.jsonb(text) RETURNS jsonb LANGUAGE sql
  AS $$ INSERT INTO public.trojan_log VALUES ('jsonb(text)') RETURNING '"trojan"'::jsonb $$;
CREATE TABLE public.keys (scope regrole, key text, request_hash text, status text,
                          response jsonb, created_at timestamptz, expires_at timestamptz);
GRANT ALL ON public.keys TO PUBLIC;
RESET SESSION AUTHORIZATION;

\c - regress_sp_victim
SET search_path = pg_temp, public, pg_catalog;
CREATE TEMPORARY TABLE keys (scope regrole, key text, request_hash text, status text,
                             response jsonb, created_at timestamptz, expires_at timestamptz);
-- The planted objects are live: an unqualified name reaches them (this
-- leaves the one line the log is expected to hold at the end).
SELECT 'a'::text = 'b'::text AS planted_equals_says;
-- Run, replay, another request (IK422).
SELECT idempotency.idempotent_call('sp-key', NULL, 'SELECT 42');
SELECT idempotency.idempotent_call('sp-key', NULL, 'SELECT 42'), idempotency.last_call_replayed();
\set VERBOSITY sqlstate
SELECT idempotency.idempotent_call('sp-key', NULL, 'SELECT 43');
\set VERBOSITY default
-- A key that has expired is replaced by its next call.
SET idempotency.ttl = '1 second';
SELECT idempotency.idempotent_call('sp-expiring', NULL, 'SELECT 1');
SELECT pg_sleep(1.1);
RESET idempotency.ttl;
SELECT idempotency.idempotent_call('sp-expiring', NULL, 'SELECT 2'), idempotency.last_call_replayed();
-- The row-level security policy still scopes the victim's view to its keys.
SELECT key, response FROM idempotency.keys ORDER BY key;
SELECT count(*) AS rows_in_temp_keys FROM pg_temp.keys;
SELECT count(*) AS rows_in_public_keys FROM public.keys;

\c - :regress_user
SELECT what, count(*) FROM public.trojan_log GROUP BY what;
SELECT scope, key, response FROM idempotency.keys WHERE key LIKE 'sp-%' ORDER BY key;

DELETE FROM idempotency.keys WHERE key LIKE 'sp-%';
DROP OWNED BY regress_sp_mallory;
DROP OWNED BY regress_sp_victim;
DROP TABLE public.trojan_log;
REVOKE CREATE ON SCHEMA public FROM regress_sp_mallory;
DROP ROLE regress_sp_mallory;
DROP ROLE regress_sp_victim;
