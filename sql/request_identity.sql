-- A request is fn and the values fn receives. fn's text decides the type of
-- each parameter, as PostgreSQL decides the types of a client's untyped
-- parameters; every argument is converted to that type before fn runs and
-- before the request is fingerprinted. So the same values sent by any
-- driver, typed or untyped, are one request, and a different value is
-- IK422. A client statement with untyped parameters (PREPARE without types
-- here, as drivers send them) gets those types from fn.
\i sql/include/setup.sql

CREATE SCHEMA identity;
SET search_path = identity, public;
CREATE TABLE runs (label text);
CREATE FUNCTION withdraw(account int, amount bigint) RETURNS jsonb LANGUAGE sql AS $$
  INSERT INTO identity.runs VALUES ('withdraw');
  SELECT jsonb_build_object('account', account, 'amount', amount) $$;
CREATE FUNCTION ran(label text) RETURNS bigint LANGUAGE sql AS
  $$ SELECT count(*) FROM identity.runs WHERE runs.label = ran.label $$;

-- Untyped parameters: the statement's parameters take fn's types.
PREPARE untyped AS SELECT idempotency.idempotent_call($1, NULL, 'SELECT identity.withdraw($1, $2)', $2, $3);
SELECT parameter_types FROM pg_prepared_statements WHERE name = 'untyped';
EXECUTE untyped('id-1', '7', '300');
-- The same values as every type a driver may send them as: one request.
SELECT idempotency.idempotent_call('id-1', NULL, 'SELECT identity.withdraw($1, $2)', 7, 300), idempotency.last_call_replayed();
SELECT idempotency.idempotent_call('id-1', NULL, 'SELECT identity.withdraw($1, $2)', 7::smallint, 300::smallint), idempotency.last_call_replayed();
SELECT idempotency.idempotent_call('id-1', NULL, 'SELECT identity.withdraw($1, $2)', 7::bigint, 300::numeric), idempotency.last_call_replayed();
SELECT idempotency.idempotent_call('id-1', NULL, 'SELECT identity.withdraw($1, $2)', '7'::varchar, '300'::text), idempotency.last_call_replayed();
SELECT idempotency.idempotent_call('id-1', NULL, 'SELECT identity.withdraw($1, $2)', '7', '300'), idempotency.last_call_replayed();
SELECT idempotency.idempotent_call('id-1', NULL, 'SELECT identity.withdraw($1, $2)', VARIADIC ARRAY[7, 300]), idempotency.last_call_replayed();
SELECT idempotency.idempotent_call('id-1', NULL, 'SELECT identity.withdraw($1, $2)', VARIADIC ARRAY['7', '300']), idempotency.last_call_replayed();
-- A different value, however it is typed, is another request.
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('id-1', NULL, 'SELECT identity.withdraw($1, $2)', 7, 301::bigint)$$);
SELECT sqlstate_of($$EXECUTE untyped('id-1', '7', '301')$$);
SELECT ran('withdraw');

-- A prepared statement reused with many keys and values (generic plans).
SET plan_cache_mode = force_generic_plan;
SELECT count(*) FILTER (WHERE r IS NOT NULL) AS answered
  FROM generate_series(1, 20) AS g,
       LATERAL (SELECT idempotency.idempotent_call('id-many-' || g, NULL, 'SELECT identity.withdraw($1, $2)', g, g * 10)) AS c(r);
PREPARE many AS SELECT idempotency.idempotent_call($1, NULL, 'SELECT identity.withdraw($1, $2)', $2, $3);
DO $$ BEGIN FOR g IN 1..20 LOOP EXECUTE format('EXECUTE many(%L, %L, %L)', 'id-many-' || g, g, g * 10); END LOOP; END $$;
SELECT ran('withdraw') AS withdrawals_after_both_rounds;
RESET plan_cache_mode;

-- NULL arguments from untyped parameters.
EXECUTE untyped('id-null', NULL, NULL);
EXECUTE untyped('id-null', NULL, NULL);
SELECT idempotency.last_call_replayed();
SELECT idempotency.idempotent_call('id-null', NULL, 'SELECT identity.withdraw($1, $2)', NULL::int, NULL::text), idempotency.last_call_replayed();

