# A caller that waits for another transaction's claim
# (idempotency.wait_timeout > 0) and is then handed the key: it must run fn
# if the holder rolled back, replay if the holder committed, and hold no
# claim lock once its call has returned. The holder is kept inside fn by an
# advisory lock the test holds, so every step happens in a known order.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use FindBin;
use lib $FindBin::RealBin;
use IdempotencyTest;

my $node = preloaded_node('claimwait');

$node->safe_psql(
	'postgres', q{
CREATE EXTENSION idempotency;
CREATE TABLE runs (key text NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp());
-- Blocks while the test holds advisory lock 4242.
CREATE FUNCTION work(op_key text) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_advisory_xact_lock(4242);
  INSERT INTO runs (key) VALUES (op_key);
  RETURN jsonb_build_object('key', op_key, 'at', clock_timestamp());
END $$;
});

my $claim_locks = q{SELECT count(*) FROM pg_locks
 WHERE pid = pg_backend_pid() AND locktype = 'advisory' AND objsubid < 0};

sub pid_of
{
	my ($session) = @_;
	return $session->query_safe('SELECT pg_backend_pid()');
}

sub wait_until_waiting
{
	my ($pid, $locktype) = @_;
	$node->poll_query_until('postgres',
		"SELECT count(*) > 0 FROM pg_locks WHERE pid = $pid AND NOT granted AND locktype = '$locktype'"
	) or die "backend $pid never waited for a $locktype lock";
}

# Returns the output of the statement sent with query_until, and clears
# the session's stderr for the next query.
sub collect
{
	my ($session) = @_;
	my ($out, $failed) = $session->query('SELECT 1');
	$out =~ s/\n?1$//;
	my $err = $session->{stderr};
	$session->{stderr} = '';
	return ($out, $err);
}

# The holder enters fn and is held there; the waiter waits for its claim,
# then (once fn has stored the row) for its transaction; the holder ends
# with $outcome (COMMIT or ROLLBACK). Returns the holder's response and the
# waiter's output and errors.
sub scenario
{
	my ($key, $outcome) = @_;
	my $gate = $node->background_psql('postgres');
	my $holder = $node->background_psql('postgres');
	my $waiter = $node->background_psql('postgres', on_error_stop => 0);
	my ($holder_pid, $waiter_pid) = (pid_of($holder), pid_of($waiter));

	$gate->query_safe('SELECT pg_advisory_lock(4242)');
	$holder->query_safe('BEGIN');
	$holder->query_until(qr/sent/, "\\echo sent\n" . work_call_sql($key) . ";\n");
	wait_until_waiting($holder_pid, 'advisory');

	$waiter->query_safe('BEGIN');
	$waiter->query_safe("SET LOCAL idempotency.wait_timeout = '60s'");
	$waiter->query_until(qr/sent/,
		"\\echo sent\n" . work_call_sql($key) . ";\n$claim_locks;\n");
	wait_until_waiting($waiter_pid, 'advisory');

	$gate->query_safe('SELECT pg_advisory_unlock(4242)');
	wait_until_waiting($waiter_pid, 'transactionid');
	my ($holder_out) = collect($holder);
	$holder->query_safe($outcome);

	my ($waiter_out, $waiter_err) = collect($waiter);
	$waiter->query('COMMIT');
	$_->quit for $gate, $holder, $waiter;
	my ($response) = $holder_out =~ /^(\{.*\})\|f$/m
	  or die "the holder did not run fn: $holder_out";
	return ($response, $waiter_out, $waiter_err);
}

my ($response, $out, $err) = scenario('wait-rollback', 'ROLLBACK');
like($out, qr/^\{"at": "[^"]+", "key": "wait-rollback"\}\|f\n0$/,
	'the waiter runs fn when the holder rolls back, holding no claim afterwards');
is($err, '', '... with no error or warning');
is(runs_of($node, 'wait-rollback'), '1', '... and fn ran once');

($response, $out, $err) = scenario('wait-commit', 'COMMIT');
is($out, "$response|t\n0",
	'the waiter replays when the holder commits, holding no claim afterwards');
is($err, '', '... with no error or warning');
is(runs_of($node, 'wait-commit'), '1', '... and fn ran once');

$node->stop;
done_testing();
