# The expiry worker under constraints: it skips rows another transaction
# has locked (never waits for them), deletes no more than
# idempotency.expire_rate keys a second, and logs, then retries next round,
# when no max_worker_processes slot is free.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib $FindBin::RealBin;
use IdempotencyTest;

# The worker starts off (interval 0) and is turned on at 1s once the first
# test holds its lock: a round between the commit of the keys and the lock
# would delete both.
my $node = preloaded_node('worker_limits',
	conf => "idempotency.expire_interval = 0\nidempotency.remember = 0\n");
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
$node->safe_psql('postgres',
	"ALTER SYSTEM SET idempotency.expire_interval = '1s'; SELECT pg_reload_conf()");
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

# --- expire_rate: the worker deletes no faster than the rate -------------
# One key per batch at 2 keys a second: at any moment a round has deleted
# at most 2 keys for each second since it began, and the batch under way.
# The bound below allows one key more. Unpaced, the worker deletes the 2000
# keys in well under a second; paced, the round would take 1000 seconds,
# longer than a poll waits, so only a reload that raises the rate of the
# running round ends it in time.
$node->safe_psql('postgres', 'CREATE DATABASE paced');
$node->safe_psql(
	'paced', q{
CREATE EXTENSION idempotency;
ALTER DATABASE paced SET idempotency.expire_batch_size = 1;
});
$node->safe_psql('postgres',
	"ALTER SYSTEM SET idempotency.expire_rate = 2; SELECT pg_reload_conf()");
my $paced_keys = 2000;
expired_keys('paced', map { "p$_" } 1 .. $paced_keys);
$node->poll_query_until('paced', "SELECT count(*) <= $paced_keys - 3 FROM idempotency.keys")
  or die 'the paced round deleted nothing';
my $within_rate = qq{
SELECT $paced_keys - (SELECT count(*) FROM idempotency.keys)
       <= 2 * extract(epoch FROM clock_timestamp() - coalesce(running_since, last_started)) + 2
  FROM idempotency.expiry_status WHERE datname = 'paced'};
for my $look (1 .. 3)
{
	is($node->safe_psql('paced', $within_rate),
		't', "look $look: no more than 2 keys deleted per second of the round");
	sleep 1;
}
cmp_ok($node->safe_psql('paced', 'SELECT count(*) FROM idempotency.keys'),
	'>', 0, 'the paced round is not over');
$node->safe_psql('postgres',
	"ALTER SYSTEM SET idempotency.expire_rate = 0; SELECT pg_reload_conf()");
ok( $node->poll_query_until(
		'paced', 'SELECT count(*) = 0 FROM idempotency.keys'),
	'raised by a reload, the rate applies to the running round, which deletes the rest');
is( $node->safe_psql(
		'postgres',
		"SELECT failed_rounds FROM idempotency.expiry_status WHERE datname = 'paced'"),
	'0',
	'no paced round failed');
$node->safe_psql('postgres',
	"ALTER SYSTEM RESET idempotency.expire_rate; SELECT pg_reload_conf()");

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
