# Crash recovery: a backend killed with SIGKILL in the middle of fn, and an
# immediate shutdown with claims open. After the restart no key is stuck, a
# retry runs fn exactly once, and keys committed before the crash replay the
# response they committed.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use FindBin;
use lib $FindBin::RealBin;
use IdempotencyTest;
use IPC::Run;

my $node = preloaded_node('crash', conf => "restart_after_crash = on\n");

$node->safe_psql(
	'postgres', q{
CREATE EXTENSION idempotency;
-- One row per execution of fn; fn sleeps for $2 seconds after writing it.
CREATE TABLE runs (key text NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE FUNCTION work(op_key text, pause float8) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO runs (key) VALUES (op_key);
  PERFORM pg_sleep(pause);
  RETURN jsonb_build_object('key', op_key, 'at', clock_timestamp());
END $$;
});

sub call_sql
{
	my ($key, $pause) = @_;
	return "SELECT idempotency.idempotent_call('$key', NULL, "
	  . "'SELECT work(\$1, \$2)', '$key'::text, ${pause}::float8)";
}

# A call with no pause; returns "response|replayed". Fails the test on error
# (an IK409 here would mean a stuck key).
sub call
{
	my ($key) = @_;
	return $node->safe_psql('postgres',
		call_sql($key, 0) . ', idempotency.last_call_replayed()');
}



# Starts psql running the statements in the background, as application
# $name; the test kills or abandons it.
sub start_session
{
	my ($name, @statements) = @_;
	my ($out, $err) = ('', '');
	my $handle = IPC::Run::start(
		[
			'psql', '-X', '-A', '-t', '-v', 'ON_ERROR_STOP=1', '-d',
			$node->connstr('postgres') . " application_name=$name",
			map { ('-c', $_) } @statements
		],
		'<', \undef, '>', \$out, '2>', \$err);
	return { handle => $handle, out => \$out, err => \$err };
}

sub backend_pid
{
	my ($name) = @_;
	return $node->safe_psql('postgres',
		"SELECT pid FROM pg_stat_activity WHERE application_name = '$name'");
}

# Waits until session $name is inside fn's sleep, holding its claim.
sub wait_inside_fn
{
	my ($name) = @_;
	$node->poll_query_until(
		'postgres', qq{
SELECT count(*) = 1 FROM pg_stat_activity AS a JOIN pg_locks AS l ON l.pid = a.pid
 WHERE a.application_name = '$name' AND a.wait_event = 'PgSleep'
   AND l.locktype = 'advisory' AND l.granted})
	  or die "session $name never reached fn";
}

# Waits until session $name has finished its call and sits in its open
# transaction.
sub wait_after_call
{
	my ($name) = @_;
	$node->poll_query_until(
		'postgres', qq{
SELECT count(*) = 1 FROM pg_stat_activity
 WHERE application_name = '$name' AND query LIKE 'SELECT pg_sleep%'
   AND wait_event = 'PgSleep'})
	  or die "session $name never finished its call";
}

sub finish_session
{
	my ($session) = @_;
	$session->{handle}->finish;
	return $session->{handle}->result;
}

# --- SIGKILL of a backend in the middle of fn -----------------------------

my $committed = call('kill-done');
like($committed, qr/^\{.*\}\|f$/, 'a key committed before the crash');

my $in_fn = start_session('victim', call_sql('kill-mid', 60));
wait_inside_fn('victim');
my $in_open_transaction = start_session('bystander', 'BEGIN',
	call_sql('kill-open', 0), 'SELECT pg_sleep(60)', 'COMMIT');
wait_after_call('bystander');
is(runs_of($node, 'kill-mid'), '0', 'fn of the victim has not committed its write');

my $victim_pid = backend_pid('victim');
kill 'KILL', $victim_pid;
$node->poll_query_until('postgres', 'SELECT true')
  or die 'the server did not come back after the crash';
isnt(finish_session($in_fn), 0, 'the killed session got an error');
isnt(finish_session($in_open_transaction),
	0, 'the crash ended the other open transaction too');
ok($node->log_contains("\\(PID $victim_pid\\) was terminated by signal 9"),
	'the server went through crash recovery');

is( $node->safe_psql('postgres',
		"SELECT count(*) FROM idempotency.keys WHERE key LIKE 'kill-%'"),
	'1',
	'only the key committed before the crash is stored');
my ($response, $replayed) = split /\|/, call('kill-mid');
is($replayed, 'f', 'the key killed inside fn is not stuck: its retry runs fn');
is(runs_of($node, 'kill-mid'), '1', '... exactly once');
is(call('kill-mid'), "$response|t", '... and the next retry replays it');
($response, $replayed) = split /\|/, call('kill-open');
is($replayed, 'f', 'the key of the open transaction is not stuck: its retry runs fn');
is(runs_of($node, 'kill-open'), '1', '... exactly once');
is(call('kill-done'), ($committed =~ s/\|f$/|t/r),
	'the key committed before the crash replays its response');
is(runs_of($node, 'kill-done'), '1', '... without running fn again');

# --- immediate shutdown with claims open ------------------------------------

$committed = call('stop-done');
my $holding_claim = start_session('in-fn', call_sql('stop-mid', 60));
wait_inside_fn('in-fn');
my $holding_row = start_session('open-tx', 'BEGIN', call_sql('stop-open', 0),
	'SELECT pg_sleep(60)', 'COMMIT');
wait_after_call('open-tx');
# A third caller meets both keys in progress.
is(sqlstate_of($node, call_sql('stop-mid', 0)),
	'IK409', 'before the stop, a key inside fn answers IK409');
is(sqlstate_of($node, call_sql('stop-open', 0)),
	'IK409', 'before the stop, a key stored by an open transaction answers IK409');

$node->stop('immediate');
finish_session($holding_claim);
finish_session($holding_row);
$node->start;

is( $node->safe_psql('postgres',
		"SELECT count(*) FROM idempotency.keys WHERE key LIKE 'stop-%'"),
	'1',
	'after the restart only the key committed before the stop is stored');
($response, $replayed) = split /\|/, call('stop-mid');
is($replayed, 'f', 'the key that was inside fn is not stuck: its retry runs fn');
is(runs_of($node, 'stop-mid'), '1', '... exactly once');
is(call('stop-mid'), "$response|t", '... and the next retry replays it');
($response, $replayed) = split /\|/, call('stop-open');
is($replayed, 'f', 'the key of the open transaction is not stuck: its retry runs fn');
is(runs_of($node, 'stop-open'), '1', '... exactly once');
is(call('stop-done'), ($committed =~ s/\|f$/|t/r),
	'the key committed before the stop replays its response');
is(runs_of($node, 'stop-done'), '1', '... without running fn again');

$node->stop;
done_testing();
