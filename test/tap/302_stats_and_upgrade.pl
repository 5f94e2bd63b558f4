# Operations: the idempotency.stats view (counters in shared memory,
# visible to pg_monitor without exposing keys, reset by stats_reset), and
# the update from 0.7 (a database whose keys the library of 0.7 stored,
# reopened with the current library) keeping stored keys, each with its
# role, and the counters.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib $FindBin::RealBin;
use IdempotencyTest;


# --- upgrade: keys stored by the 0.7 library replay under the current one ---
# The cluster starts with the library of 0.7 (the release before this one,
# test/old-release.sh); database upgraded gets its keys there, by two roles
# using the same key texts, then the data directory is reopened with the
# current library, which serves the 0.7 schema and then updates it.
my $old = old_release_node('stats_upgrade_07', '0.7',
	conf => "idempotency.expire_interval = 0\n");
$old->safe_psql('postgres', q{
CREATE DATABASE upgraded;
CREATE ROLE regress_watcher LOGIN IN ROLE pg_monitor;
CREATE ROLE regress_caller LOGIN;
});
$old->safe_psql('upgraded', q{
CREATE EXTENSION idempotency;
CREATE TABLE runs (n int, who text);
GRANT SELECT, INSERT ON runs TO PUBLIC;
});
is($old->safe_psql('upgraded',
	q{SELECT extversion FROM pg_extension WHERE extname = 'idempotency'}),
	'0.7', 'installed at 0.7 by the 0.7 release');
my $role_call = q{SET ROLE %s;
SELECT idempotency.idempotent_call('%s', NULL, 'INSERT INTO runs VALUES ($1, current_user) RETURNING who', %d),
       idempotency.last_call_replayed()};
# Each call's response names its role.
my @calls = (
	[ 'regress_caller', 'under-0.7', 1 ],
	[ 'regress_other', 'under-0.7', 2 ],
	[ 'regress_caller', 'order-000000123', 3 ],
	[ 'regress_other', 'order-000000123', 4 ]);
for my $call (@calls)
{
	my ($response) = split /\|/, $old->safe_psql('upgraded', sprintf($role_call, @$call));
	push @$call, $response;
}
$old->stop;

my $node = reopen_with_current_library($old, 'stats_upgrade');
my $version = q{SELECT extversion FROM pg_extension WHERE extname = 'idempotency'};
my $replays = q{SELECT replays, calls_ran FROM idempotency.stats WHERE datname = 'upgraded'};
# Until ALTER EXTENSION UPDATE, this library serves the 0.7 schema as it is,
# its statistics view included.
for my $call (@calls)
{
	my ($role, $key, $n, $response) = @$call;
	is( $node->safe_psql('upgraded', sprintf($role_call, $role, $key, $n)),
		"$response|t", "${role}'s key $key replays under 0.7 with the current library");
}
is($node->safe_psql('upgraded', $replays),
	'4|0', 'the 0.7 statistics view counts the replays');
# The 0.7 schema's expiry status has fewer columns than the library
# reports: it shows those it declares.
$node->safe_psql('postgres',
	"ALTER SYSTEM SET idempotency.expire_interval = '1s'; SELECT pg_reload_conf()");
$node->poll_query_until('upgraded',
	"SELECT count(*) = 1 FROM idempotency.expiry_status WHERE datname = 'upgraded' AND rounds > 0"
) or die 'no expiry round under the 0.7 schema';
$node->safe_psql('postgres',
	'ALTER SYSTEM RESET idempotency.expire_interval; SELECT pg_reload_conf()');
is( $node->safe_psql('upgraded',
		q{SELECT last_error IS NULL, failed_rounds FROM idempotency.expiry_status WHERE datname = 'upgraded'}),
	't|0', 'the 0.7 expiry status view shows the round');

$node->safe_psql('upgraded', q{ALTER EXTENSION idempotency UPDATE});
is($node->safe_psql('upgraded',
	q{SELECT extversion = default_version FROM pg_extension, pg_available_extensions
	   WHERE extname = 'idempotency' AND name = extname}),
	't', 'ALTER EXTENSION UPDATE reaches the default version');
