# Operations: the idempotency.stats view (counters in shared memory,
# visible to pg_monitor without exposing keys, reset by stats_reset) and the
# upgrade from 0.1 to 0.2 keeping stored keys.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib $FindBin::RealBin;
use IdempotencyTest;

my $node = PostgreSQL::Test::Cluster->new('stats_upgrade');
$node->init;
$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.expire_interval = 0
});
$node->start;

# --- upgrade: keys stored under 0.1 replay under 0.2 ----------------------
$node->safe_psql('postgres', q{
CREATE DATABASE upgraded;
CREATE ROLE regress_watcher LOGIN IN ROLE pg_monitor;
CREATE ROLE regress_caller LOGIN;
});
$node->safe_psql('upgraded', q{
CREATE EXTENSION idempotency VERSION '0.1';
CREATE TABLE runs (n int);
SELECT idempotency.idempotent_call('before-upgrade', NULL, 'INSERT INTO runs VALUES ($1) RETURNING n', 1);
});
is($node->safe_psql('upgraded',
	q{SELECT extversion FROM pg_extension WHERE extname = 'idempotency'}),
	'0.1', 'installed at 0.1');
is($node->safe_psql('upgraded', q{SELECT to_regclass('idempotency.stats') IS NULL}),
	't', '0.1 has no stats view');

$node->safe_psql('upgraded', "ALTER EXTENSION idempotency UPDATE TO '0.2'");
is($node->safe_psql('upgraded',
	q{SELECT extversion FROM pg_extension WHERE extname = 'idempotency'}),
	'0.2', 'ALTER EXTENSION UPDATE TO 0.2 reaches 0.2');
is( $node->safe_psql(
		'upgraded',
		q{SELECT idempotency.idempotent_call('before-upgrade', NULL,
		    'INSERT INTO runs VALUES ($1) RETURNING n', 1),
		  idempotency.last_call_replayed(), (SELECT count(*) FROM runs)}),
	'1|t|1',
	'a key stored under 0.1 replays after the upgrade');

# 0.2 still has the status column: the store fills it from its default.
$node->safe_psql('upgraded', q{
SELECT idempotency.idempotent_call('under-0.2', NULL,
    'INSERT INTO runs VALUES ($1) RETURNING n', 2);
});
is($node->safe_psql('upgraded',
	q{SELECT string_agg(status, ',' ORDER BY key) FROM idempotency.keys}),
	'done,done', 'under 0.2, status is filled by its default');

# 0.3 drops status; every stored key still replays.
$node->safe_psql('upgraded', 'ALTER EXTENSION idempotency UPDATE');
is($node->safe_psql('upgraded',
	q{SELECT extversion FROM pg_extension WHERE extname = 'idempotency'}),
	'0.3', 'ALTER EXTENSION UPDATE reaches 0.3');
is($node->safe_psql('upgraded',
	q{SELECT count(*) FROM pg_attribute WHERE attrelid = 'idempotency.keys'::regclass
	   AND attname = 'status' AND NOT attisdropped}),
	'0', '0.3 has no status column');
is( $node->safe_psql(
		'upgraded',
		q{SELECT string_agg(idempotency.idempotent_call(k, NULL,
		    'INSERT INTO runs VALUES ($1) RETURNING n', n)::text
		    || ':' || idempotency.last_call_replayed()::text, ',' ORDER BY k),
		  (SELECT count(*) FROM runs)
		  FROM (VALUES ('before-upgrade', 1), ('under-0.2', 2)) AS c (k, n)}),
	'1:true,2:true|2',
	'keys stored under 0.1 and 0.2 replay after the upgrade to 0.3');

# A fresh install and an upgraded one have the same objects.
$node->safe_psql('postgres', 'CREATE DATABASE fresh');
$node->safe_psql('fresh', 'CREATE EXTENSION idempotency');
my $objects = q{SELECT pg_describe_object(classid, objid, objsubid)
  FROM pg_depend WHERE refclassid = 'pg_extension'::regclass AND deptype = 'e'
   AND refobjid = (SELECT oid FROM pg_extension WHERE extname = 'idempotency')
  ORDER BY 1};
is($node->safe_psql('upgraded', $objects), $node->safe_psql('fresh', $objects),
	'an upgraded installation has the objects of a fresh one');

# --- stats -----------------------------------------------------------------
my $db = 'fresh';
$node->safe_psql($db, q{
CREATE TABLE runs (n int);
GRANT SELECT, INSERT ON runs TO regress_caller;
SELECT idempotency.stats_reset();
});
my $call = q{SELECT idempotency.idempotent_call('%s', NULL,
  'INSERT INTO runs VALUES ($1) RETURNING n', %d)};
