# Operations: the idempotency.stats view (counters in shared memory,
# visible to pg_monitor without exposing keys, reset by stats_reset) and the
# upgrades from 0.1 through 0.5 keeping stored keys, each with its role.
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

$node->safe_psql('upgraded', q{ALTER EXTENSION idempotency UPDATE});
is($node->safe_psql('upgraded',
	q{SELECT extversion = default_version FROM pg_extension, pg_available_extensions
	   WHERE extname = 'idempotency' AND name = extname}),
	't', 'ALTER EXTENSION UPDATE reaches the default version');
is( $node->safe_psql(
		'upgraded',
		q{SELECT idempotency.idempotent_call('before-upgrade', NULL,
		    'INSERT INTO runs VALUES ($1) RETURNING n', 1),
		  idempotency.last_call_replayed(), (SELECT count(*) FROM runs)}),
	'1|t|1',
	'a key stored under 0.1 replays after the upgrade');

# --- upgrades to 0.3 (the scope becomes a role_scope) and 0.4 (the primary
# key holds a digest of the key); keys stored under 0.1, 0.2 and 0.3
# by several roles replay for their own role only --------------------------
$node->safe_psql('postgres', q{
CREATE DATABASE upgraded_roles;
CREATE ROLE regress_other LOGIN;
});
my $role_call = q{SET ROLE %s;
SELECT idempotency.idempotent_call('%s', NULL, 'INSERT INTO runs VALUES ($1, current_user) RETURNING who', %d),
       idempotency.last_call_replayed()};
$node->safe_psql('upgraded_roles', q{
CREATE EXTENSION idempotency VERSION '0.1';
CREATE TABLE runs (n int, who text);
GRANT SELECT, INSERT ON runs TO PUBLIC;
});
# Both roles use the same key texts; each call's response names its role.
my @calls;
sub store_calls
{
	for my $call (@_)
	{
		my ($response) = split /\|/,
		  $node->safe_psql('upgraded_roles', sprintf($role_call, @$call));
		push @calls, [ @$call, $response ];
	}
}
store_calls([ 'regress_caller', 'under-0.1', 1 ], [ 'regress_other', 'under-0.1', 2 ]);
$node->safe_psql('upgraded_roles', q{ALTER EXTENSION idempotency UPDATE TO '0.2'});
store_calls([ 'regress_caller', 'under-0.2', 3 ], [ 'regress_other', 'under-0.2', 4 ]);
$node->safe_psql('upgraded_roles', q{ALTER EXTENSION idempotency UPDATE TO '0.3'});
store_calls([ 'regress_caller', 'under-0.3', 5 ], [ 'regress_other', 'under-0.3', 6 ]);
# Until ALTER EXTENSION UPDATE, this library serves the 0.3 row as it is.
is( $node->safe_psql('upgraded_roles', sprintf($role_call, @{ $calls[0] }[ 0 .. 2 ])),
	"$calls[0][3]|t", 'a key replays from a 0.3 table before the update to 0.4');
$node->safe_psql('upgraded_roles', q{ALTER EXTENSION idempotency UPDATE TO '0.4'});
is( $node->safe_psql('upgraded_roles',
		q{SELECT extversion FROM pg_extension WHERE extname = 'idempotency'}),
	'0.4', 'ALTER EXTENSION UPDATE reaches 0.4');
is( $node->safe_psql('upgraded_roles',
		q{SELECT string_agg(a.attname, ',' ORDER BY k.n)
		    FROM pg_index AS i, unnest(i.indkey) WITH ORDINALITY AS k(attnum, n), pg_attribute AS a
		   WHERE i.indexrelid = 'idempotency.keys_pkey'::regclass
		     AND a.attrelid = i.indrelid AND a.attnum = k.attnum}),
	'scope,key_digest', 'the primary key of 0.4 is (scope, key_digest)');
is( $node->safe_psql('upgraded_roles',
		q{SELECT count(*) FILTER (WHERE key_digest = idempotency.key_digest(key)
		                            AND octet_length(request_hash) = 32)
		    FROM idempotency.keys}),
	'6', 'every stored key has its digest and a 32-byte fingerprint');
is( $node->safe_psql('upgraded_roles',
		q{SELECT format_type(atttypid, atttypmod) FROM pg_attribute
		   WHERE attrelid = 'idempotency.keys'::regclass AND attname = 'scope'}),
	'idempotency.role_scope', 'the scope column is a role_scope');
is( $node->safe_psql('upgraded_roles',
		q{SELECT count(*) FROM pg_attribute WHERE attrelid = 'idempotency.keys'::regclass
		   AND attname = 'status' AND NOT attisdropped}),
	'0', 'no status column since 0.3');
for my $call (@calls)
{
	my ($role, $key, $n, $response) = @$call;
	is( $node->safe_psql('upgraded_roles', sprintf($role_call, $role, $key, $n)),
		"$response|t", "${role}'s key $key replays under 0.4");
}
is( $node->safe_psql('upgraded_roles',
		'SET ROLE regress_other; SELECT key FROM idempotency.keys ORDER BY key'),
	"under-0.1\nunder-0.2\nunder-0.3", 'each role sees only its own keys under 0.4');
is($node->safe_psql('upgraded_roles', 'SELECT count(*) FROM runs'),
	'6', 'fn ran once per role and key');

# 0.5 adds tenant keys beside the table and leaves its rows alone.
$node->safe_psql('upgraded_roles', q{ALTER EXTENSION idempotency UPDATE TO '0.5'});
is( $node->safe_psql('upgraded_roles',
		q{SELECT extversion FROM pg_extension WHERE extname = 'idempotency'}),
	'0.5', 'ALTER EXTENSION UPDATE reaches 0.5');
for my $call (@calls)
{
	my ($role, $key, $n, $response) = @$call;
	is( $node->safe_psql('upgraded_roles', sprintf($role_call, $role, $key, $n)),
		"$response|t", "${role}'s key $key replays under 0.5");
}
is($node->safe_psql('upgraded_roles', 'SELECT count(*) FROM runs'),
	'6', 'fn ran once per role and key under 0.5 too');

# A fresh install for the statistics below. That it makes the same objects
# as the updates do is test/tap/308_install_matches_upgrades.pl's.
$node->safe_psql('postgres', 'CREATE DATABASE fresh');
$node->safe_psql('fresh', 'CREATE EXTENSION idempotency');

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
	'2|t',
	'another database (before-upgrade and k-other ran there): counters yes, key count no');

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
	'2', 'and leaves other databases alone');

# Without preloading nothing is counted: the counters are NULL, the key
# count is still there.
$node->append_conf('postgresql.conf', q{shared_preload_libraries = ''});
$node->restart;
is($node->safe_psql($db,
	q{SELECT calls_ran IS NULL, keys FROM idempotency.stats}),
	't|2', 'without preloading: no counters, keys still counted');

$node->stop;
done_testing();
