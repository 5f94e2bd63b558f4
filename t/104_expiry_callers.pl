# Expiry never takes a key from a caller: a key whose claim a caller holds
# (it saw the key expired and is running fn to replace it) is skipped, and a
# key still live for a transaction that started before it expired is kept.
# idempotency.expire() works without preloading.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib $FindBin::RealBin;
use IdempotencyTest;
use Time::HiRes qw(sleep);

my $node = PostgreSQL::Test::Cluster->new('expiry_callers');
$node->init;
# The worker is off: idempotency.expire() runs the rounds, when the test says.
$node->append_conf(
	'postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.expire_interval = 0
});
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION idempotency');

sub expire
{
	return $node->safe_psql('postgres', 'SELECT idempotency.expire()');
}

# A caller replacing an expired key under REPEATABLE READ. Had expire()
# deleted the row it is about to replace, its update would fail with a
# serialization error.
$node->safe_psql('postgres',
	"SELECT idempotency.idempotent_call('renewed', NULL, 'SELECT ''old''');"
	  . expire_keys_sql("key = 'renewed'"));
my $caller = $node->background_psql('postgres');
$caller->query_safe('BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1');
$caller->query_until(
	qr/calling/, q{
\echo calling
SELECT idempotency.idempotent_call('renewed', NULL, 'SELECT ''new'' FROM pg_sleep(2)');
});
$node->poll_query_until('postgres',
	"SELECT count(*) = 1 FROM pg_stat_activity WHERE wait_event = 'PgSleep'")
  or die 'the caller never ran fn';
is(expire(), '0', 'expire() skips the key a caller is replacing');
my ($output, $failed) = $caller->query('COMMIT');
is($failed, 0, 'the caller commits without a serialization error');
like($output, qr/new/, 'the caller ran fn');
$caller->quit;
is( $node->safe_psql(
		'postgres',
		"SELECT response #>> '{}' FROM idempotency.keys WHERE key = 'renewed'"),
	'new',
	'the key holds the new response');

# A transaction that started before a key expired still replays it. fn
# answers its run number.
$node->safe_psql('postgres', 'CREATE SEQUENCE runs');
my $call_boundary =
  "SELECT idempotency.idempotent_call('boundary', NULL, 'SELECT nextval(''runs'')')";
is($node->safe_psql('postgres', "SET idempotency.ttl = '3 seconds'; $call_boundary"),
	'1', 'a key that lives 3 seconds');
my $early = $node->background_psql('postgres');
$early->query_safe('BEGIN; SELECT now()');
sleep 3.5;
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
