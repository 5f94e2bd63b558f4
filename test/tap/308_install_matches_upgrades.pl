# A fresh install and the update from the previous release (0.7, the only
# one the library serves) make the same extension. CREATE EXTENSION runs
# idempotency--<default>.sql, built from idempotency.sql; a database at 0.7,
# made by the cluster of the 0.7 release (test/old-release.sh: the current
# installation ships no install script of 0.7) and reopened with the
# current library, reaches the default through idempotency--0.7--<default>.sql.
# Each database describes every object of the extension
# from the catalog (definitions, columns, constraints, indexes, triggers,
# policies, operator classes, casts, privileges and initial privileges,
# comments, the extension's configuration tables), and the descriptions must
# be equal line for line: an object, a comment or a grant that one path
# makes and the other does not fails the test with the difference.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use FindBin;
use lib $FindBin::RealBin;
use IdempotencyTest;

my $node = preloaded_node('install_matches_upgrades',
	conf => "idempotency.expire_interval = 0\n");

# Every fact below is a (object, fact) line. A member of a kind this query
# does not describe is reported as such, so that a new kind of object makes
# this test grow rather than go unchecked. ACLs are sorted: the order of
# GRANTs does not matter, their result does.
my $describe = q{
WITH ext AS (
  SELECT oid, extconfig, extcondition, extrelocatable
    FROM pg_extension WHERE extname = 'idempotency'),
member AS (
  SELECT d.classid, d.objid, d.objsubid,
         (pg_identify_object(d.classid, d.objid, d.objsubid)).type AS kind,
         pg_describe_object(d.classid, d.objid, d.objsubid) AS what
    FROM pg_depend AS d, ext
   WHERE d.refclassid = 'pg_extension'::regclass AND d.refobjid = ext.oid
     AND d.deptype = 'e'),
facts(what, fact) AS (
  -- membership itself
  SELECT m.what, 'member (' || m.kind || ')' FROM member AS m
  UNION ALL
  -- members this description does not know how to describe
  SELECT m.what, 'UNDESCRIBED member of ' || m.classid::regclass
    FROM member AS m
   WHERE m.classid NOT IN ('pg_proc'::regclass, 'pg_class'::regclass,
                           'pg_type'::regclass, 'pg_operator'::regclass,
                           'pg_opclass'::regclass, 'pg_opfamily'::regclass,
                           'pg_cast'::regclass, 'pg_event_trigger'::regclass)
  UNION ALL
  -- the extension
  SELECT 'extension', 'relocatable ' || extrelocatable FROM ext
  UNION ALL
  SELECT 'extension', 'configuration table ' || c::regclass || ' condition '
         || quote_literal(coalesce(ext.extcondition[i], ''))
    FROM ext, unnest(ext.extconfig) WITH ORDINALITY AS u(c, i)
  UNION ALL
  SELECT 'schema ' || n.nspname, 'owner is superuser ' || r.rolsuper
         || ' acl ' || coalesce((SELECT string_agg(a::text, ' ' ORDER BY a::text)
                                   FROM unnest(n.nspacl) AS a), 'default')
    FROM pg_namespace AS n JOIN pg_roles AS r ON r.oid = n.nspowner
   WHERE n.nspname = 'idempotency'
  UNION ALL
  -- comments on members and their columns
  SELECT m.what || coalesce(' column ' || a.attname, ''), 'comment ' || quote_literal(ds.description)
    FROM member AS m
    JOIN pg_description AS ds ON ds.classoid = m.classid AND ds.objoid = m.objid
    LEFT JOIN pg_attribute AS a ON m.classid = 'pg_class'::regclass
         AND a.attrelid = m.objid AND a.attnum = ds.objsubid AND ds.objsubid > 0
  UNION ALL
  -- initial privileges, which pg_dump compares with the current ones
  SELECT m.what || CASE WHEN ip.objsubid > 0 THEN ' column ' || a.attname ELSE '' END,
         'initial privileges (' || ip.privtype::text || ') '
         || coalesce((SELECT string_agg(x::text, ' ' ORDER BY x::text)
                        FROM unnest(ip.initprivs) AS x), '')
    FROM member AS m
    JOIN pg_init_privs AS ip ON ip.classoid = m.classid AND ip.objoid = m.objid
    LEFT JOIN pg_attribute AS a ON m.classid = 'pg_class'::regclass
         AND a.attrelid = m.objid AND a.attnum = ip.objsubid
  UNION ALL
  -- functions: the whole definition, and who may execute them
  SELECT m.what, pg_get_functiondef(p.oid) || E'\n  acl '
         || coalesce((SELECT string_agg(x::text, ' ' ORDER BY x::text)
                        FROM unnest(p.proacl) AS x), 'default')
    FROM member AS m JOIN pg_proc AS p ON m.classid = 'pg_proc'::regclass AND p.oid = m.objid
  UNION ALL
  -- relations
  SELECT m.what, format('relkind %s persistence %s access method %s row security %s forced %s replica identity %s options %s acl %s',
         c.relkind, c.relpersistence, coalesce(am.amname, '-'), c.relrowsecurity,
         c.relforcerowsecurity, c.relreplident, coalesce(c.reloptions::text, '-'),
         coalesce((SELECT string_agg(x::text, ' ' ORDER BY x::text)
                     FROM unnest(c.relacl) AS x), 'default'))
    FROM member AS m JOIN pg_class AS c ON m.classid = 'pg_class'::regclass AND c.oid = m.objid
    LEFT JOIN pg_am AS am ON am.oid = c.relam
  UNION ALL
  SELECT m.what, 'view ' || pg_get_viewdef(c.oid, true)
    FROM member AS m JOIN pg_class AS c ON m.classid = 'pg_class'::regclass AND c.oid = m.objid
   WHERE c.relkind IN ('v', 'm')
  UNION ALL
  -- columns in their order (dropped columns are storage, not schema). The
  -- server stamps a column's options with pg_attver, which tells when the
  -- column was made or rewritten, not what it is.
  SELECT m.what, format('column %s: %s %s collate %s not null %s default %s statistics %s storage %s compression %s identity %s generated %s options %s acl %s',
         row_number() OVER (PARTITION BY a.attrelid ORDER BY a.attnum), a.attname,
         format_type(a.atttypid, a.atttypmod),
         coalesce((SELECT co.collname FROM pg_collation AS co WHERE co.oid = a.attcollation), '-'),
         a.attnotnull, coalesce(pg_get_expr(ad.adbin, ad.adrelid), '-'), a.attstattarget,
         a.attstorage, quote_literal(a.attcompression::text), quote_literal(a.attidentity::text),
         quote_literal(a.attgenerated::text),
         coalesce((SELECT string_agg(o, ' ' ORDER BY o) FROM unnest(a.attoptions) AS o
                    WHERE o NOT LIKE 'pg\\_attver=%'), '-'),
         coalesce((SELECT string_agg(x::text, ' ' ORDER BY x::text)
                     FROM unnest(a.attacl) AS x), 'default'))
    FROM member AS m
    JOIN pg_class AS c ON m.classid = 'pg_class'::regclass AND c.oid = m.objid AND c.relkind <> 'v'
    JOIN pg_attribute AS a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
    LEFT JOIN pg_attrdef AS ad ON ad.adrelid = a.attrelid AND ad.adnum = a.attnum
  UNION ALL
  SELECT m.what, 'constraint ' || co.conname || ' ' || pg_get_constraintdef(co.oid)
         || ' deferrable ' || co.condeferrable || ' validated ' || co.convalidated
    FROM member AS m JOIN pg_constraint AS co ON m.classid = 'pg_class'::regclass AND co.conrelid = m.objid
  UNION ALL
  SELECT m.what, 'index ' || pg_get_indexdef(i.indexrelid) || format(' primary %s unique %s clustered %s replica identity %s',
         i.indisprimary, i.indisunique, i.indisclustered, i.indisreplident)
    FROM member AS m JOIN pg_index AS i ON m.classid = 'pg_class'::regclass AND i.indrelid = m.objid
  UNION ALL
  SELECT m.what, 'trigger ' || pg_get_triggerdef(t.oid) || ' enabled ' || t.tgenabled::text
    FROM member AS m JOIN pg_trigger AS t ON m.classid = 'pg_class'::regclass AND t.tgrelid = m.objid
   WHERE NOT t.tgisinternal
  UNION ALL
  SELECT m.what, format('policy %s for %s permissive %s to %s using %s with check %s',
         po.polname, po.polcmd, po.polpermissive,
         (SELECT string_agg(CASE WHEN r = 0 THEN 'public' ELSE r::regrole::text END, ' ' ORDER BY 1)
            FROM unnest(po.polroles) AS r),
         coalesce(pg_get_expr(po.polqual, po.polrelid), '-'),
         coalesce(pg_get_expr(po.polwithcheck, po.polrelid), '-'))
    FROM member AS m JOIN pg_policy AS po ON m.classid = 'pg_class'::regclass AND po.polrelid = m.objid
  UNION ALL
  SELECT m.what, 'rule ' || pg_get_ruledef(ru.oid)
    FROM member AS m JOIN pg_rewrite AS ru ON m.classid = 'pg_class'::regclass AND ru.ev_class = m.objid
   WHERE ru.rulename <> '_RETURN'
  UNION ALL
  -- types
  SELECT m.what, format('type %s length %s by value %s category %s preferred %s delimiter %s input %s output %s receive %s send %s modin %s modout %s analyze %s align %s storage %s not null %s default %s collation %s acl %s',
         t.typtype, t.typlen, t.typbyval, t.typcategory, t.typispreferred, t.typdelim,
         t.typinput::regproc, t.typoutput::regproc, t.typreceive::regproc, t.typsend::regproc,
         t.typmodin::regproc, t.typmodout::regproc, t.typanalyze::regproc, t.typalign,
         t.typstorage, t.typnotnull, coalesce(t.typdefault, '-'), t.typcollation,
         coalesce((SELECT string_agg(x::text, ' ' ORDER BY x::text)
                     FROM unnest(t.typacl) AS x), 'default'))
    FROM member AS m JOIN pg_type AS t ON m.classid = 'pg_type'::regclass AND t.oid = m.objid
  UNION ALL
  -- operators
  SELECT m.what, format('operator result %s function %s commutator %s negator %s restrict %s join %s merges %s hashes %s',
         o.oprresult::regtype, o.oprcode::regprocedure, o.oprcom::regoperator,
         o.oprnegate::regoperator, o.oprrest::regprocedure, o.oprjoin::regprocedure,
         o.oprcanmerge, o.oprcanhash)
    FROM member AS m JOIN pg_operator AS o ON m.classid = 'pg_operator'::regclass AND o.oid = m.objid
  UNION ALL
  -- operator classes and their families' operators and support functions
  SELECT m.what, format('operator class for %s default %s storage %s family %s',
         oc.opcintype::regtype, oc.opcdefault, oc.opckeytype::regtype,
         pg_describe_object('pg_opfamily'::regclass, oc.opcfamily, 0))
    FROM member AS m JOIN pg_opclass AS oc ON m.classid = 'pg_opclass'::regclass AND oc.oid = m.objid
  UNION ALL
  SELECT m.what, format('strategy %s operator %s (%s, %s) purpose %s sort family %s',
         ao.amopstrategy, ao.amopopr::regoperator, ao.amoplefttype::regtype,
         ao.amoprighttype::regtype, ao.amoppurpose, ao.amopsortfamily)
    FROM member AS m JOIN pg_amop AS ao ON m.classid = 'pg_opfamily'::regclass AND ao.amopfamily = m.objid
  UNION ALL
  SELECT m.what, format('support %s function %s (%s, %s)',
         ap.amprocnum, ap.amproc::regprocedure, ap.amproclefttype::regtype,
         ap.amprocrighttype::regtype)
    FROM member AS m JOIN pg_amproc AS ap ON m.classid = 'pg_opfamily'::regclass AND ap.amprocfamily = m.objid
  UNION ALL
  -- casts
  SELECT m.what, format('cast function %s context %s method %s',
         ca.castfunc::regprocedure, ca.castcontext, ca.castmethod)
    FROM member AS m JOIN pg_cast AS ca ON m.classid = 'pg_cast'::regclass AND ca.oid = m.objid
  UNION ALL
  -- event triggers
  SELECT m.what, format('event trigger on %s function %s enabled %s tags %s',
         e.evtevent, e.evtfoid::regprocedure, e.evtenabled, coalesce(e.evttags::text, '-'))
    FROM member AS m JOIN pg_event_trigger AS e ON m.classid = 'pg_event_trigger'::regclass AND e.oid = m.objid)
SELECT what || ': ' || replace(fact, E'\n', E'\n' || what || ':   ') FROM facts ORDER BY what, fact;
};

