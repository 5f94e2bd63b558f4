-- Request fingerprints, end to end. With request_hash NULL the extension
-- stores SHA-256 over a framed encoding of the request: fn, then each
-- argument's schema-qualified type name (as format_type prints it, forced
-- to qualify: 'integer', 'pg_catalog.text'), then each argument's value (its
-- binary send form, or its text output for types without one), every field
-- as a tag byte, its length as 8 bytes little-endian, and its bytes; a NULL
-- value is tag 3 with length 0. Stored fingerprints outlive upgrades, so
-- the hashes below are pinned: any change to the encoding, to a type's name
-- or to the bytes hashed for a value shows up here (and would turn every
-- stored key's retry into IK422). Each pinned hash is also recomputed in
-- SQL from that description.
\i sql/include/setup.sql
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency;
DROP SCHEMA IF EXISTS fingerprints CASCADE;
RESET client_min_messages;
CREATE SCHEMA fingerprints;
SET search_path = fingerprints, public;
-- The timestamptz literal below means one instant only under a fixed zone.
SET TimeZone = 'UTC';

CREATE DOMAIN positive AS int CHECK (VALUE > 0);
CREATE TYPE mood AS ENUM ('calm', 'busy');

-- One field of the encoding.
CREATE FUNCTION frame(tag int, data bytea) RETURNS bytea LANGUAGE sql IMMUTABLE AS $$
  SELECT set_byte('\x00'::bytea, 0, tag)
         || decode(string_agg(lpad(to_hex((octet_length(coalesce(data, ''))::bigint >> (8 * i)) & 255), 2, '0'), '' ORDER BY i), 'hex')
         || coalesce(data, '')
    FROM generate_series(0, 7) AS i
$$;
-- The fingerprint of fn with arguments of the given type names and send
-- forms (NULL for a NULL argument).
CREATE FUNCTION reference_hash(fn text, type_names text[], sent bytea[]) RETURNS text LANGUAGE sql IMMUTABLE AS $$
  SELECT encode(sha256(frame(1, convert_to(fn, 'UTF8'))
           || coalesce((SELECT string_agg(frame(4, convert_to(t, 'UTF8')), '' ORDER BY n)
                          FROM unnest(type_names) WITH ORDINALITY AS u(t, n)), '')
           || coalesce((SELECT string_agg(CASE WHEN v IS NULL THEN frame(3, NULL) ELSE frame(5, v) END, '' ORDER BY n)
                          FROM unnest(sent) WITH ORDINALITY AS u(v, n)), '')), 'hex')
$$;

CREATE TABLE cases (key text PRIMARY KEY, fn text, type_names text[], sent bytea[]);
INSERT INTO cases VALUES
  ('fp-none', 'SELECT 1', '{}', '{}'),
  ('fp-int4', 'SELECT $1', '{integer}', ARRAY[int4send(42)]),
  ('fp-int8', 'SELECT $1', '{bigint}', ARRAY[int8send(42)]),
  ('fp-numeric', 'SELECT $1', '{numeric}', ARRAY[numeric_send(12.50)]),
  ('fp-text', 'SELECT $1', '{pg_catalog.text}', ARRAY[textsend('forty-two')]),
  ('fp-bool', 'SELECT $1', '{boolean}', ARRAY[boolsend(true)]),
  ('fp-timestamptz', 'SELECT $1', '{"timestamp with time zone"}', ARRAY[timestamptz_send('2026-01-02 03:04:05')]),
  ('fp-jsonb', 'SELECT $1', '{pg_catalog.jsonb}', ARRAY[jsonb_send('{"b": [1, 2.0], "a": null}')]),
  ('fp-array', 'SELECT $1', '{integer[]}', ARRAY[array_send(ARRAY[1, NULL, 3])]),
  ('fp-null', 'SELECT $1', '{integer}', ARRAY[NULL::bytea]),
  ('fp-domain', 'SELECT $1', '{fingerprints.positive}', ARRAY[int4send(7)]),
  ('fp-enum', 'SELECT $1', '{fingerprints.mood}', ARRAY[enum_send('busy'::mood)]),
  ('fp-two', 'SELECT $1 || $2', '{pg_catalog.text,pg_catalog.text}', ARRAY[textsend('a'), NULL]);

SELECT idempotency.idempotent_call('fp-none', NULL, 'SELECT 1');
SELECT idempotency.idempotent_call('fp-int4', NULL, 'SELECT $1', 42);
SELECT idempotency.idempotent_call('fp-int8', NULL, 'SELECT $1', 42::int8);
SELECT idempotency.idempotent_call('fp-numeric', NULL, 'SELECT $1', 12.50);
SELECT idempotency.idempotent_call('fp-text', NULL, 'SELECT $1', 'forty-two'::text);
SELECT idempotency.idempotent_call('fp-bool', NULL, 'SELECT $1', true);
SELECT idempotency.idempotent_call('fp-timestamptz', NULL, 'SELECT $1', '2026-01-02 03:04:05'::timestamptz);
SELECT idempotency.idempotent_call('fp-jsonb', NULL, 'SELECT $1', '{"b": [1, 2.0], "a": null}'::jsonb);
SELECT idempotency.idempotent_call('fp-array', NULL, 'SELECT $1', ARRAY[1, NULL, 3]);
SELECT idempotency.idempotent_call('fp-null', NULL, 'SELECT $1', NULL::int);
SELECT idempotency.idempotent_call('fp-domain', NULL, 'SELECT $1', 7::positive);
SELECT idempotency.idempotent_call('fp-enum', NULL, 'SELECT $1', 'busy'::mood);
SELECT idempotency.idempotent_call('fp-two', NULL, 'SELECT $1 || $2', 'a'::text, NULL::text);

-- The stored fingerprints, pinned, and each equal to the recomputed one.
SELECT c.key, encode(k.request_hash, 'hex') AS request_hash,
       encode(k.request_hash, 'hex') = reference_hash(c.fn, c.type_names, c.sent) AS matches_encoding
  FROM cases AS c LEFT JOIN idempotency.keys AS k ON k.key = c.key
 ORDER BY c.key;

-- The fingerprint is of the value, not of how the session shows it: the
-- same instant written in another zone, and the same call under another
-- TimeZone and DateStyle, replay.
SET TimeZone = 'America/New_York';
SET DateStyle = 'SQL, DMY';
SELECT idempotency.idempotent_call('fp-timestamptz', NULL, 'SELECT $1', '2026-01-01 22:04:05-05'::timestamptz)
         IS NOT NULL AS answered,
       idempotency.last_call_replayed() AS replayed;
RESET DateStyle;
SET TimeZone = 'UTC';
-- numeric keeps its scale: 12.5 is another request than 12.50.
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('fp-numeric', NULL, 'SELECT $1', 12.5)$$);

DELETE FROM idempotency.keys WHERE key LIKE 'fp-%';
SET client_min_messages = warning;
DROP SCHEMA fingerprints CASCADE;
RESET client_min_messages;
RESET TimeZone;
RESET search_path;
