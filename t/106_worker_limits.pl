# The expiry worker under constraints: it skips rows another transaction
# has locked (never waits for them), pauses idempotency.expire_batch_delay
# between batches, and logs, then retries next round, when no
# max_worker_processes slot is free.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib $FindBin::RealBin;
use IdempotencyTest;

my $node = preloaded_node('worker_limits',
	conf => "idempotency.expire_interval = '1s'\n");
$node->safe_psql('postgres', 'CREATE EXTENSION idempotency');

# Expired keys, committed together so that one round finds them all.
sub expired_keys
{
	my ($db, @keys) = @_;
	$node->safe_psql($db,
		"BEGIN;"
		  . join('',
			map { "SELECT idempotency.idempotent_call('$_', NULL, 'SELECT 1');" }
			  @keys)
		  . expire_keys_sql("key IN ('" . join("', '", @keys) . "')")
		  . 'COMMIT;');
}

sub rounds_in
{
	my ($db) = @_;
	return $node->safe_psql('postgres',
		"SELECT coalesce(sum(rounds), 0) FROM idempotency.expiry_status WHERE datname = '$db'"
	);
}

# --- a row another transaction has locked is skipped, not waited for -----
expired_keys('postgres', 'locked', 'free');
my $holder = $node->background_psql('postgres');
$holder->query_safe(
	"BEGIN; SELECT key FROM idempotency.keys WHERE key = 'locked' FOR UPDATE");
my $rounds = rounds_in('postgres');
# Two whole rounds end while the lock is held: a worker waiting for the row
# would end none.
$node->poll_query_until('postgres',
	"SELECT sum(rounds) >= $rounds + 2 FROM idempotency.expiry_status WHERE datname = 'postgres'"
) or die 'rounds stopped while a row was locked';
is( $node->safe_psql(
		'postgres', 'SELECT string_agg(key, \',\' ORDER BY key) FROM idempotency.keys'),
	'locked',
	'the rounds deleted the free key and left the locked one');
is( $node->safe_psql(
		'postgres',
		"SELECT last_error IS NULL FROM idempotency.expiry_status WHERE datname = 'postgres'"
	),
	't',
	'skipping it is no error');
$holder->query_safe('COMMIT');
$holder->quit;
$node->poll_query_until('postgres', 'SELECT count(*) = 0 FROM idempotency.keys')
  or die 'the unlocked key stays';
pass('once the lock is gone, a later round deletes it');

# --- expire_batch_delay: the worker pauses after each batch ---------------
# With one key per batch and a 10 s pause, the worker is seen waiting (wait
# event Extension) in the middle of its round, some of the three keys
# deleted and some not; without the pause it never waits inside a round.
$node->safe_psql('postgres', 'CREATE DATABASE paced');
$node->safe_psql(
	'paced', q{
CREATE EXTENSION idempotency;
ALTER DATABASE paced SET idempotency.expire_batch_size = 1;
ALTER DATABASE paced SET idempotency.expire_batch_delay = '10s';
});
expired_keys('paced', 'p1', 'p2', 'p3');
ok( $node->poll_query_until(
		'paced', q{
SELECT count(*) = 1
  FROM pg_stat_activity
 WHERE backend_type = 'idempotency expiry' AND datname = 'paced'
   AND wait_event_type = 'Extension' AND wait_event = 'Extension'
   AND (SELECT count(*) FROM idempotency.keys) BETWEEN 1 AND 2}),
	'the worker pauses between batches');
$node->safe_psql('postgres', 'ALTER DATABASE paced RESET idempotency.expire_batch_delay');
$node->poll_query_until('paced', 'SELECT count(*) = 0 FROM idempotency.keys')
  or die 'the paced keys stay';
pass('the round goes on after the pauses');

# --- no free max_worker_processes slot ------------------------------------
# The launcher takes the only slot: each round logs that it could not start
# a worker, and tries again the next.
$node->append_conf('postgresql.conf', q{
max_worker_processes = 1
max_logical_replication_workers = 0
});
$node->restart;
expired_keys('postgres', 'waits-for-a-slot');
my $log_start = -s $node->logfile;
my $no_slot = qr/idempotency launcher could not start an expiry worker.*\n.*HINT:\s+Raise max_worker_processes/;
my $tries = sub {
	my @lines = substr(slurp_file($node->logfile), $log_start) =~ /$no_slot/g;
	return scalar @lines;
};
my $deadline = time + $PostgreSQL::Test::Utils::timeout_default;
sleep 1 while $tries->() < 2 && time < $deadline;
cmp_ok($tries->(), '>=', 2,
	'with no free worker slot, the launcher logs so in every round');
is($node->safe_psql('postgres', 'SELECT count(*) FROM idempotency.keys'),
	'1', 'and deletes nothing');
$node->append_conf('postgresql.conf', 'max_worker_processes = 8');
$node->restart;
$node->poll_query_until('postgres', 'SELECT count(*) = 0 FROM idempotency.keys')
  or die 'the key stays once slots are free';
pass('with a free slot again, the key is deleted');

$node->stop;
done_testing();