my $default = $node->safe_psql('postgres',
	q{SELECT default_version FROM pg_available_extensions WHERE name = 'idempotency'});
# Only the default version is installable: the library ships no install
# script of an older one, and no update path leads to one.
is( $node->safe_psql('postgres',
		q{SELECT string_agg(version, ' ') FROM pg_available_extension_versions
		   WHERE name = 'idempotency'}),
	$default,
	"only $default is installable")
  or diag('the installed scripts: ',
	`ls -l --time-style=full-iso "@{[ $node->config_data('--sharedir') ]}"/extension/idempotency*`);

$node->safe_psql('postgres', 'CREATE DATABASE fresh');
$node->safe_psql('fresh', 'CREATE EXTENSION idempotency');
# A fresh table has no dropped columns (tables made by the updates of
# earlier releases keep theirs).
is( $node->safe_psql(
		'fresh', q{SELECT count(*) FROM pg_attribute
		  WHERE attrelid = 'idempotency.keys'::regclass AND attisdropped}),
	'0',
	"CREATE EXTENSION runs idempotency--$default.sql itself");
my $fresh = $node->safe_psql('fresh', $describe);
unlike($fresh, qr/UNDESCRIBED/, 'every object of a fresh install is described');
like($fresh, qr/^table idempotency\.keys: comment /m,
	'the description holds the comments');