-- fn passed as a parameter itself: its arguments arrive as text and are
-- converted when the call runs; still the same request.
PREPARE fn_bound AS SELECT idempotency.idempotent_call($1, NULL, $2, $3, $4);
SELECT parameter_types FROM pg_prepared_statements WHERE name = 'fn_bound';
EXECUTE fn_bound('id-1', 'SELECT identity.withdraw($1, $2)', '7', '300');
SELECT idempotency.last_call_replayed();

-- A parameter fn only passes on keeps the caller's type (PostgreSQL would
-- make an untyped one text): the answer's type follows the caller's.
SELECT idempotency.idempotent_call('id-pass-int', NULL, 'SELECT $1', 5),
       idempotency.idempotent_call('id-pass-text', NULL, 'SELECT $1', 'five'),
       idempotency.idempotent_call('id-pass-array', NULL, 'SELECT ARRAY[$1, $2]', 1, NULL::int);
-- Where fn's text cannot be analysed with open types, the caller's decide.
SELECT idempotency.idempotent_call('id-sum', NULL, 'SELECT $1 + $2', 2, 3);

-- A value that does not convert to fn's type: PostgreSQL's error, nothing
-- stored, nothing run.
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('id-bad', NULL, 'SELECT identity.withdraw($1, $2)', 'seven', 300)$$);
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('id-bad', NULL, 'SELECT identity.withdraw($1, $2)', true, 300)$$);
SELECT count(*) AS stored FROM idempotency.keys WHERE key = 'id-bad';

-- The edge cases, one rule: what fn receives.
CREATE DOMAIN email AS text CHECK (VALUE LIKE '%@%');
CREATE FUNCTION pay(amount numeric) RETURNS numeric LANGUAGE sql AS $$ INSERT INTO identity.runs VALUES ('pay'); SELECT amount $$;
CREATE FUNCTION at(t timestamptz) RETURNS timestamptz LANGUAGE sql AS $$ INSERT INTO identity.runs VALUES ('at'); SELECT t $$;
CREATE FUNCTION doc(d jsonb) RETURNS jsonb LANGUAGE sql AS $$ INSERT INTO identity.runs VALUES ('doc'); SELECT d $$;
CREATE FUNCTION mail(e email) RETURNS text LANGUAGE sql AS $$ INSERT INTO identity.runs VALUES ('mail'); SELECT e $$;
-- numeric keeps its scale: 12.5 and 12.50 are different values to fn.
SELECT idempotency.idempotent_call('id-numeric', NULL, 'SELECT identity.pay($1)', 12.5);
SELECT idempotency.idempotent_call('id-numeric', NULL, 'SELECT identity.pay($1)', '12.5'), idempotency.last_call_replayed();
SELECT idempotency.idempotent_call('id-numeric', NULL, 'SELECT identity.pay($1)', 12.5::float8), idempotency.last_call_replayed();
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('id-numeric', NULL, 'SELECT identity.pay($1)', 12.50)$$);
-- timestamptz is an instant: the same instant in any time zone is one value.
SELECT idempotency.idempotent_call('id-instant', NULL, 'SELECT identity.at($1)', '2026-12-03 10:00:00+00');
SET TimeZone = 'Asia/Tokyo';
SELECT idempotency.idempotent_call('id-instant', NULL, 'SELECT identity.at($1)', '2026-12-03 19:00:00+09'), idempotency.last_call_replayed();
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('id-instant', NULL, 'SELECT identity.at($1)', '2026-12-03 10:00:00')$$);
RESET TimeZone;
-- jsonb keeps no key order and no whitespace: the same document is one value.
SELECT idempotency.idempotent_call('id-jsonb', NULL, 'SELECT identity.doc($1)', '{"a": 1, "b": [2, 3]}');
SELECT idempotency.idempotent_call('id-jsonb', NULL, 'SELECT identity.doc($1)', '{"b":[2,3],"a":1}'::json), idempotency.last_call_replayed();
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('id-jsonb', NULL, 'SELECT identity.doc($1)', '{"a": 1, "b": [3, 2]}')$$);
-- A domain over text is what fn receives when fn declares it; text,
-- varchar or untyped, the same address is one request.
SELECT idempotency.idempotent_call('id-email', NULL, 'SELECT identity.mail($1)', 'a@example.org'::text);
SELECT idempotency.idempotent_call('id-email', NULL, 'SELECT identity.mail($1)', 'a@example.org'::varchar), idempotency.last_call_replayed();
SELECT idempotency.idempotent_call('id-email', NULL, 'SELECT identity.mail($1)', 'a@example.org'::email), idempotency.last_call_replayed();
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('id-email-bad', NULL, 'SELECT identity.mail($1)', 'nobody')$$);
SELECT ran('pay') AS pay, ran('at') AS at, ran('doc') AS doc, ran('mail') AS mail;

