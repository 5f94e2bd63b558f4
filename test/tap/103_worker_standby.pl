# On a hot standby the expiry worker stays away (no writes, no errors): in
# the same span in which the primary's worker runs rounds and deletes
# expired keys, the standby's runs none. After promotion it cleans the
# expired keys it finds.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib $FindBin::RealBin;
use IdempotencyTest;

my $primary = PostgreSQL::Test::Cluster->new('primary');
$primary->init(allows_streaming => 1);
$primary->append_conf(
	'postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.expire_interval = '1s'
# Expired keys are deleted, not kept as tombstones (213 has those).
idempotency.remember = 0
});
$primary->start;
$primary->safe_psql('postgres', 'CREATE EXTENSION idempotency');
$primary->backup('backup');

my $standby = PostgreSQL::Test::Cluster->new('standby');
$standby->init_from_backup($primary, 'backup', has_streaming => 1);
$standby->start;
my $log_start = -s $standby->logfile;

my $expired_keys =
  "SELECT idempotency.idempotent_call('k' || g, NULL, 'SELECT 1') FROM generate_series(1, 5) AS g;"
  . expire_keys_sql('true');
my $status =
  "SELECT coalesce(sum(rounds), 0) || ':' || coalesce(sum(total_deleted), 0) FROM idempotency.expiry_status";

# The primary's worker deletes expired keys; two more of its rounds later,
# the standby, configured alike, has run none.
$primary->safe_psql('postgres', $expired_keys);
$primary->poll_query_until('postgres',
	"SELECT total_deleted = 5 FROM idempotency.expiry_status WHERE datname = 'postgres'")
  or die 'the primary never deleted its expired keys';
my ($rounds) = split /:/, $primary->safe_psql('postgres', $status);
$primary->poll_query_until('postgres',
	"SELECT sum(rounds) >= $rounds + 2 FROM idempotency.expiry_status")
  or die 'the primary stopped its rounds';
$primary->wait_for_catchup($standby);
pass('the primary deleted its expired keys, and ran two more rounds');
is($standby->safe_psql('postgres', $status),
	'0:0', 'meanwhile the standby\'s worker ran no round');
is( $standby->safe_psql(
		'postgres',
		"SELECT count(*) FROM pg_stat_activity WHERE backend_type LIKE 'idempotency%'"
	),
	'0',
	'no expiry process runs on the standby');
unlike(
	substr(slurp_file($standby->logfile), $log_start),
	qr/\b(ERROR|FATAL|PANIC):/,
	'the standby logs no errors');
my ($ret, $stdout, $stderr) =
  $standby->psql('postgres', 'SELECT idempotency.expire()');
like(
	$stderr,
	qr/cannot execute idempotency\.expire\(\) during recovery/,
	'expire() refuses to run during recovery');

# The primary's worker off (a restart makes that certain), expired keys
# reach the standby and stay until it is promoted.
$primary->append_conf('postgresql.conf', 'idempotency.expire_interval = 0');
$primary->restart;
$primary->safe_psql('postgres', $expired_keys);
$primary->wait_for_catchup($standby);
is($standby->safe_psql('postgres', 'SELECT count(*) FROM idempotency.keys'),
	'5', 'the standby has the expired keys');

$standby->promote;
$standby->poll_query_until('postgres',
	'SELECT count(*) = 0 FROM idempotency.keys')
  or die 'the promoted standby does not clean';
pass('after promotion, the worker cleans');
ok( $standby->poll_query_until(
		'postgres',
		"SELECT total_deleted = 5 AND last_error IS NULL FROM idempotency.expiry_status WHERE datname = 'postgres'"
	),
	'and reports them in its status');
is($primary->safe_psql('postgres', 'SELECT count(*) FROM idempotency.keys'),
	'5', 'expire_interval = 0 kept the primary\'s worker off');

$standby->stop;
$primary->stop;
done_testing();