like($fresh, qr/^view idempotency\.stats: initial privileges \(e\) .*pg_monitor=r/m,
	'the description holds the grants');

my $workdir = PostgreSQL::Test::Utils::tempdir();
PostgreSQL::Test::Utils::append_to_file("$workdir/fresh", "$fresh\n");

# The extension's version in database `db` of `node`.
sub extversion
{
	my ($node, $db) = @_;
	return $node->safe_psql($db,
		q{SELECT extversion FROM pg_extension WHERE extname = 'idempotency'});
}

# Passes when database `db` of `node`, updated from `from`, describes as the
# fresh install does (the difference as a diagnostic otherwise); returns its
# description.
sub matches_fresh
{
	my ($node, $db, $from) = @_;
	my $updated = $node->safe_psql($db, $describe);
	PostgreSQL::Test::Utils::append_to_file("$workdir/$db", "$updated\n");
	my $same = $updated eq $fresh;
	ok($same, "updated from $from, the extension is the one a fresh install makes");
	diag(`diff -u "$workdir/fresh" "$workdir/$db"`) unless $same;
	return $updated;
}

# A database at 0.7, made by the 0.7 release, updated by the current library.
my $old = old_release_node('release07', '0.7', conf => "idempotency.expire_interval = 0\n");
$old->safe_psql('postgres', 'CREATE DATABASE from_0_7');
$old->safe_psql('from_0_7', 'CREATE EXTENSION idempotency');
is(extversion($old, 'from_0_7'), '0.7', 'the 0.7 release installs 0.7');
# old_release_node's roles, which the fresh node has too: grants name no role
# of theirs, but the two clusters then hold the same roles.
$node->safe_psql('postgres', 'CREATE ROLE regress_app; CREATE ROLE regress_other');
my $updater = reopen_with_current_library($old, 'updated07');
$updater->safe_psql('from_0_7', 'ALTER EXTENSION idempotency UPDATE');
is(extversion($updater, 'from_0_7'), $default, "0.7 updates to $default");
my $updated = matches_fresh($updater, 'from_0_7', '0.7');
# The comparison sees what the update script does: the comments it sets
# are those of the fresh install, not 0.7's.
like($updated, qr/^table idempotency\.keys column status: comment 'always NULL: accepts the status column that dumps of 0\.7 and 1\.0 name'/m,
	'the update rewrites the comments 1.0 changed');
