-- idempotency 0.2 -> 0.3: every change to the key row and the objects around
-- it that this version makes. A fresh install runs 0.1, 0.1--0.2 and this
-- script in order.
\echo Use "ALTER EXTENSION idempotency UPDATE TO '0.3'" to load this file. \quit


-- Role isolation: statistics and usage.
--
-- Row-level security hides other roles' rows, but the planner may still use
-- the table's statistics for leakproof operators such as text comparisons:
-- row estimates of EXPLAIN would tell any role the text of other roles' keys
-- (a binary search over `key < 'm'`) and how many keys a role holds
-- (`scope = ...`). No statistics are gathered for any column of the table,
-- and those gathered before are removed, so estimates come from the table's
-- size alone (pg_class.reltuples, which PostgreSQL shows every role
-- anyway). Calls and the expiry worker never plan a query on the table; the
-- statistics view counts with a scan.
DO $$
DECLARE
  col pg_catalog.name;
BEGIN
  FOR col IN
    SELECT a.attname FROM pg_catalog.pg_attribute AS a
     WHERE a.attrelid OPERATOR(pg_catalog.=) 'idempotency.keys'::pg_catalog.regclass
       AND a.attnum OPERATOR(pg_catalog.>) 0 AND NOT a.attisdropped
  LOOP
    EXECUTE pg_catalog.format(
      'ALTER TABLE idempotency.keys ALTER COLUMN %I SET STATISTICS 0', col);
  END LOOP;
END
$$;
DELETE FROM pg_catalog.pg_statistic AS s
 WHERE s.starelid OPERATOR(pg_catalog.=) 'idempotency.keys'::pg_catalog.regclass
    OR s.starelid OPERATOR(pg_catalog.=) ANY (
         SELECT i.indexrelid FROM pg_catalog.pg_index AS i
          WHERE i.indrelid OPERATOR(pg_catalog.=) 'idempotency.keys'::pg_catalog.regclass);

-- How many keys each role keeps and how many bytes their rows take (the
-- row as stored, response included, compressed where PostgreSQL compressed
-- it). It runs with its owner's rights, so it counts every role's keys while
-- showing no key or response; only monitoring roles may read it. It depends
-- on keys.scope, so it comes after any change to that column.
CREATE VIEW idempotency.key_usage AS
    SELECT k.scope AS role,
           pg_catalog.count(*) AS keys,
           pg_catalog.sum(pg_catalog.pg_column_size(k.*))::pg_catalog.int8 AS bytes
      FROM idempotency.keys AS k
     GROUP BY k.scope;

COMMENT ON VIEW idempotency.key_usage IS
    'keys and bytes stored per role in this database, without keys or responses';

REVOKE ALL ON idempotency.key_usage FROM PUBLIC;
GRANT SELECT ON idempotency.key_usage TO pg_monitor;
