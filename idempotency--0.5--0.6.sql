-- idempotency 0.5 -> 0.6: a request's identity and a key's identity that
-- survive any driver, any encoding and any database operation.
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
-- 12-byte value that no digest has. Calls wait meanwhile (they may read):
-- a key stored under its old digest during the update would be missed
-- after it.
DO $$
BEGIN
  IF pg_catalog.getdatabaseencoding() OPERATOR(pg_catalog.=) ANY (ARRAY['UTF8', 'SQL_ASCII']) THEN
    RETURN;
  END IF;
  LOCK TABLE idempotency.keys IN SHARE ROW EXCLUSIVE MODE;
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

-- Every version's dump loads into this one ----------------------------------
--
-- pg_restore creates the extension at the current version, then copies the
-- dumped version's columns into idempotency.keys: 0.1 and 0.2 (scope as a
-- regrole, request_hash as text, status), 0.3 (scope as a role_scope,
-- request_hash as text, no key_digest), 0.4 and 0.5 (these columns, whose
-- key_digest is over the database encoding). So that each of these loads:
--
-- - the table keeps a column status, as 0.1 and 0.2 had it, which nothing
--   writes: it stays NULL. A call writes its row without trailing NULL
--   columns, so that the row header keeps 24 bytes (a null bitmap for the
--   nine columns, 0.3's dropped status included, would make it 32);
-- - a BEFORE INSERT row trigger computes key_digest from the key and, for
--   a row without key_digest (the layout before 0.4), makes request_hash
--   the fingerprint the update to 0.4 makes of the stored text. The text
--   reaches it read as bytea: a text with a backslash is read as bytea
--   escapes (docs/maintenance.md says how to restore such a dump).
--
-- idempotent_call writes every column itself: its store leaves the trigger
-- out, so a call never runs it. ALWAYS: logical replication's apply runs
-- it too (a publisher of another encoding or an older version).
ALTER TABLE idempotency.keys ADD COLUMN status pg_catalog.text;
ALTER TABLE idempotency.keys ALTER COLUMN status SET STATISTICS 0;

COMMENT ON COLUMN idempotency.keys.status IS
    'always NULL: accepts the status column of dumps made by 0.1 and 0.2';

CREATE FUNCTION idempotency.keys_loaded()
RETURNS trigger
AS 'MODULE_PATHNAME', 'idempotency_keys_loaded'
LANGUAGE C;

COMMENT ON FUNCTION idempotency.keys_loaded() IS
    'fills key_digest (and converts request_hash of rows dumped before 0.4) for rows loaded into idempotency.keys by COPY or INSERT';

REVOKE ALL ON FUNCTION idempotency.keys_loaded() FROM PUBLIC;

CREATE TRIGGER keys_loaded BEFORE INSERT ON idempotency.keys
    FOR EACH ROW EXECUTE FUNCTION idempotency.keys_loaded();
ALTER TABLE idempotency.keys ENABLE ALWAYS TRIGGER keys_loaded;
