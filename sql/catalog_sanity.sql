-- The extension's functions and operators pass the checks PostgreSQL's own
-- catalog sanity test (opr_sanity) makes of the server's: each query below
-- is one of them, narrowed to the extension's objects, and finds nothing.
\i sql/include/setup.sql

CREATE TEMP VIEW ext_objects AS
SELECT d.classid, d.objid
  FROM pg_depend AS d
 WHERE d.refclassid = 'pg_extension'::regclass
   AND d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'idempotency')
   AND d.deptype = 'e';
CREATE TEMP VIEW ext_operators AS
SELECT o.* FROM pg_operator AS o
 WHERE o.oid IN (SELECT objid FROM ext_objects WHERE classid = 'pg_operator'::regclass);
CREATE TEMP VIEW ext_amops AS
SELECT a.* FROM pg_amop AS a
 WHERE a.amopfamily IN (SELECT objid FROM ext_objects WHERE classid = 'pg_opfamily'::regclass);

-- The operators as the planner sees them.
SELECT o.oprleft::regtype AS type, o.oprname AS operator,
       (SELECT c.oprname FROM pg_operator AS c WHERE c.oid = o.oprcom) AS commutator,
       (SELECT n.oprname FROM pg_operator AS n WHERE n.oid = o.oprnegate) AS negator,
       o.oprrest AS restrict, o.oprjoin AS join, o.oprcanmerge AS merges,
       o.oprcanhash AS hashes
  FROM ext_operators AS o
 ORDER BY o.oprleft::regtype::text, o.oprname;

-- Copies of one internal function agree with each other, the server's
-- included, in everything but their types: kind, SECURITY DEFINER,
-- LEAKPROOF, STRICT, set-returning, volatility, number of arguments.
SELECT p1.oid::regprocedure AS copy, p2.oid::regprocedure AS server_function
  FROM pg_proc AS p1, pg_proc AS p2
 WHERE p1.oid IN (SELECT objid FROM ext_objects WHERE classid = 'pg_proc'::regclass)
   AND p1.oid <> p2.oid AND p1.prosrc = p2.prosrc
   AND p1.prolang = 12 AND p2.prolang = 12
   AND (p1.prokind <> p2.prokind OR p1.prosecdef <> p2.prosecdef
        OR p1.proleakproof <> p2.proleakproof OR p1.proisstrict <> p2.proisstrict
        OR p1.proretset <> p2.proretset OR p1.provolatile <> p2.provolatile
        OR p1.pronargs <> p2.pronargs)
 ORDER BY 1::text, 2::text;

-- Commutators and negators point back, between operators of matching types.
SELECT o1.oid::regoperator, o2.oid::regoperator
  FROM ext_operators AS o1, pg_operator AS o2
 WHERE o1.oprcom = o2.oid
   AND (o1.oprkind <> 'b' OR o1.oprleft <> o2.oprright OR o1.oprright <> o2.oprleft
        OR o1.oprresult <> o2.oprresult OR o1.oid <> o2.oprcom);
SELECT o1.oid::regoperator, o2.oid::regoperator
  FROM ext_operators AS o1, pg_operator AS o2
 WHERE o1.oprnegate = o2.oid
   AND (o1.oprkind <> o2.oprkind OR o1.oprleft <> o2.oprleft
        OR o1.oprright <> o2.oprright OR o1.oprresult <> 'bool'::regtype
        OR o2.oprresult <> 'bool'::regtype OR o1.oid <> o2.oprnegate
        OR o1.oid = o2.oid);

-- A merge- or hash-joinable operator is binary, boolean, has a commutator
-- that merges and hashes alike, and a function that is not volatile.
SELECT o.oid::regoperator FROM ext_operators AS o
 WHERE (o.oprcanmerge OR o.oprcanhash)
   AND NOT (o.oprkind = 'b' AND o.oprresult = 'bool'::regtype AND o.oprcom <> 0);
SELECT o1.oid::regoperator, o2.oid::regoperator
  FROM ext_operators AS o1, pg_operator AS o2
 WHERE o1.oprcom = o2.oid
   AND (o1.oprcanmerge <> o2.oprcanmerge OR o1.oprcanhash <> o2.oprcanhash);
SELECT o.oid::regoperator FROM ext_operators AS o JOIN pg_proc AS p ON p.oid = o.oprcode
 WHERE (o.oprcanmerge OR o.oprcanhash) AND p.provolatile = 'v';

-- An operator merges exactly when it is the equality of a B-tree family,
-- and hashes exactly when it is a member of a hash family.
SELECT o.oid::regoperator FROM ext_operators AS o
 WHERE o.oprcanmerge AND NOT EXISTS
       (SELECT 1 FROM pg_amop
         WHERE amopmethod = (SELECT oid FROM pg_am WHERE amname = 'btree')
           AND amopopr = o.oid AND amopstrategy = 3);
SELECT a.amopfamily::regclass::text, a.amopopr::regoperator FROM ext_amops AS a
  JOIN pg_operator AS o ON o.oid = a.amopopr
 WHERE a.amopmethod = (SELECT oid FROM pg_am WHERE amname = 'btree')
   AND a.amopstrategy = 3 AND NOT o.oprcanmerge;
SELECT o.oid::regoperator FROM ext_operators AS o
 WHERE o.oprcanhash AND NOT EXISTS
       (SELECT 1 FROM pg_amop
         WHERE amopmethod = (SELECT oid FROM pg_am WHERE amname = 'hash')
           AND amopopr = o.oid AND amopstrategy = 1);
SELECT a.amopopr::regoperator FROM ext_amops AS a
  JOIN pg_operator AS o ON o.oid = a.amopopr
 WHERE a.amopmethod = (SELECT oid FROM pg_am WHERE amname = 'hash')
   AND NOT o.oprcanhash;

-- Every search operator of the extension's families has a restriction and
-- a join estimator, and in a B-tree family the ones of its strategy.
SELECT a.amopopr::regoperator FROM ext_amops AS a
  JOIN pg_operator AS o ON o.oid = a.amopopr
 WHERE a.amoppurpose = 's' AND (o.oprrest = 0 OR o.oprjoin = 0);
SELECT a.amopopr::regoperator, o.oprrest, o.oprjoin FROM ext_amops AS a
  JOIN pg_operator AS o ON o.oid = a.amopopr
  JOIN (VALUES (1, 'scalarltsel', 'scalarltjoinsel'), (2, 'scalarlesel', 'scalarlejoinsel'),
               (3, 'eqsel', 'eqjoinsel'), (4, 'scalargesel', 'scalargejoinsel'),
               (5, 'scalargtsel', 'scalargtjoinsel')) AS s (strategy, rest, joinsel)
    ON s.strategy = a.amopstrategy
 WHERE a.amopmethod = (SELECT oid FROM pg_am WHERE amname = 'btree')
   AND (o.oprrest <> s.rest::regproc OR o.oprjoin <> s.joinsel::regproc);
