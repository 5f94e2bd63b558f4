-- idempotency 1.0 -> 1.1. Every object this version adds or changes is
-- also written, as it is now, in idempotency.sql (the fresh install):
-- test/tap/308_install_matches_upgrades.pl fails when the two differ.
\echo Use "ALTER EXTENSION idempotency UPDATE TO '1.1'" to load this file. \quit

-- Expiry status: the expired rows a round kept because a DBA's constraint,
-- index or trigger refused their tombstones (and the first refusal), and
-- the rounds that gave way to a lock or statement timeout. The function's
-- result gains columns, so it and its view are made again.
DROP VIEW idempotency.expiry_status;
DROP FUNCTION idempotency.expiry_status();

CREATE FUNCTION idempotency.expiry_status(
    OUT datid pg_catalog.oid,
    OUT running_since pg_catalog.timestamptz,
    OUT last_started pg_catalog.timestamptz,
    OUT last_finished pg_catalog.timestamptz,
    OUT last_deleted pg_catalog.int8,
    OUT last_error pg_catalog.text,
    OUT rounds pg_catalog.int8,
    OUT total_deleted pg_catalog.int8,
    OUT failed_rounds pg_catalog.int8,
    OUT last_kept pg_catalog.int8,
    OUT last_kept_reason pg_catalog.text,
    OUT skipped_rounds pg_catalog.int8)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'idempotency_expiry_status'
LANGUAGE C VOLATILE PARALLEL RESTRICTED;

CREATE VIEW idempotency.expiry_status AS
    SELECT s.datid, d.datname, s.running_since, s.last_started,
           s.last_finished,
           s.last_finished OPERATOR(pg_catalog.-) s.last_started AS last_duration,
           s.last_deleted, s.last_error, s.rounds, s.total_deleted,
           s.failed_rounds, s.last_kept, s.last_kept_reason, s.skipped_rounds
      FROM idempotency.expiry_status() AS s
      LEFT JOIN pg_catalog.pg_database AS d
        ON d.oid OPERATOR(pg_catalog.=) s.datid;

COMMENT ON VIEW idempotency.expiry_status IS
    'the expiry worker''s last round in each database where the extension is installed: when, how long, keys deleted, keys kept, error';

REVOKE ALL ON FUNCTION idempotency.expiry_status() FROM PUBLIC;
REVOKE ALL ON idempotency.expiry_status FROM PUBLIC;
GRANT EXECUTE ON FUNCTION idempotency.expiry_status() TO pg_monitor;
GRANT SELECT ON idempotency.expiry_status TO pg_monitor;
