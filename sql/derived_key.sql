-- idempotency.derived_key(key, label): the key of a call the handler makes
-- outside the database, an HMAC-SHA256 under the database's secret over the
-- role, the key and the label (docs/downstream.md). Same role, key and
-- label: the same derived key, in every session; anything else, another.
\i sql/include/setup.sql
SET client_min_messages = warning;
DROP ROLE IF EXISTS regress_dk_alice;
DROP ROLE IF EXISTS regress_dk_bob;
DROP DATABASE IF EXISTS regress_dk_other;
RESET client_min_messages;
CREATE ROLE regress_dk_alice;
CREATE ROLE regress_dk_bob;

-- The install drew a secret of 32 bytes; pg_dump keeps it (a configuration
-- table of the extension). Nobody but its owner has rights on it.
SELECT octet_length(secret) AS secret_bytes,
       secret <> '\x0000000000000000000000000000000000000000000000000000000000000000'::bytea AS not_zero
  FROM idempotency.derived_key_secret;
SELECT 'idempotency.derived_key_secret'::regclass = ANY (extconfig) AS dumped
  FROM pg_extension WHERE extname = 'idempotency';
SELECT count(*) AS grants_to_others
  FROM pg_class, aclexplode(relacl) AS a
 WHERE oid = 'idempotency.derived_key_secret'::regclass AND a.grantee <> relowner;
SELECT provolatile, proparallel, proisstrict, prosecdef,
       has_function_privilege('regress_dk_alice', oid, 'EXECUTE') AS anyone_may_call
  FROM pg_proc WHERE oid = 'idempotency.derived_key(text, text)'::regprocedure;

-- The derivation, written out in SQL: HMAC-SHA256 (RFC 2104) keyed with the
-- secret over "idempotency derived-key v1", the role's OID (4 bytes,
-- big-endian), then the key and the label, each a tag (1: key, 3: label,
-- in UTF-8), its length (8 bytes, little-endian) and its bytes; the MAC's
-- first 16 bytes as a UUID of version 8.
CREATE FUNCTION dk_frame(tag int, value text) RETURNS bytea
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
  bytes bytea := convert_to(value, 'UTF8');
  header bytea := '\x000000000000000000'::bytea;
BEGIN
  header := set_byte(header, 0, tag);
  FOR i IN 0..7 LOOP
    header := set_byte(header, 1 + i, ((length(bytes)::bigint >> (8 * i)) & 255)::int);
  END LOOP;
  RETURN header || bytes;
END $$;
CREATE FUNCTION dk_reference(secret bytea, role oid, key text, label text) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
  block bytea := secret || decode(repeat('00', 64 - length(secret)), 'hex');
  inner_pad bytea := block;
  outer_pad bytea := block;
  message bytea;
  mac bytea;
