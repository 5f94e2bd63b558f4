# On a hot standby the expiry worker stays away (no writes, no errors); after
# promotion it cleans the expired keys it finds.
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
# The primary's worker is off, so expired keys reach the standby and stay.
$primary->append_conf(
	'postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.expire_interval = 0
});
$primary->start;
$primary->safe_psql('postgres', 'CREATE EXTENSION idempotency');
$primary->backup('backup');

my $standby = PostgreSQL::Test::Cluster->new('standby');
$standby->init_from_backup($primary, 'backup', has_streaming => 1);
$standby->append_conf('postgresql.conf', q{idempotency.expire_interval = '1s'});
$standby->start;
my $log_start = -s $standby->logfile;

$primary->safe_psql('postgres',
	"SELECT idempotency.idempotent_call('k' || g, NULL, 'SELECT 1') FROM generate_series(1, 5) AS g;"
	  . expire_keys_sql('true'));
$primary->wait_for_catchup($standby);

sleep 3;    # three intervals
is($standby->safe_psql('postgres', 'SELECT count(*) FROM idempotency.keys'),
	'5', 'the standby keeps the expired keys');
is( $standby->safe_psql(
		'postgres',
		"SELECT count(*) FROM pg_stat_activity WHERE backend_type LIKE 'idempotency%'"
	),
	'0',
	'no expiry worker runs on the standby');
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
