# The expiry launcher comes back after pg_terminate_backend and after a
# crash-restart of the server; an error in a round is logged and recorded,
# and neither restarts the launcher nor stops the other databases' rounds.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib $FindBin::RealBin;
use IdempotencyTest;

my $node = PostgreSQL::Test::Cluster->new('expiry_restart');
$node->init;
$node->append_conf(
	'postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.expire_interval = '1s'
# Expired keys are deleted, not kept as tombstones (213 has those).
idempotency.remember = 0
restart_after_crash = on
});
$node->start;

for my $db ('healthy', 'broken')
{
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	$node->safe_psql($db, 'CREATE EXTENSION idempotency');
}

sub launcher_pid
{
	return $node->safe_psql('postgres',
		"SELECT pid FROM pg_stat_activity WHERE backend_type = 'idempotency launcher'"
	);
}

# A new launcher, other than $old_pid, runs.
sub wait_for_new_launcher
{
	my ($old_pid) = @_;
	$node->poll_query_until('postgres',
		"SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'idempotency launcher' AND pid <> $old_pid"
	) or die 'the launcher did not come back';
}

# An expired key in $db is deleted by the worker.
sub expires_in
{
	my ($db, $key) = @_;
	$node->safe_psql($db,
		"SELECT idempotency.idempotent_call('$key', NULL, 'SELECT 1');"
		  . expire_keys_sql("key = '$key'"));
	return $node->poll_query_until($db,
		"SELECT count(*) = 0 FROM idempotency.keys WHERE key = '$key'");
}

ok(expires_in('healthy', 'first'), 'the worker cleans');
my $launcher = launcher_pid();
like($launcher, qr/^\d+$/, 'one launcher');

# An error in every round of one database.
$node->safe_psql('broken', 'DROP INDEX idempotency.keys_expires_at_idx');
$node->safe_psql('broken',
	"SELECT idempotency.idempotent_call('stuck', NULL, 'SELECT 1');"
	  . expire_keys_sql("key = 'stuck'"));
$node->poll_query_until('healthy',
	"SELECT failed_rounds >= 2 FROM idempotency.expiry_status WHERE datname = 'broken'"
) or die 'no failed rounds recorded';
like(
	$node->safe_psql(
		'healthy',
		"SELECT last_error FROM idempotency.expiry_status WHERE datname = 'broken'"
	),
	qr/keys_expires_at_idx .* does not exist/,
	'the round\'s error is recorded in the status view');
ok($node->log_contains(qr/ERROR:  index idempotency\.keys_expires_at_idx/),
	'and logged');
is(launcher_pid(), $launcher, 'the launcher did not restart');

# An index in timestamptz's default order would serve callers' queries (and
# their EXPLAIN ANALYZE would count other roles' keys): refused as well.
$node->safe_psql('broken',
	'CREATE INDEX keys_expires_at_idx ON idempotency.keys (expires_at)');
my $failed = $node->safe_psql('healthy',
	"SELECT failed_rounds FROM idempotency.expiry_status WHERE datname = 'broken'");
# Two more rounds: the second began after the index was there.
$node->poll_query_until('healthy',
	"SELECT failed_rounds > $failed + 1 FROM idempotency.expiry_status WHERE datname = 'broken'"
) or die 'no failed round with the default order';
is($node->safe_psql('broken', "SELECT count(*) FROM idempotency.keys WHERE key = 'stuck'"),
	'1', 'an expires_at index without the expiry_ops operator class is refused: nothing expires');
like(
	$node->safe_psql(
		'healthy',
		"SELECT last_error FROM idempotency.expiry_status WHERE datname = 'broken'"
	),
	qr/keys_expires_at_idx on idempotency\.keys \(expires_at idempotency\.expiry_ops\) does not exist/,
	'... and the error names the operator class');
$node->safe_psql('broken', 'DROP INDEX idempotency.keys_expires_at_idx');
ok(expires_in('healthy', 'despite-error'),
	'other databases are still cleaned');
$node->safe_psql('broken',
	'CREATE INDEX keys_expires_at_idx ON idempotency.keys (expires_at idempotency.expiry_ops)');
$node->poll_query_until('broken',
	"SELECT count(*) = 0 FROM idempotency.keys WHERE key = 'stuck'")
  or die 'the repaired database is not cleaned';
pass('once repaired, the database is cleaned again');

# pg_terminate_backend of the launcher.
$node->safe_psql('postgres', "SELECT pg_terminate_backend($launcher)");
wait_for_new_launcher($launcher);
pass('the launcher comes back after pg_terminate_backend');
ok(expires_in('healthy', 'after-terminate'), 'and cleans');

# kill -9 of a backend: the postmaster restarts every process.
$launcher = launcher_pid();
my $victim = $node->background_psql('postgres');
my $victim_pid = $victim->query_safe('SELECT pg_backend_pid()');
my $log_offset = -s $node->logfile;
kill 'KILL', $victim_pid;
$node->wait_for_log(qr/all server processes terminated; reinitializing/,
	$log_offset);
$victim->quit;
$node->poll_query_until('postgres', 'SELECT true')
  or die 'the server did not come back';
wait_for_new_launcher($launcher);
pass('the launcher comes back after a crash-restart');
ok(expires_in('healthy', 'after-crash'), 'and cleans');

$node->stop;
done_testing();
