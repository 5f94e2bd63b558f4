-- idempotency 1.0 -> 1.1. Every object this version adds or changes is
-- also written, as it is now, in idempotency.sql (the fresh install):
-- test/tap/308_install_matches_upgrades.pl fails when the two differ.
\echo Use "ALTER EXTENSION idempotency UPDATE TO '1.1'" to load this file. \quit

-- The expiry index's order: estimators, a merge-joinable equality, LEAKPROOF
-- copies ---------------------------------------------------------------------
--
-- The B-tree family of keys_expires_at_idx, as catalog checks such as
-- PostgreSQL's opr_sanity expect it: each operator with timestamptz's
-- estimators, the equality merge-joinable and its own commutator, and the
-- functions, copies of the server's timestamp_* kept for their revoked
-- rights, LEAKPROOF as those are (idempotency.sql says why they exist).
ALTER FUNCTION idempotency.expiry_lt(pg_catalog.timestamptz, pg_catalog.timestamptz) LEAKPROOF;
ALTER FUNCTION idempotency.expiry_le(pg_catalog.timestamptz, pg_catalog.timestamptz) LEAKPROOF;
ALTER FUNCTION idempotency.expiry_eq(pg_catalog.timestamptz, pg_catalog.timestamptz) LEAKPROOF;
ALTER FUNCTION idempotency.expiry_ge(pg_catalog.timestamptz, pg_catalog.timestamptz) LEAKPROOF;
ALTER FUNCTION idempotency.expiry_gt(pg_catalog.timestamptz, pg_catalog.timestamptz) LEAKPROOF;
ALTER FUNCTION idempotency.expiry_cmp(pg_catalog.timestamptz, pg_catalog.timestamptz) LEAKPROOF;

ALTER OPERATOR idempotency.~<~ (pg_catalog.timestamptz, pg_catalog.timestamptz)
    SET (RESTRICT = pg_catalog.scalarltsel, JOIN = pg_catalog.scalarltjoinsel);
ALTER OPERATOR idempotency.~<=~ (pg_catalog.timestamptz, pg_catalog.timestamptz)
    SET (RESTRICT = pg_catalog.scalarlesel, JOIN = pg_catalog.scalarlejoinsel);
ALTER OPERATOR idempotency.~=~ (pg_catalog.timestamptz, pg_catalog.timestamptz)
    SET (RESTRICT = pg_catalog.eqsel, JOIN = pg_catalog.eqjoinsel);
ALTER OPERATOR idempotency.~>=~ (pg_catalog.timestamptz, pg_catalog.timestamptz)
    SET (RESTRICT = pg_catalog.scalargesel, JOIN = pg_catalog.scalargejoinsel);
ALTER OPERATOR idempotency.~>~ (pg_catalog.timestamptz, pg_catalog.timestamptz)
    SET (RESTRICT = pg_catalog.scalargtsel, JOIN = pg_catalog.scalargtjoinsel);

-- ALTER OPERATOR sets COMMUTATOR and MERGES from PostgreSQL 17 on. Before
-- 17 the two columns are written as CREATE OPERATOR ... COMMUTATOR, MERGES
-- writes them for a fresh install (neither records a dependency): making
-- the operator again would drop its operator class, hence
-- keys_expires_at_idx, and rebuild the index over every key under an
-- exclusive lock. EXECUTE: before 17 the statement does not even parse.
DO $$
BEGIN
  IF pg_catalog.current_setting('server_version_num')::pg_catalog.int4 OPERATOR(pg_catalog.>=) 170000 THEN
    EXECUTE 'ALTER OPERATOR idempotency.~=~ (pg_catalog.timestamptz, pg_catalog.timestamptz)
                 SET (COMMUTATOR = OPERATOR(idempotency.~=~), MERGES)';
  ELSE
    UPDATE pg_catalog.pg_operator
       SET oprcom = oid, oprcanmerge = true
     WHERE oid OPERATOR(pg_catalog.=)
           'idempotency.~=~(pg_catalog.timestamptz,pg_catalog.timestamptz)'::pg_catalog.regoperator;
  END IF;
END
$$;
