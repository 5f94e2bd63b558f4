# Two-phase commit: a key claimed inside a transaction that is then
# prepared answers IK409 to everyone else until COMMIT PREPARED (then it
# replays the prepared response) or ROLLBACK PREPARED (then the next call
# runs fn). A waiting caller (idempotency.wait_timeout) is released by either.
# A prepared key survives a restart.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use FindBin;
use lib $FindBin::RealBin;
use IdempotencyTest;
use IPC::Run;
use Time::HiRes qw(time);

my $node = preloaded_node('twophase', conf => "max_prepared_transactions = 5\n");

$node->safe_psql(
	'postgres', q{
CREATE EXTENSION idempotency;
CREATE TABLE runs (key text NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE FUNCTION work(op_key text) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO runs (key) VALUES (op_key);
  RETURN jsonb_build_object('key', op_key, 'at', clock_timestamp());
END $$;
});

# Runs the call in one transaction and prepares it; returns the response
# the call answered inside the prepared transaction.
sub prepare_call
{
	my ($key, $gid) = @_;
	my $out = $node->safe_psql('postgres',
		'BEGIN; ' . work_call_sql($key) . "; PREPARE TRANSACTION '$gid'");
	my ($response, $replayed) = split /\|/, $out;
	die "$key did not run inside $gid" unless $replayed eq 'f';
	return $response;
}

# A caller that waits up to 60 s for the holder; runs in the background.
sub start_waiter
{
	my ($key, $name) = @_;
	my ($out, $err) = ('', '');
	my $handle = IPC::Run::start(
		[
			'psql', '-X', '-q', '-A', '-t', '-v', 'ON_ERROR_STOP=1',
			'-v', 'VERBOSITY=verbose', '-d',
			$node->connstr('postgres') . " application_name=$name",
			'-c', "SET idempotency.wait_timeout = '60s'",
			'-c', work_call_sql($key)
		],
		'<', \undef, '>', \$out, '2>', \$err);
	$node->poll_query_until('postgres',
		"SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE application_name = '$name'"
	) or die "waiter $name never waited";
	return { handle => $handle, out => \$out, err => \$err };
}

sub finish_waiter
{
	my ($waiter) = @_;
	$waiter->{handle}->finish;
	my $out = ${ $waiter->{out} };
	chomp $out;
	return ($out, ${ $waiter->{err} });
}

# --- COMMIT PREPARED: the key replays ---------------------------------------

my $prepared = prepare_call('2pc-commit', 'gid-commit');
is(sqlstate_of($node, work_call_sql('2pc-commit')),
	'IK409', 'a key inside a prepared transaction answers IK409');
my $started = time;
is( sqlstate_of($node, 
		"SET idempotency.wait_timeout = '300ms'; " . work_call_sql('2pc-commit')),
	'IK409',
	'... also after waiting out idempotency.wait_timeout');
cmp_ok(time - $started, '>=', 0.3, '... which it did wait');
is(runs_of($node, '2pc-commit'), '0', 'the prepared run is not visible yet');
$node->safe_psql('postgres', "COMMIT PREPARED 'gid-commit'");
is($node->safe_psql('postgres', work_call_sql('2pc-commit')),
	"$prepared|t", 'after COMMIT PREPARED the key replays the prepared response');
is(runs_of($node, '2pc-commit'), '1', '... and fn ran once');

# --- ROLLBACK PREPARED: the key runs ----------------------------------------

prepare_call('2pc-rollback', 'gid-rollback');
is(sqlstate_of($node, work_call_sql('2pc-rollback')),
	'IK409', 'a key inside another prepared transaction answers IK409');
$node->safe_psql('postgres', "ROLLBACK PREPARED 'gid-rollback'");
my ($response, $replayed) = split /\|/,
  $node->safe_psql('postgres', work_call_sql('2pc-rollback'));
is($replayed, 'f', 'after ROLLBACK PREPARED the next call runs fn');
is(runs_of($node, '2pc-rollback'), '1', '... once: the prepared run was rolled back');
is($node->safe_psql('postgres', work_call_sql('2pc-rollback')),
	"$response|t", '... and then replays');

# --- waiters are released by the outcome --------------------------------------

$prepared = prepare_call('2pc-wait-commit', 'gid-wait-commit');
my $waiter = start_waiter('2pc-wait-commit', 'waiter-commit');
$node->safe_psql('postgres', "COMMIT PREPARED 'gid-wait-commit'");
my ($out, $err) = finish_waiter($waiter);
is($out, "$prepared|t", 'a waiter replays once the prepared transaction commits');
is($err, '', '... without an error');
is(runs_of($node, '2pc-wait-commit'), '1', '... and fn ran once');

prepare_call('2pc-wait-rollback', 'gid-wait-rollback');
$waiter = start_waiter('2pc-wait-rollback', 'waiter-rollback');
$node->safe_psql('postgres', "ROLLBACK PREPARED 'gid-wait-rollback'");
($out, $err) = finish_waiter($waiter);
like($out, qr/^\{.*\}\|f$/,
	'a waiter runs fn once the prepared transaction rolls back');
is($err, '', '... without an error');
is(runs_of($node, '2pc-wait-rollback'), '1', '... and fn ran once');

# --- a prepared key survives a restart ----------------------------------------

$prepared = prepare_call('2pc-restart', 'gid-restart');
$node->restart;
is(sqlstate_of($node, work_call_sql('2pc-restart')),
	'IK409', 'after a restart the prepared key still answers IK409');
$node->safe_psql('postgres', "COMMIT PREPARED 'gid-restart'");
is($node->safe_psql('postgres', work_call_sql('2pc-restart')),
	"$prepared|t", '... and replays after COMMIT PREPARED');
is(runs_of($node, '2pc-restart'), '1', '... with fn run once');

is($node->safe_psql('postgres', 'SELECT count(*) FROM pg_prepared_xacts'),
	'0', 'no prepared transaction is left');
$node->stop;
done_testing();