isnt($node->safe_psql('upgraded', $version), '0.7', '... past 0.7');
is($node->safe_psql('upgraded', $replays),
	'4|0', 'the counters survive the update');
is( $node->safe_psql('upgraded',
		q{SELECT last_kept, last_kept_reason IS NULL, skipped_rounds FROM idempotency.expiry_status WHERE datname = 'upgraded'}),
	'0|t|0', 'the updated expiry status view has the kept keys and skipped rounds');
is( $node->safe_psql('upgraded',
		q{SELECT late_retries, keys, tombstones FROM idempotency.stats WHERE datname = 'upgraded'}),
	'0|4|0', 'the updated view counts late retries, and live keys apart from tombstones');
is( $node->safe_psql('upgraded',
		q{SELECT string_agg(a.attname, ',' ORDER BY k.n)
		    FROM pg_index AS i, unnest(i.indkey) WITH ORDINALITY AS k(attnum, n), pg_attribute AS a
		   WHERE i.indexrelid = 'idempotency.keys_pkey'::regclass
		     AND a.attrelid = i.indrelid AND a.attnum = k.attnum}),
	'scope,key_digest', 'the primary key is (scope, key_digest)');
is( $node->safe_psql('upgraded',
		q{SELECT count(*) FILTER (WHERE key_digest = idempotency.key_digest(key)
		                            AND octet_length(request_hash) = 32)
		    FROM idempotency.keys}),
	scalar(@calls), 'every stored key has its digest (ordered ones too) and a 32-byte fingerprint');
is( $node->safe_psql('upgraded',
		q{SELECT format_type(atttypid, atttypmod) FROM pg_attribute
		   WHERE attrelid = 'idempotency.keys'::regclass AND attname = 'scope'}),
	'idempotency.role_scope', 'the scope column is a role_scope');
for my $call (@calls)
{
	my ($role, $key, $n, $response) = @$call;
	is( $node->safe_psql('upgraded', sprintf($role_call, $role, $key, $n)),
		"$response|t", "${role}'s key $key replays after the update");
	is(sqlstate_in($node, 'upgraded', sprintf($role_call, $role, $key, $n + 100)),
		'IK422', "${role}'s key $key with another request is IK422");
}
is( $node->safe_psql('upgraded',
		'SET ROLE regress_other; SELECT key FROM idempotency.keys ORDER BY key'),
	"order-000000123\nunder-0.7", 'each role sees only its own keys');
is($node->safe_psql('upgraded', 'SELECT count(*) FROM runs'),
	scalar(@calls), 'fn ran once per role and key');
is($node->safe_psql('upgraded', $replays),
	'8|0', 'the replays after the update are counted on');

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
	q{SELECT keys_expired, keys, tombstones FROM idempotency.stats WHERE datname = current_database()}),
	'2|2|2', 'keys_expired counts them; keys counts the live keys, tombstones theirs');

# Other databases' counters are listed too, without their key counts.
$node->safe_psql('upgraded', sprintf($call, 'k-other', 5));
is( $node->safe_psql(
		$db,
		q{SELECT calls_ran, replays, keys IS NULL FROM idempotency.stats WHERE datname = 'upgraded'}),
	'1|8|t',
	'another database (k-other ran there, the old keys replayed): counters yes, key count no');

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
is($node->safe_psql($db, q{SELECT calls_ran, replays, conflicts, mismatches, late_retries, keys_expired
  FROM idempotency.stats WHERE datname = current_database()}),
	'0|0|0|0|0|0', 'stats_reset zeroes this database');
is($node->safe_psql($db,
	q{SELECT calls_ran, replays FROM idempotency.stats WHERE datname = 'upgraded'}),
	'1|8', 'and leaves other databases alone');

# Without preloading nothing is counted: the counters are NULL, the key
# count is still there.
$node->append_conf('postgresql.conf', q{shared_preload_libraries = ''});
$node->restart;
is($node->safe_psql($db,
	q{SELECT calls_ran IS NULL, keys, tombstones FROM idempotency.stats}),
	't|2|2', 'without preloading: no counters, keys and tombstones still counted');

$node->stop;
done_testing();
