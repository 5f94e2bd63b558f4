-- The key-row designs bench/wal-per-key compares, as plain tables in schema
-- designs, written by plain INSERTs: SQL prototypes of today's row and of
-- the candidates, beside the extension's own idempotency.keys (written by
-- idempotent_call). Every table holds the same columns a key row holds
-- (scope, key, request fingerprint, response, times); what differs is how
-- the row is indexed. Run as superuser in a database with the extension.

CREATE SCHEMA designs;

-- The digests the designs index, computed in SQL (the extension computes
-- its own in C).

-- Today's digest: the first 11 bytes of SHA-256 over the key's UTF-8 bytes.
CREATE FUNCTION designs.digest11(k text) RETURNS bytea
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$ SELECT substr(sha256(convert_to(k, 'UTF8')), 1, 11) $$;

-- An order-preserving digest that follows the key's own order when the key
-- has one, and is today's digest otherwise:
--   UUIDv7 text: its 48-bit millisecond timestamp (6 bytes), then 8 bytes of
--     SHA-256 of the whole key;
--   a key ending in 6 to 18 digits after a prefix that is empty or holds a
--     character other than hex digits and '-' (a sequential business id
--     such as 'order-000000123'): 8 bytes of SHA-256 over what precedes the digits
--     and their count, then the number (8 bytes, big-endian), so the ids of
--     one prefix are in numeric order;
--   any other key: digest11.
CREATE FUNCTION designs.shaped_digest(k text) RETURNS bytea
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
DECLARE
    digits text;
BEGIN
    IF k ~ '^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-7[0-9a-fA-F]{3}-[89abAB][0-9a-fA-F]{3}-[0-9a-fA-F]{12}$' THEN
        RETURN decode(substr(k, 1, 8) || substr(k, 10, 4), 'hex')
               || substr(sha256(convert_to(k, 'UTF8')), 1, 8);
    END IF;
    digits := substring(k FROM '[0-9]+$');
    IF digits IS NOT NULL AND length(digits) BETWEEN 6 AND 18
       AND left(k, length(k) - length(digits)) !~ '^[0-9a-fA-F-]+$' THEN
        RETURN substr(sha256(convert_to(left(k, length(k) - length(digits)) || ':' || length(digits), 'UTF8')), 1, 8)
               || int8send(digits::bigint);
    END IF;
    RETURN designs.digest11(k);
END
$$;

-- The key's first 16 bytes, then 8 bytes of SHA-256 of the whole key when
-- it is longer: follows the key's order for any key whose varying part is
-- within its first 16 bytes, at the price of larger index entries.
CREATE FUNCTION designs.prefix16(k text) RETURNS bytea
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT CASE WHEN octet_length(b) <= 16 THEN b
                ELSE substr(b, 1, 16) || substr(sha256(b), 1, 8) END
      FROM convert_to(k, 'UTF8') AS b
$$;

-- 8 bytes of SHA-256 over the scope and the key, as a bigint: the smallest
-- B-tree entry there is (16 bytes), unique across all roles.
CREATE FUNCTION designs.digest8(scope oid, k text) RETURNS bigint
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$ SELECT ('x' || encode(substr(sha256(int4send(scope::int) || convert_to(k, 'UTF8')), 1, 8), 'hex'))::bit(64)::bigint $$;

-- The tables. A dropped column at the 4th position, as idempotency.keys
-- has one since 0.3, and no trailing status column (idempotent_call writes
-- rows without their trailing NULL columns), so the heap rows are those the
-- extension writes.
CREATE FUNCTION designs.key_table(name text, digest_type text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format($t$
        CREATE TABLE designs.%I (
            scope        idempotency.role_scope NOT NULL,
            key          text COLLATE "C" NOT NULL,
            request_hash bytea NOT NULL,
            dropped      int,
            response     jsonb,
            created_at   timestamptz NOT NULL,
            expires_at   timestamptz NOT NULL,
            key_digest   %s NOT NULL)$t$, name, digest_type);
    EXECUTE format('ALTER TABLE designs.%I DROP COLUMN dropped', name);
END
$$;

-- row: today's row, a prototype of idempotency.keys.
SELECT designs.key_table('row', 'bytea');
ALTER TABLE designs.row ADD PRIMARY KEY (scope, key_digest);
CREATE INDEX ON designs.row (expires_at idempotency.expiry_ops);

-- noexp: today's row without the expires_at index (expiry would go by heap
-- order, or by a structure the worker maintains).
SELECT designs.key_table('noexp', 'bytea');
ALTER TABLE designs.noexp ADD PRIMARY KEY (scope, key_digest);