-- A key stored by 0.5 holds the fingerprint of the types the caller sent
-- (here integer and integer, where withdraw receives integer and bigint),
-- text hashed in the database encoding. That form is no longer matched:
-- the same request answers IK422 (docs/fingerprints.md), and fn does not
-- run. The frames
-- (tag, 64-bit little-endian length, bytes) are written out here, which also
-- pins both framings: 01 fn, 04 each type name, 05 each value (binary send
-- form), 06 a client's request_hash, 07 the claim marker.
CREATE FUNCTION frame(tag int, body bytea) RETURNS bytea LANGUAGE plpgsql AS $$
DECLARE
  len bytea := '\x0000000000000000';
BEGIN
  FOR i IN 0..7 LOOP
    len := set_byte(len, i, ((length(body)::bigint >> (8 * i)) & 255)::int);
  END LOOP;
  RETURN set_byte('\x00'::bytea, 0, tag) || len || body;
END $$;
INSERT INTO idempotency.keys (scope, key, key_digest, request_hash, response, created_at, expires_at)
VALUES (current_user::text::idempotency.role_scope, 'stored-by-0.5', idempotency.key_digest('stored-by-0.5'),
        sha256(frame(1, convert_to('SELECT identity.withdraw($1, $2)', 'UTF8')) ||
               frame(4, 'integer') || frame(4, 'integer') ||
               frame(5, int4send(7)) || frame(5, int4send(300))),
        '{"account": 7, "amount": 300, "stored": "by 0.5"}', now(), now() + interval '1 day');
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('stored-by-0.5', NULL, 'SELECT identity.withdraw($1, $2)', 7, 300)$$) AS same_request;
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('stored-by-0.5', NULL, 'SELECT identity.withdraw($1, $2)', 7, 301)$$);
-- What this version stores: the types and values withdraw receives.
SELECT request_hash = sha256(frame(1, convert_to('SELECT identity.withdraw($1, $2)', 'UTF8')) ||
                             frame(4, 'integer') || frame(4, 'bigint') ||
                             frame(5, int4send(7)) || frame(5, int8send(300))) AS pinned
  FROM idempotency.keys WHERE key = 'id-1';
SELECT idempotency.idempotent_call('id-client', 'order-42', 'SELECT 1');
SELECT request_hash = sha256(frame(1, 'SELECT 1') || frame(6, 'order-42')) AS pinned
  FROM idempotency.keys WHERE key = 'id-client';
BEGIN;
SELECT replayed FROM idempotency.claim('id-claim', 'order-43');
SELECT idempotency.complete('id-claim', '{"ok": true}');
COMMIT;
SELECT request_hash = sha256(frame(7, '') || frame(6, 'order-43')) AS pinned
  FROM idempotency.keys WHERE key = 'id-claim';
-- A client's request_hash is its text in the database encoding (bytes, not
-- characters, in the length), for both APIs; an empty one is a frame of
-- length 0.
SELECT idempotency.idempotent_call('id-client-mb', 'заказ-é-42', 'SELECT 1');
SELECT request_hash = sha256(frame(1, 'SELECT 1') ||
                             frame(6, convert_to('заказ-é-42', current_setting('server_encoding')))) AS pinned
  FROM idempotency.keys WHERE key = 'id-client-mb';
SELECT idempotency.idempotent_call('id-client-empty', '', 'SELECT 1');
SELECT request_hash = sha256(frame(1, 'SELECT 1') || frame(6, '')) AS pinned
  FROM idempotency.keys WHERE key = 'id-client-empty';
BEGIN;
SELECT replayed FROM idempotency.claim('id-claim-mb', 'заказ-é-43');
SELECT idempotency.complete('id-claim-mb', '{"ok": true}');
COMMIT;
SELECT request_hash = sha256(frame(7, '') ||
                             frame(6, convert_to('заказ-é-43', current_setting('server_encoding')))) AS pinned
  FROM idempotency.keys WHERE key = 'id-claim-mb';
SELECT ran('withdraw') AS withdrawals;

RESET search_path;
SET client_min_messages = warning;
DROP SCHEMA identity CASCADE;
RESET client_min_messages;
