# Expiry never stands in a caller's way: it may delete the expired row a
# caller is about to replace (the caller's write goes on), and a key still
# live for a transaction that started before it expired is kept.
# idempotency.expire() works without preloading.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib $FindBin::RealBin;
use IdempotencyTest;

my $node = PostgreSQL::Test::Cluster->new('expiry_callers');
$node->init;
# The worker is off: idempotency.expire() runs the rounds, when the test says.
$node->append_conf(
	'postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.expire_interval = 0
# Expired keys are replaced, not kept as tombstones (213 has those).
idempotency.remember = 0
});
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION idempotency');

sub expire
{
	return $node->safe_psql('postgres', 'SELECT idempotency.expire()');
}

# A caller replacing an expired key under REPEATABLE READ: expire() deletes
# the old row while the caller runs fn, and the caller's write of the new
# row goes on without a serialization error.
$node->safe_psql('postgres',
	"SELECT idempotency.idempotent_call('renewed', NULL, 'SELECT ''old''');"
	  . expire_keys_sql("key = 'renewed'"));
# The caller's fn waits for an advisory lock the test holds, so it is still
# inside fn when expire() runs, however slow the machine.
my $gate = $node->background_psql('postgres');
$gate->query_safe('SELECT pg_advisory_lock(104)');
my $caller = $node->background_psql('postgres');
$caller->query_safe('BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1');
$caller->query_until(
	qr/calling/, q{
\echo calling
SELECT idempotency.idempotent_call('renewed', NULL, 'SELECT ''new'' FROM pg_advisory_xact_lock(104)');
});
$node->poll_query_until('postgres',
	"SELECT count(*) = 1 FROM pg_stat_activity WHERE wait_event = 'advisory' AND query LIKE '%renewed%'")
  or die 'the caller never reached fn';
is(expire(), '1', 'expire() deletes the expired row a caller is replacing');
$gate->query_safe('SELECT pg_advisory_unlock(104)');
$gate->quit;
my ($output, $failed) = $caller->query('COMMIT');
is($failed, 0, 'the caller commits without a serialization error');
like($output, qr/new/, 'the caller ran fn');
$caller->quit;
is( $node->safe_psql(
		'postgres',
		"SELECT response #>> '{}' FROM idempotency.keys WHERE key = 'renewed'"),
	'new',
	'the key holds the new response');

# A transaction that started before a key expired still replays it. It
# starts before the key is even written, and the key is then made to expire
# at once (expires_at set to the clock), so it expires after that
# transaction's start and before anything else below, whatever the
# machine's speed. fn answers its run number.
$node->safe_psql('postgres', 'CREATE SEQUENCE runs');
my $call_boundary =
  "SELECT idempotency.idempotent_call('boundary', NULL, 'SELECT nextval(''runs'')')";
my $early = $node->background_psql('postgres');
$early->query_safe('BEGIN; SELECT now()');
is($node->safe_psql('postgres', $call_boundary), '1', 'the key runs');
$node->safe_psql('postgres',
	"UPDATE idempotency.keys SET expires_at = clock_timestamp() WHERE key = 'boundary'");
is($node->safe_psql('postgres',
		"SELECT expires_at <= now() FROM idempotency.keys WHERE key = 'boundary'"),
	't', 'the key has expired for a new transaction');
is(expire(), '0',
	'expire() keeps a key still live for a running transaction');
is( $early->query_safe(
		"SELECT ($call_boundary)::text || ':' || idempotency.last_call_replayed()"),
	'1:true',
	'that transaction replays the key');
$early->query_safe('COMMIT');
$early->quit;
is(expire(), '1', 'once it has ended, the key is deleted');
is($node->safe_psql('postgres', $call_boundary), '2', 'and runs again');

# Without the library preloaded, expire() still works; the worker's status
# says why it is empty.
$node->adjust_conf('postgresql.conf', 'shared_preload_libraries', "''");
$node->restart;
$node->safe_psql('postgres',
	"SELECT idempotency.idempotent_call('unloaded', NULL, 'SELECT 1');"
	  . expire_keys_sql("key = 'unloaded'"));
is(expire(), '1', 'expire() works without shared_preload_libraries');
my ($ret, $stdout, $stderr) = $node->psql('postgres',
	'SELECT * FROM idempotency.expiry_status',
	extra_params => [ '-v', 'VERBOSITY=verbose' ]);
like(
	$stderr,
	qr/55000: the idempotency expiry worker is not running/,
	'the status view explains that the worker needs preloading');

$node->stop;
done_testing();