$node->safe_psql($db, sprintf($call, 'k1', 1), extra_params => [ '-U', 'regress_caller' ]);
$node->safe_psql($db, sprintf($call, 'k2', 2), extra_params => [ '-U', 'regress_caller' ]);
$node->safe_psql($db, sprintf($call, 'k1', 1), extra_params => [ '-U', 'regress_caller' ]);
my ($rc, $out, $err) = $node->psql($db, sprintf($call, 'k1', 99),
	extra_params => [ '-U', 'regress_caller' ]);
like($err, qr/different request/, 'IK422 counted below');

# IK409: a second session while the first holds k3 open.
my $holder = $node->background_psql($db);
$holder->query_safe('BEGIN');
$holder->query_safe(sprintf($call, 'k3', 3));
($rc, $out, $err) = $node->psql($db, sprintf($call, 'k3', 3));
like($err, qr/being processed by another transaction/, 'IK409 counted below');
$holder->query_safe('ROLLBACK');
$holder->quit;

my $stats = q{SELECT calls_ran, replays, conflicts, mismatches, keys_expired, keys,
  oldest_key_age IS NOT NULL, stats_reset IS NOT NULL
  FROM idempotency.stats WHERE datname = current_database()};
# The rolled-back k3 ran fn too: calls_ran counts executions, committed or not.
is($node->safe_psql($db, $stats), '3|1|1|1|0|2|t|t',
	'counters: ran, replayed, IK409, IK422; keys and oldest age of this database');

# Expiry is counted: two keys pushed past their TTL, then expire().
$node->safe_psql($db, q{
SELECT idempotency.idempotent_call('short-1', NULL, 'SELECT 1');
SELECT idempotency.idempotent_call('short-2', NULL, 'SELECT 2');
} . expire_keys_sql("key LIKE 'short-%'"));
is($node->safe_psql($db, 'SELECT idempotency.expire()'), '2', 'expire() deleted two keys');
is($node->safe_psql($db,
	q{SELECT keys_expired, keys FROM idempotency.stats WHERE datname = current_database()}),
	'2|2', 'keys_expired counts them');

# Other databases' counters are listed too, without their key counts.
$node->safe_psql('upgraded', sprintf($call, 'k-other', 5));
is( $node->safe_psql(
		$db,
		q{SELECT calls_ran, keys IS NULL FROM idempotency.stats WHERE datname = 'upgraded'}),
	'3|t',
	'another database (before-upgrade, under-0.2 and k-other ran there): counters yes, key count no');

# pg_monitor members read the view; it has no key or response column.
is($node->safe_psql($db, q{SELECT count(*) > 0 FROM idempotency.stats},
		extra_params => [ '-U', 'regress_watcher' ]),
	't', 'a pg_monitor member reads idempotency.stats');
my $columns = $node->safe_psql($db, q{SELECT string_agg(attname, ',' ORDER BY attnum)
  FROM pg_attribute WHERE attrelid = 'idempotency.stats'::regclass AND attnum > 0});
unlike($columns, qr/(^|,)(key|response|request_hash)(,|$)/, 'no key, hash or response column');
($rc, $out, $err) = $node->psql($db, 'SELECT * FROM idempotency.stats',
	extra_params => [ '-U', 'regress_caller' ]);
like($err, qr/permission denied/, 'an ordinary role does not read the stats');
($rc, $out, $err) = $node->psql($db, 'SELECT idempotency.stats_reset()',
	extra_params => [ '-U', 'regress_watcher' ]);
like($err, qr/permission denied/, 'pg_monitor cannot reset them');

$node->safe_psql($db, 'SELECT idempotency.stats_reset()');
is($node->safe_psql($db, q{SELECT calls_ran, replays, conflicts, mismatches, keys_expired
  FROM idempotency.stats WHERE datname = current_database()}),
	'0|0|0|0|0', 'stats_reset zeroes this database');
is($node->safe_psql($db,
	q{SELECT calls_ran FROM idempotency.stats WHERE datname = 'upgraded'}),
	'3', 'and leaves other databases alone');

# Without preloading nothing is counted: the counters are NULL, the key
# count is still there.
$node->append_conf('postgresql.conf', q{shared_preload_libraries = ''});
$node->restart;
is($node->safe_psql($db,
	q{SELECT calls_ran IS NULL, keys FROM idempotency.stats}),
	't|2', 'without preloading: no counters, keys still counted');

$node->stop;
done_testing();
