# The server's clock jumps while keys live and while a claim is open
# (libfaketime moves the clock of the running server; the offset is read
# from a file on every clock read):
#
# - forward past a key's TTL: the key is expired, its retry runs fn as a new
#   request and expire() deletes an expired key; a jump between complete()
#   and COMMIT fails the commit with 40001 and leaves the key free;
# - backward during an open claim: complete() stores the key with the clock
#   it reads (expires_at - created_at is the TTL, the key is live, a CHECK
#   (expires_at > created_at) on the table holds), the commit succeeds and
#   the retry replays.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use FindBin;
use lib $FindBin::RealBin;
use IdempotencyTest;

# Installed by test/lib.sh (Debian's libfaketime).
my ($faketime) = glob('/usr/lib/*/faketime/libfaketime.so.1');
BAIL_OUT('libfaketime is not installed (apt-get install libfaketime)')
  unless defined $faketime && -f $faketime;

my $offset_file = PostgreSQL::Test::Utils::tempdir() . '/offset';
# Moves the server's clock to `offset` from the real time ("+0", "+2h", "-3h").
# The file is replaced by a rename: the server reads it on every clock
# read, and libfaketime ends a process that reads it half-written.
sub set_clock
{
	my ($offset) = @_;
	open my $fh, '>', "$offset_file.new" or die "cannot write $offset_file.new: $!";
	print $fh "$offset\n";
	close $fh;
	rename "$offset_file.new", $offset_file or die "cannot rename to $offset_file: $!";
}
set_clock('+0');

my $node = PostgreSQL::Test::Cluster->new('clock_jumps');
$node->init;
# The expiry worker stays off: expire() is called where the test needs it.
$node->append_conf('postgresql.conf',
	"shared_preload_libraries = 'idempotency'\nidempotency.expire_interval = 0\nidempotency.remember = 0\n");
{
	local $ENV{LD_PRELOAD} = $faketime;
	local $ENV{FAKETIME_TIMESTAMP_FILE} = $offset_file;
	local $ENV{FAKETIME_NO_CACHE} = '1';
	# Timeouts and waits keep the real monotonic clock.
	local $ENV{FAKETIME_DONT_FAKE_MONOTONIC} = '1';
	$node->start;
}
$node->safe_psql(
	'postgres', q{
CREATE EXTENSION idempotency;
ALTER DATABASE postgres SET idempotency.ttl = '1h';
CREATE TABLE runs (key text, at timestamptz DEFAULT clock_timestamp());
CREATE FUNCTION work(k text) RETURNS text LANGUAGE sql
  AS $$ INSERT INTO runs (key) VALUES (k) RETURNING 'run ' || (SELECT count(*) + 1 FROM runs WHERE key = k) $$;
});

# A call of work(key), answering its response's text and whether it replayed.
sub call { return "SELECT response #>> '{}', replayed FROM (" . work_call_sql($_[0]) . ") AS c(response, replayed)" }

# The server's clock, as a number of hours from the real one (rounded).
sub clock_offset_hours
{
	my $server = $node->safe_psql('postgres', 'SELECT extract(epoch FROM now())');
	return sprintf('%.0f', ($server - time()) / 3600);
}

# --- forward past the TTL ---------------------------------------------------
is($node->safe_psql('postgres', call('forward')),
	'run 1|f', 'a key runs at the real time');
$node->safe_psql('postgres',
	"SELECT idempotency.idempotent_call('left', NULL, 'SELECT 1')");
is($node->safe_psql('postgres', call('forward')),
	'run 1|t', 'and replays within its TTL');

set_clock('+2h');
is(clock_offset_hours(), '2', 'the server clock jumped two hours forward');
is($node->safe_psql('postgres', "SELECT state FROM idempotency.lookup('forward')"),
	'expired', 'the key is expired after the jump');
is($node->safe_psql('postgres', call('forward')),
	'run 2|f', 'its retry runs fn as a new request');
