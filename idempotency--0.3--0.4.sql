-- idempotency 0.3 -> 0.4: a leaner key row and primary key.
\echo Use "ALTER EXTENSION idempotency UPDATE TO '0.4'" to load this file. \quit

-- key_usage reads whole rows; it is created again below, unchanged.
DROP VIEW idempotency.key_usage;

-- The primary key holds a digest of the key, not its text ------------------
--
-- A B-tree entry of (scope, key) took 56 bytes for a 36-character key and
-- more for longer ones; an entry of (scope, key_digest) takes 24 whatever
-- the key's length. Random keys touch a different leaf page almost every
-- insert and each page's first change after a checkpoint is written to the
-- WAL whole, so the index's size is what a new key costs in full-page
-- images. key_digest is the first 11 bytes of SHA-256 over the key's bytes
-- (in the database encoding); the key's text stays in the row, and every
-- lookup compares it. The digest depends on the key alone, so dumps, COPY
-- and logical replication carry it unchanged to any node of the same
-- database encoding; 0.6 digests the key's UTF-8 form instead, the same in
-- every encoding (idempotency--0.5--0.6.sql).
CREATE FUNCTION idempotency.key_digest(key pg_catalog.text)
RETURNS pg_catalog.bytea
AS 'MODULE_PATHNAME', 'idempotency_key_digest'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

COMMENT ON FUNCTION idempotency.key_digest(pg_catalog.text) IS
    'the digest of an idempotency key, as keys.key_digest holds it: find a key with WHERE key_digest = idempotency.key_digest(''...'')';

ALTER TABLE idempotency.keys ADD COLUMN key_digest pg_catalog.bytea;
-- The digest as 0.4 and 0.5 compute it, over the key's bytes in the
-- database encoding, written out: a later library's key_digest() digests
-- the UTF-8 form, and the update to 0.6 recomputes these.
UPDATE idempotency.keys
   SET key_digest = pg_catalog.substr(
         pg_catalog.sha256(pg_catalog.convert_to(key, pg_catalog.getdatabaseencoding())),
         1, 11);

-- The request fingerprint as 32 raw bytes instead of 64 hex digits ---------
--
-- Fingerprints stored by 0.3 are lower-case hex SHA-256 digests and become
-- the bytes they spell. Keys stored before 0.3 with a client's request_hash
-- hold the client's text itself: a text that spells a lower-case hex digest
-- becomes those bytes too, any other its SHA-256; a retry with the same text
-- still replays them. The type change rewrites the table, which also drops
-- the row versions the UPDATE above left behind.
ALTER TABLE idempotency.keys
    ALTER COLUMN request_hash TYPE pg_catalog.bytea USING (
        CASE WHEN request_hash OPERATOR(pg_catalog.~) '^[0-9a-f]{64}$'
             THEN pg_catalog.decode(request_hash, 'hex')
             ELSE pg_catalog.sha256(pg_catalog.convert_to(request_hash,
                      pg_catalog.current_setting('server_encoding')))
        END),
    ALTER COLUMN key_digest SET NOT NULL,
    DROP CONSTRAINT keys_pkey,
    ADD CONSTRAINT keys_pkey PRIMARY KEY (scope, key_digest);

COMMENT ON COLUMN idempotency.keys.key_digest IS
    'idempotency.key_digest(key): what the primary key holds in place of the key''s text';

-- No column keeps planner statistics (see 0.2--0.3): the new column too.
ALTER TABLE idempotency.keys ALTER COLUMN key_digest SET STATISTICS 0,
                             ALTER COLUMN request_hash SET STATISTICS 0;
DELETE FROM pg_catalog.pg_statistic AS s
 WHERE s.starelid OPERATOR(pg_catalog.=) 'idempotency.keys'::pg_catalog.regclass
    OR s.starelid OPERATOR(pg_catalog.=) ANY (
         SELECT i.indexrelid FROM pg_catalog.pg_index AS i
          WHERE i.indrelid OPERATOR(pg_catalog.=) 'idempotency.keys'::pg_catalog.regclass);

CREATE VIEW idempotency.key_usage AS
    SELECT k.scope::pg_catalog.regrole AS role,
           pg_catalog.count(*) AS keys,
           pg_catalog.sum(pg_catalog.pg_column_size(k.*))::pg_catalog.int8 AS bytes
      FROM idempotency.keys AS k
     GROUP BY k.scope;

COMMENT ON VIEW idempotency.key_usage IS
    'keys and bytes stored per role in this database, without keys or responses';

REVOKE ALL ON idempotency.key_usage FROM PUBLIC;
GRANT SELECT ON idempotency.key_usage TO pg_monitor;
