-- The claim lock tag, pinned under a fixed secret: database, role, then 47
-- bits of HMAC-SHA256(secret, be32(database) || be32(role) || key). Every
-- backend of the cluster must derive the same tag for a key (two callers of
-- one key meet on one lock), so a silent change of the derivation would let
-- two backends of different builds (a rolling restart) miss each other.
-- The HMAC is written out in SQL below and checked against RFC 4231.
\i sql/include/setup.sql

CREATE SCHEMA claim_tag;
-- The cluster's secret as it was, put back at the end (NULL: none yet).
CREATE TABLE claim_tag.saved AS
  SELECT pg_read_binary_file('idempotency_claim_secret', 0, 32, true) AS secret;

CREATE FUNCTION claim_tag.write_secret(secret bytea) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
  lo oid := lo_from_bytea(0, secret);
BEGIN
  PERFORM lo_export(lo, current_setting('data_directory') || '/idempotency_claim_secret');
  PERFORM lo_unlink(lo);
END $$;

CREATE FUNCTION claim_tag.hmac_sha256(key bytea, message bytea) RETURNS bytea
LANGUAGE plpgsql AS $$
DECLARE
  k bytea := key || decode(repeat('00', 64 - length(key)), 'hex');
  inner_pad bytea := k;
  outer_pad bytea := k;
BEGIN
  FOR i IN 0..63 LOOP
    inner_pad := set_byte(inner_pad, i, get_byte(k, i) # 54);
    outer_pad := set_byte(outer_pad, i, get_byte(k, i) # 92);
  END LOOP;
  RETURN sha256(outer_pad || sha256(inner_pad || message));
END $$;

CREATE FUNCTION claim_tag.be32(value bigint) RETURNS bytea LANGUAGE sql AS
  $$ SELECT decode(lpad(to_hex(value), 8, '0'), 'hex') $$;

-- RFC 4231, test case 2.
SELECT encode(claim_tag.hmac_sha256(convert_to('Jefe', 'UTF8'),
                                    convert_to('what do ya want for nothing?', 'UTF8')), 'hex') AS rfc4231_case2;

-- The tag pg_locks should show for `key` claimed by the current role in
-- this database, under `secret`.
CREATE FUNCTION claim_tag.expected(secret bytea, key text,
                                   OUT classid bigint, OUT objid bigint, OUT objsubid int)
LANGUAGE sql AS $$
  WITH mac AS (
    SELECT claim_tag.hmac_sha256(secret,
             claim_tag.be32((SELECT oid FROM pg_database WHERE datname = current_database())::bigint) ||
             claim_tag.be32((SELECT oid FROM pg_roles WHERE rolname = current_user)::bigint) ||
             convert_to(key, current_setting('server_encoding'))) AS d)
  SELECT (SELECT oid FROM pg_roles WHERE rolname = current_user)::bigint,
         (get_byte(d, 0)::bigint << 24) | (get_byte(d, 1) << 16) | (get_byte(d, 2) << 8) | get_byte(d, 3),
         (32768 | (((get_byte(d, 4) << 8) | get_byte(d, 5)) & 32767)) - 65536
    FROM mac $$;

CREATE VIEW claim_tag.held AS
  SELECT classid::bigint, objid::bigint, objsubid::int FROM pg_locks
   WHERE pid = pg_backend_pid() AND locktype = 'advisory' AND objsubid < 0;

SELECT claim_tag.write_secret(decode('000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f', 'hex'));
-- A new backend reads the secret afresh.
\c

BEGIN;
SELECT replayed FROM idempotency.claim('tag-pinned', 'body');
SELECT held = expected AS pinned, held.objsubid < 0 AS claim_class
  FROM claim_tag.held AS held,
       claim_tag.expected(decode('000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f', 'hex'),
                          'tag-pinned') AS expected;
ROLLBACK;
-- A multi-byte key: its bytes in the database encoding.
BEGIN;
SELECT replayed FROM idempotency.claim('tag-é-ключ', 'body');
SELECT held = expected AS pinned
  FROM claim_tag.held AS held,
       claim_tag.expected(decode('000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f', 'hex'),
                          'tag-é-ключ') AS expected;
ROLLBACK;
-- The tag of idempotent_call is the same derivation (its lock is held while
-- fn runs).
CREATE FUNCTION claim_tag.locks_now() RETURNS jsonb LANGUAGE sql AS
  $$ SELECT jsonb_agg(jsonb_build_array(classid, objid, objsubid)) FROM claim_tag.held $$;
SELECT idempotency.idempotent_call('tag-call', NULL, 'SELECT claim_tag.locks_now()')
       = jsonb_build_array(jsonb_build_array(e.classid, e.objid, e.objsubid)) AS pinned
  FROM claim_tag.expected(decode('000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f', 'hex'),
                          'tag-call') AS e;
-- Another secret, another tag: the secret keys the MAC.
SELECT claim_tag.write_secret(decode(repeat('ab', 32), 'hex'));
\c
BEGIN;
SELECT replayed FROM idempotency.claim('tag-pinned-2', 'body');
SELECT held = expected AS pinned
  FROM claim_tag.held AS held,
       claim_tag.expected(decode(repeat('ab', 32), 'hex'), 'tag-pinned-2') AS expected;
ROLLBACK;

-- Put the cluster's secret back, for the backends of the files after this.
DO $$ BEGIN
  PERFORM claim_tag.write_secret(secret) FROM claim_tag.saved WHERE secret IS NOT NULL;
END $$;
\c
SET client_min_messages = warning;
DROP SCHEMA claim_tag CASCADE;
RESET client_min_messages;
