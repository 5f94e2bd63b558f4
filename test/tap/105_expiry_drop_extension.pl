# DROP EXTENSION idempotency while an expiry round runs in the database ends
# the round quietly: no error, no failed round, and the worker goes on with
# its next rounds once the extension is back.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib $FindBin::RealBin;
use IdempotencyTest;

# Batches of 10 keys at 1 key a second: a round over 30 keys waits 10 s
# after its first batch, and again after its second.
my $node = preloaded_node(
	'expiry_drop_extension', conf => q{
idempotency.expire_interval = '1s'
# Expired keys are deleted, not kept as tombstones (213 has those).
idempotency.remember = 0
idempotency.expire_batch_size = 10
idempotency.expire_rate = 1
});
my $log_start = -s $node->logfile;
$node->safe_psql('postgres', 'CREATE EXTENSION idempotency');
$node->safe_psql('postgres', 'CREATE DATABASE shop');
$node->safe_psql('shop', 'CREATE EXTENSION idempotency');

sub store_expired_keys
{
	my ($prefix, $count) = @_;
	$node->safe_psql('shop',
		"BEGIN;"
		  . join('',
			map { "SELECT idempotency.idempotent_call('$prefix-$_', NULL, 'SELECT 1');" }
			  1 .. $count)
		  . expire_keys_sql("key LIKE '$prefix-%'")
		  . 'COMMIT;');
}

my $worker_in_shop =
  "FROM pg_stat_activity WHERE backend_type = 'idempotency expiry' AND datname = 'shop'";

store_expired_keys('old', 30);
# The round has deleted its first batch and waits for the next one's turn.
$node->poll_query_until('shop',
	"SELECT count(*) < 30 FROM idempotency.keys")
  or die 'the worker deleted no key';
# Its wait has a name of its own from PostgreSQL 17 on.
my $pace_wait = $node->pg_version >= 17 ? 'IdempotencyExpiryPace' : 'Extension';
$node->poll_query_until('postgres',
	"SELECT count(*) = 1 $worker_in_shop AND wait_event = '$pace_wait'")
  or die 'the worker does not pause';
my $worker_pid = $node->safe_psql('postgres', "SELECT pid $worker_in_shop");

# When its next batch is due, the worker finds the table gone.
$node->safe_psql('shop', 'DROP EXTENSION idempotency');
$node->poll_query_until('postgres',
	"SELECT count(*) = 0 FROM pg_stat_activity WHERE pid = $worker_pid")
  or die 'the worker did not end';

my $log = slurp_file($node->logfile, $log_start);
unlike($log, qr/ERROR/, 'the round logs no error');
unlike($log, qr/exited with exit code/, 'the worker ends normally');
is( $node->safe_psql(
		'postgres',
		"SELECT count(*) FROM idempotency.expiry_status WHERE datname = 'shop'"),
	'0',
	'no round, failed or not, is left on record for the database');

# With the extension back, later rounds clean the database again.
$node->safe_psql('shop', 'CREATE EXTENSION idempotency');
store_expired_keys('new', 5);
ok( $node->poll_query_until(
		'shop', 'SELECT count(*) = 0 FROM idempotency.keys'),
	'later rounds delete expired keys');
is( $node->safe_psql(
		'postgres',
		"SELECT failed_rounds FROM idempotency.expiry_status WHERE datname = 'shop'"),
	'0',
	'without a failed round');

done_testing();
