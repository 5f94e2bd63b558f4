-- idempotency 0.5 -> 0.6: a request's identity and a key's identity that
-- survive any driver, any encoding and any database operation. A fresh
-- install runs 0.1 and every update script in order.
\echo Use "ALTER EXTENSION idempotency UPDATE TO '0.6'" to load this file. \quit

-- A key's digest over its UTF-8 form --------------------------------------
--
-- 0.4 and 0.5 digested a key's bytes in the database encoding, and dumps,
-- COPY and logical replication carry key_digest unchanged while they
-- convert the key's text: a LATIN1 database restored into a UTF8 one lost
-- every key beyond ASCII, whose retries then ran again. From 0.6 on,
-- idempotency.key_digest(key) digests the key's UTF-8 form in every
-- database encoding, which any node computes alike. In a UTF8 database
-- nothing changes, nor in an SQL_ASCII one, whose bytes are digested as
-- they are; in other encodings the digests of keys beyond ASCII change and
-- are recomputed here. One row's new digest may be another row's old one
-- (UTF-8 bytes read as LATIN1 spell another key) and the primary key is
-- checked row by row, so every digest first moves out of the way, to a
-- 12-byte value that no digest has.
DO $$
BEGIN
  IF pg_catalog.getdatabaseencoding() OPERATOR(pg_catalog.=) ANY (ARRAY['UTF8', 'SQL_ASCII']) THEN
    RETURN;
  END IF;
  UPDATE idempotency.keys
     SET key_digest = '\xff'::pg_catalog.bytea OPERATOR(pg_catalog.||) key_digest;
  UPDATE idempotency.keys SET key_digest = idempotency.key_digest(key);
  IF pg_catalog.to_regclass('idempotency.tenant_keys') IS NOT NULL THEN
    UPDATE idempotency.tenant_keys
       SET key_digest = '\xff'::pg_catalog.bytea OPERATOR(pg_catalog.||) key_digest;
    UPDATE idempotency.tenant_keys SET key_digest = idempotency.key_digest(key);
  END IF;
END
$$;

-- Until this point the library looks keys up by their old digest in such a
-- database (it reads the extension's version when it locates the table's
-- columns); this statement changes nothing but makes every session locate
-- them again.
ALTER TABLE idempotency.keys ALTER COLUMN key_digest SET STATISTICS 0;