$updater->stop;

# A database at 1.0, made by the 1.0 release, updated by the current library.
my $old10 = old_release_node('release10', '1.0', conf => "idempotency.expire_interval = 0\n");
$old10->safe_psql('postgres', 'CREATE DATABASE from_1_0');
$old10->safe_psql('from_1_0',
	q{CREATE EXTENSION idempotency; SELECT idempotency.idempotent_call('before-1.1', NULL, 'SELECT 1')});
is(extversion($old10, 'from_1_0'), '1.0', 'the 1.0 release installs 1.0');
my $updater10 = reopen_with_current_library($old10, 'updated10');
# The update gives the live keys of 1.0 the window of its session's
# idempotency.remember (docs/expiry.md#when-a-keys-windows-are-fixed).
$updater10->safe_psql('from_1_0',
	"SET idempotency.remember = '2 hours'; ALTER EXTENSION idempotency UPDATE");
is( $updater10->safe_psql(
		'from_1_0', q{SELECT remember_for FROM idempotency.keys WHERE key = 'before-1.1'}),
	'02:00:00',
	"the update gives 1.0's keys the updating session's window");
is(extversion($updater10, 'from_1_0'), $default, "1.0 updates to $default");
matches_fresh($updater10, 'from_1_0', '1.0');
$updater10->stop;

done_testing();