-- brin: today's row with a BRIN index on expires_at instead of a B-tree.
SELECT designs.key_table('brin', 'bytea');
ALTER TABLE designs.brin ADD PRIMARY KEY (scope, key_digest);
CREATE INDEX ON designs.brin USING brin (expires_at);

-- shaped: today's row with the order-preserving digest.
SELECT designs.key_table('shaped', 'bytea');
ALTER TABLE designs.shaped ADD PRIMARY KEY (scope, key_digest);
CREATE INDEX ON designs.shaped (expires_at idempotency.expiry_ops);

-- shapednx: the order-preserving digest and no expires_at index.
SELECT designs.key_table('shapednx', 'bytea');
ALTER TABLE designs.shapednx ADD PRIMARY KEY (scope, key_digest);

-- prefix16: the key's leading bytes, then a hash of the rest.
SELECT designs.key_table('prefix16', 'bytea');
ALTER TABLE designs.prefix16 ADD PRIMARY KEY (scope, key_digest);
CREATE INDEX ON designs.prefix16 (expires_at idempotency.expiry_ops);

-- digest8: one 8-byte digest of scope and key, unique on its own.
SELECT designs.key_table('digest8', 'bigint');
ALTER TABLE designs.digest8 ADD PRIMARY KEY (key_digest);
CREATE INDEX ON designs.digest8 (expires_at idempotency.expiry_ops);