is(runs_of($node, 'forward'), '2', 'fn ran twice in all');
is($node->safe_psql('postgres', call('forward')),
	'run 2|t', 'the new run replays');
is( $node->safe_psql(
		'postgres',
		"SELECT expires_at - created_at = '1h' AND expires_at > now() FROM idempotency.keys WHERE key = 'forward'"
	),
	't',
	'the new row lives one hour from the jumped clock');
is($node->safe_psql('postgres', 'SELECT idempotency.expire()'),
	'1', 'expire() deletes the key the jump expired');
is($node->safe_psql('postgres', "SELECT count(*) FROM idempotency.keys WHERE key = 'left'"),
	'0', 'the expired key is gone');

# A forward jump past the TTL between complete() and COMMIT.
set_clock('+0');
my $handler = $node->background_psql('postgres');
$handler->query_safe(
	"BEGIN; SELECT replayed FROM idempotency.claim('late-commit', NULL); "
	  . "SELECT idempotency.complete('late-commit', '\"done\"')");
set_clock('+2h');
$handler->query("\\set ON_ERROR_STOP 0\n\\set VERBOSITY verbose\nCOMMIT");
like($handler->{stderr}, qr/40001/, 'a commit after the TTL passed fails with 40001');
$handler->quit;
is($node->safe_psql('postgres', "SELECT state FROM idempotency.lookup('late-commit')"),
	'absent', 'and nothing is stored');
like( $node->safe_psql(
		'postgres', q{
BEGIN;
SELECT replayed FROM idempotency.claim('late-commit', NULL);
SELECT idempotency.complete('late-commit', '"again"');
COMMIT;
}),
	qr/^f\n/,
	'the retry claims the key as new');

# --- backward during an open claim ------------------------------------------
set_clock('+0');
$node->safe_psql('postgres',
	'ALTER TABLE idempotency.keys ADD CONSTRAINT lives CHECK (expires_at > created_at)');
$handler = $node->background_psql('postgres');
$handler->query_safe(
	"BEGIN; SELECT replayed FROM idempotency.claim('backward', NULL); "
	  . "INSERT INTO runs (key) VALUES ('backward')");
set_clock('-3h');
$handler->query_safe("SELECT idempotency.complete('backward', '\"answer\"')");
my ($output, $failed) = $handler->query('COMMIT');
is($failed, 0, 'a claim completed after the clock jumped back commits');
$handler->quit;
is(clock_offset_hours(), '-3', 'the server clock jumped three hours back');
is( $node->safe_psql(
		'postgres', q{
SELECT expires_at - created_at, expires_at > now(), created_at <= now()
  FROM idempotency.keys WHERE key = 'backward'}),
	'01:00:00|t|t',
	'the stored row lives its TTL from the clock complete() read, and is live');
is( $node->safe_psql(
		'postgres',
		"SELECT replayed, response #>> '{}' FROM idempotency.claim('backward', NULL)"),
	't|answer',
	'the retry replays the response');
is(runs_of($node, 'backward'), '1', 'the work was applied once');
is($node->safe_psql('postgres', call('backward-call')),
	'run 1|f', 'idempotent_call stores keys at the jumped-back clock');
is($node->safe_psql('postgres', call('backward-call')),
	'run 1|t', 'and replays them');

# Back to the real time: the keys written three hours "ago" with a 1 h TTL
# are expired, and expiry deletes them.
set_clock('+0');
is($node->safe_psql('postgres', "SELECT state FROM idempotency.lookup('backward')"),
	'expired', 'back at the real time, the key written at the earlier clock is expired');
is($node->safe_psql('postgres', 'SELECT idempotency.expire() >= 2'),
	't', 'expire() deletes the keys written at the earlier clock');

ok($node->safe_psql('postgres', 'SELECT 1') eq '1', 'the server is up');
$node->stop;
unlike(slurp_file($node->logfile), qr/PANIC|TRAP|\(PID \d+\) was terminated/,
	'no backend crashed');

done_testing();