BEGIN
  FOR i IN 0..63 LOOP
    inner_pad := set_byte(inner_pad, i, get_byte(block, i) # 54);
    outer_pad := set_byte(outer_pad, i, get_byte(block, i) # 92);
  END LOOP;
  message := convert_to('idempotency derived-key v1', 'UTF8')
             || substring(int8send(role::text::bigint) FROM 5 FOR 4)
             || dk_frame(1, key) || dk_frame(3, label);
  mac := sha256(outer_pad || sha256(inner_pad || message));
  mac := set_byte(mac, 6, (get_byte(mac, 6) & 15) | 128);
  mac := set_byte(mac, 8, (get_byte(mac, 8) & 63) | 128);
  RETURN encode(substring(mac FROM 1 FOR 16), 'hex')::uuid::text;
END $$;

-- Under a fixed secret (a superuser may set it: a rotation), the value is
-- pinned: a change of the derivation changes every derived key already
-- handed to a provider, and must fail here. The bootstrap superuser's OID
-- is 10 in every cluster.
UPDATE idempotency.derived_key_secret
   SET secret = '\x000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f';
SELECT current_user::regrole::oid AS superuser_oid,
       idempotency.derived_key('order-1', 'charge') AS pinned,
       idempotency.derived_key('order-1', 'charge')
         = dk_reference('\x000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f',
                        10, 'order-1', 'charge') AS as_written;

-- Deterministic; a UUID of version 8 (36 characters of [0-9a-f-]); the same
-- as written out for another role and for keys and labels of any length
-- and character.
SELECT idempotency.derived_key('order-1', 'charge') = idempotency.derived_key('order-1', 'charge') AS same,
       idempotency.derived_key('order-1', 'charge') ~ '^[0-9a-f]{8}-[0-9a-f]{4}-8[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$' AS uuid_v8,
       idempotency.derived_key('order-1', 'charge')::uuid::text = idempotency.derived_key('order-1', 'charge') AS casts;
SET ROLE regress_dk_alice;
SELECT idempotency.derived_key(k, l)
         = dk_reference('\x000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f',
                        'regress_dk_alice'::regrole, k, l) AS as_written
  FROM (VALUES ('order-1', 'charge'), ('k', 'l'), (repeat('x', 255), repeat('y', 255)),
               ('clé-€', 'étiquette ✓')) AS v(k, l);
RESET ROLE;

-- It changes with the role, the key and the label; framing keeps
-- ("ab", "c") and ("a", "bc") apart.
SELECT idempotency.derived_key('order-1', 'charge') AS superuser_key \gset
SET ROLE regress_dk_alice;
SELECT idempotency.derived_key('order-1', 'charge') AS alice_key \gset
SET ROLE regress_dk_bob;
SELECT idempotency.derived_key('order-1', 'charge') AS bob_key \gset
RESET ROLE;
SELECT :'alice_key' <> :'bob_key' AS by_role,
       :'alice_key' <> :'superuser_key' AS by_role_too,
       idempotency.derived_key('order-1', 'charge') <> idempotency.derived_key('order-2', 'charge') AS by_key,
       idempotency.derived_key('order-1', 'charge') <> idempotency.derived_key('order-1', 'email') AS by_label,
       idempotency.derived_key('ab', 'c') <> idempotency.derived_key('a', 'bc') AS framed,
       idempotency.derived_key('order-1', 'charge') <> idempotency.derived_key('charge', 'order-1') AS ordered;

-- A role cannot read, change or replace the secret: it cannot compute
-- another role's derived keys.
SET ROLE regress_dk_alice;
SELECT sqlstate_of($$SELECT secret FROM idempotency.derived_key_secret$$);
SELECT sqlstate_of($$UPDATE idempotency.derived_key_secret SET secret = secret$$);
SELECT sqlstate_of($$INSERT INTO idempotency.derived_key_secret VALUES ('\x00')$$);
SELECT sqlstate_of($$DELETE FROM idempotency.derived_key_secret$$);
SELECT sqlstate_of($$TRUNCATE idempotency.derived_key_secret$$);
RESET ROLE;

-- The same in another session.
\c -
SET ROLE regress_dk_alice;
SELECT idempotency.derived_key('order-1', 'charge') = :'alice_key' AS alice_again;
RESET ROLE;

-- Arguments are checked like a call's key: 22004 for NULL, 22023 for empty
-- or over 255 bytes; 255 bytes are fine.
SELECT sqlstate_of($$SELECT idempotency.derived_key(NULL, 'charge')$$);
SELECT sqlstate_of($$SELECT idempotency.derived_key('order-1', NULL)$$);
SELECT sqlstate_of($$SELECT idempotency.derived_key('', 'charge')$$);
SELECT sqlstate_of($$SELECT idempotency.derived_key('order-1', '')$$);
SELECT sqlstate_of($$SELECT idempotency.derived_key(repeat('k', 256), 'charge')$$);
SELECT sqlstate_of($$SELECT idempotency.derived_key('order-1', repeat('l', 256))$$);
SELECT length(idempotency.derived_key(repeat('k', 255), repeat('l', 255))) AS longest;

-- A rotation changes every derived key; a row inserted replaces the one
-- there (a restore's COPY replaces the secret CREATE EXTENSION drew). The
-- secret is 32 bytes.
UPDATE idempotency.derived_key_secret SET secret = sha256('rotated');
SELECT idempotency.derived_key('order-1', 'charge') <> :'superuser_key' AS rotated;
INSERT INTO idempotency.derived_key_secret
VALUES ('\x000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f');
SELECT count(*) AS rows, idempotency.derived_key('order-1', 'charge') = :'superuser_key' AS restored
  FROM idempotency.derived_key_secret;
SELECT sqlstate_of($$INSERT INTO idempotency.derived_key_secret VALUES (sha224('short'))$$);

-- Without a secret, no derived key: 55000, never a key derived from none.
BEGIN;
DELETE FROM idempotency.derived_key_secret;
SELECT sqlstate_of($$SELECT idempotency.derived_key('order-1', 'charge')$$);
ROLLBACK;
BEGIN;
ALTER TABLE idempotency.derived_key_secret DROP CONSTRAINT derived_key_secret_size;
UPDATE idempotency.derived_key_secret SET secret = '\x01';
SELECT sqlstate_of($$SELECT idempotency.derived_key('order-1', 'charge')$$);
ROLLBACK;

-- Another database has a secret of its own, hence other derived keys.
SELECT current_database() AS regress_db \gset
CREATE DATABASE regress_dk_other;
\c regress_dk_other
SET client_min_messages = warning;
CREATE EXTENSION idempotency;
RESET client_min_messages;
SELECT idempotency.derived_key('order-1', 'charge') <> :'superuser_key' AS by_database;
\c :regress_db
DROP DATABASE regress_dk_other;

DROP FUNCTION dk_reference(bytea, oid, text, text);
DROP FUNCTION dk_frame(int, text);
DROP ROLE regress_dk_alice;
DROP ROLE regress_dk_bob;