-- compact: the key itself as the index key where it has a lossless compact
-- form, no digest beside it: a canonical UUID (lowercase 8-4-4-4-12, as
-- uuid's own output) as its 16 bytes, 64 lowercase hex digits as their 32
-- bytes, and the key's text column NULL (the text is the compact form's
-- output). Any other key keeps its text and the order-preserving digest
-- (sequential ids: as in the shaped row). The index column keeps the name
-- key_digest; it holds the compact key or the digest. A UUIDv7's 16 bytes
-- begin with its timestamp, so they keep its order without a digest. (A
-- shipped row would need a kind byte or distinct lengths: a UUID's 16 bytes
-- and a sequential id's 16-byte digest share a length.)
SELECT designs.key_table('compact', 'bytea');
ALTER TABLE designs.compact ALTER COLUMN key DROP NOT NULL;
ALTER TABLE designs.compact ADD PRIMARY KEY (scope, key_digest);
CREATE INDEX ON designs.compact (expires_at idempotency.expiry_ops);

-- compactnx: the compact row without the expires_at index.
SELECT designs.key_table('compactnx', 'bytea');
ALTER TABLE designs.compactnx ALTER COLUMN key DROP NOT NULL;
ALTER TABLE designs.compactnx ADD PRIMARY KEY (scope, key_digest);

-- floor: a plain INSERT of the same row into a plain table with a plain
-- primary key on the key's text (what an application table would be),
-- no digest, no expires_at index.
CREATE TABLE designs.floor (
    scope        oid NOT NULL,
    key          text COLLATE "C" NOT NULL,
    request_hash bytea NOT NULL,
    response     jsonb,
    created_at   timestamptz NOT NULL,
    expires_at   timestamptz NOT NULL,
    PRIMARY KEY (scope, key)
);

-- A key's lossless compact form, NULL when it has none: a canonical UUID's
-- 16 bytes, 64 lowercase hex digits' 32 bytes.
CREATE FUNCTION designs.compact_key(k text) RETURNS bytea
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT CASE
        WHEN k ~ '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'
            THEN decode(replace(k, '-', ''), 'hex')
        WHEN k ~ '^[0-9a-f]{64}$' THEN decode(k, 'hex')
    END
$$;

-- The digest each design stores for a key.
CREATE FUNCTION designs.digest_for(design text, scope oid, k text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE design
        WHEN 'shaped' THEN 'designs.shaped_digest(k)'
        WHEN 'shapednx' THEN 'designs.shaped_digest(k)'
        WHEN 'prefix16' THEN 'designs.prefix16(k)'
        WHEN 'digest8' THEN 'designs.digest8(s.scope_oid, k)'
        ELSE 'designs.digest11(k)' END
$$;

-- Inserts the keys of designs.batch numbered from..to into one design's
-- table, as one statement; 'ext' calls idempotent_call for each instead.
CREATE FUNCTION designs.insert_keys(design text, from_i bigint, to_i bigint)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF design = 'ext-fill' THEN
        INSERT INTO idempotency.keys (scope, key, key_digest, request_hash, response, created_at, expires_at)
        SELECT 'bench'::idempotency.role_scope, b.k, idempotency.key_digest(b.k),
               sha256(convert_to(b.k, 'UTF8')), '{"balance": 1, "entry": 1}',
               clock_timestamp(), clock_timestamp() + interval '1 day'
          FROM designs.batch AS b WHERE b.i BETWEEN from_i AND to_i;
    ELSIF design = 'ext' THEN
        PERFORM count(idempotency.idempotent_call(b.k, NULL,
                    'SELECT pg_catalog.jsonb_build_object(''balance'', 1, ''entry'', $1)', 1))
           FROM designs.batch AS b WHERE b.i BETWEEN from_i AND to_i;
    ELSIF design = 'floor' THEN
        INSERT INTO designs.floor
        SELECT 'bench'::regrole::oid, b.k, sha256(convert_to(b.k, 'UTF8')), '{"balance": 1, "entry": 1}',
               clock_timestamp(), clock_timestamp() + interval '1 day'
          FROM designs.batch AS b WHERE b.i BETWEEN from_i AND to_i;
    ELSIF design IN ('compact', 'compactnx') THEN
        EXECUTE format($i$
            INSERT INTO designs.%I (scope, key, request_hash, response, created_at, expires_at, key_digest)
            SELECT 'bench'::idempotency.role_scope, CASE WHEN c.compact IS NULL THEN b.k END,
                   sha256(convert_to(b.k, 'UTF8')), '{"balance": 1, "entry": 1}',
                   clock_timestamp(), clock_timestamp() + interval '1 day',
                   coalesce(c.compact, designs.shaped_digest(b.k))
              FROM designs.batch AS b, LATERAL (SELECT designs.compact_key(b.k) AS compact) AS c
             WHERE b.i BETWEEN $1 AND $2$i$, design)
        USING from_i, to_i;
    ELSE
        EXECUTE format($i$
            INSERT INTO designs.%I (scope, key, request_hash, response, created_at, expires_at, key_digest)
            SELECT s.scope, b.k, sha256(convert_to(b.k, 'UTF8')), '{"balance": 1, "entry": 1}',
                   clock_timestamp(), clock_timestamp() + interval '1 day', %s
              FROM designs.batch AS b, (SELECT 'bench'::idempotency.role_scope AS scope, 'bench'::regrole::oid AS scope_oid) AS s
             WHERE b.i BETWEEN $1 AND $2$i$, design, designs.digest_for(design, 0, 'k'))
        USING from_i, to_i;
    END IF;
END
$$;

-- The keys of one window: numbered, generated in order (UUIDv7 keys and
-- sequential ids increase with i).
CREATE UNLOGGED TABLE designs.batch (i bigint PRIMARY KEY, k text NOT NULL);
CREATE SEQUENCE designs.order_ids;

-- UUIDv7 as RFC 9562 lays it out: 48 bits of milliseconds since the epoch,
-- the version, random bits.
CREATE FUNCTION designs.uuid7() RETURNS text LANGUAGE sql VOLATILE AS $$
    SELECT lpad(to_hex((extract(epoch FROM clock_timestamp()) * 1000)::bigint), 12, '0')
           || '7' || substr(md5(random()::text), 1, 3)
           || substr('89ab', 1 + floor(random() * 4)::int, 1)
           || substr(md5(random()::text), 1, 15)
$$;

CREATE FUNCTION designs.as_uuid_text(h text) RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT substr(h, 1, 8) || '-' || substr(h, 9, 4) || '-' || substr(h, 13, 4) || '-'
           || substr(h, 17, 4) || '-' || substr(h, 21, 12)
$$;

CREATE FUNCTION designs.new_key(shape text) RETURNS text LANGUAGE sql VOLATILE AS $$
    SELECT CASE shape
        WHEN 'uuid4' THEN gen_random_uuid()::text
        WHEN 'uuid7' THEN designs.as_uuid_text(designs.uuid7())
        WHEN 'seq' THEN 'order-' || lpad(nextval('designs.order_ids')::text, 9, '0')
        WHEN 'hex64' THEN encode(sha256(gen_random_uuid()::text::bytea), 'hex')
    END
$$;

CREATE FUNCTION designs.fill_batch(shape text, n bigint) RETURNS void
LANGUAGE sql AS $$
    TRUNCATE designs.batch;
    INSERT INTO designs.batch SELECT i, designs.new_key(shape) FROM generate_series(1, n) AS i;
$$;
