# The commit boundary: the server crashes after a call's commit record is
# written but before the client hears the commit. The client has no answer
# and retries; the retry must replay the committed response, never run fn
# again. The commit is held at that point by synchronous replication: with
# a synchronous standby that does not answer, a backend writes and flushes
# its commit record, then waits (wait event SyncRep) before it tells the
# client. Three cases:
# - one node, crashed (immediate stop) while the call waits there;
# - a primary with a synchronous standby that received the commit but, its
#   replay paused, has not applied it (synchronous_commit = remote_apply):
#   the primary dies, the standby is promoted, the retry goes to it;
# - a prepared transaction holding a key across a crash: the key stays
#   held (IK409) until COMMIT PREPARED (then it replays, fn run once).
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use IdempotencyTest;
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $setup = q{
CREATE EXTENSION idempotency;
CREATE TABLE runs (key text NOT NULL);
CREATE FUNCTION work(op_key text) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO runs VALUES (op_key);
  RETURN jsonb_build_object('key', op_key, 'at', clock_timestamp());
END $$;
};

# Starts the call for `key` on `node` in the background, as a client
# named `key`, with the session settings in `settings`.
sub start_call
{
	my ($node, $key, @settings) = @_;
	my $call = { out => '', err => '' };
	$call->{handle} = IPC::Run::start(
		[
			'psql', '-X', '-q', '-A', '-t', '-v', 'ON_ERROR_STOP=1',
			'-d', $node->connstr('postgres') . " application_name=$key",
			(map { ('-c', $_) } @settings),
			'-c', work_call_sql($key)
		],
		'<', \undef, '>', \$call->{out}, '2>', \$call->{err});
	return $call;
}

# Waits until the call's backend has written its commit record and waits
# for the synchronous standby.
sub wait_for_syncrep
{
	my ($node, $key) = @_;
	return $node->poll_query_until('postgres',
		"SELECT wait_event = 'SyncRep' FROM pg_stat_activity WHERE application_name = '$key'");
}

# --- one node ---------------------------------------------------------------
my $node = preloaded_node('boundary',
	init => { allows_streaming => 1 },
	conf => "max_prepared_transactions = 5\n");
# (Synchronous replication needs max_wal_senders > 0, which allows_streaming
# sets: without it a commit never waits.)
$node->safe_psql('postgres', $setup);
# From now on every commit waits for a standby that never comes.
$node->append_conf('postgresql.conf', "synchronous_standby_names = 'nobody'\n");
$node->reload;
$node->poll_query_until('postgres', 'SHOW synchronous_standby_names', 'nobody')
  or die 'the reload never took effect';

my $call = start_call($node, 'one-node');
ok(wait_for_syncrep($node, 'one-node'),
	'one node: the call wrote its commit record and waits before answering');
$node->stop('immediate');
$call->{handle}->finish;
is($call->{out}, '', 'one node: the client never heard the commit');
like($call->{err}, qr/server closed the connection|connection to server|terminating connection/,
	'one node: the client lost its connection');

$node->append_conf('postgresql.conf', "synchronous_standby_names = ''\n");
$node->start;
is(runs_of($node, 'one-node'), '1', 'one node: the commit survived the crash');
my ($response, $replayed) = split /\|/, $node->safe_psql('postgres', work_call_sql('one-node'));
is($replayed, 't', 'one node: the retry replays');
is(runs_of($node, 'one-node'), '1', 'one node: fn ran once');
is($response, $node->safe_psql('postgres',
		"SELECT response::text FROM idempotency.keys WHERE key = 'one-node'"),
	'one node: the retry answers the committed response');

# --- a prepared transaction across a crash ----------------------------------
my ($prepared) = split /\|/, $node->safe_psql('postgres',
	'BEGIN; ' . work_call_sql('prepared') . "; PREPARE TRANSACTION 'across-crash'");
$node->stop('immediate');
$node->start;
is($node->safe_psql('postgres', "SELECT count(*) FROM pg_prepared_xacts WHERE gid = 'across-crash'"),
	'1', 'prepared: the prepared transaction survived the crash');
is(sqlstate_of($node, work_call_sql('prepared')), 'IK409',
	'prepared: after the crash its key still answers IK409');
is(runs_of($node, 'prepared'), '0', 'prepared: nothing committed yet');
$node->safe_psql('postgres', "COMMIT PREPARED 'across-crash'");
($response, $replayed) = split /\|/, $node->safe_psql('postgres', work_call_sql('prepared'));
is_deeply([ $response, $replayed ], [ $prepared, 't' ],
	'prepared: after COMMIT PREPARED the retry replays the prepared response');
is(runs_of($node, 'prepared'), '1', 'prepared: fn ran once');

# And rolled back after a crash: the next call runs fn.
$node->safe_psql('postgres',
	'BEGIN; ' . work_call_sql('prepared-undone') . "; PREPARE TRANSACTION 'undone'");
$node->stop('immediate');
$node->start;
$node->safe_psql('postgres', "ROLLBACK PREPARED 'undone'");
($response, $replayed) = split /\|/, $node->safe_psql('postgres', work_call_sql('prepared-undone'));
is($replayed, 'f', 'prepared: after ROLLBACK PREPARED the next call runs fn');
is(runs_of($node, 'prepared-undone'), '1', 'prepared: once');
$node->stop;

# --- a primary and a synchronous standby -------------------------------------
my $primary = preloaded_node('boundary_primary', init => { allows_streaming => 1 });
$primary->safe_psql('postgres', $setup);
$primary->backup('base');
my $standby = PostgreSQL::Test::Cluster->new('boundary_standby');
$standby->init_from_backup($primary, 'base', has_streaming => 1);
$standby->append_conf('postgresql.conf', "synchronous_standby_names = ''\n");
$standby->start;
$primary->append_conf('postgresql.conf', "synchronous_standby_names = 'boundary_standby'\n");
$primary->reload;
$primary->poll_query_until('postgres',
	"SELECT sync_state = 'sync' FROM pg_stat_replication WHERE application_name = 'boundary_standby'")
  or die 'the standby never became synchronous';

# The standby receives and flushes WAL but applies none: a remote_apply
# commit waits for it.
$standby->safe_psql('postgres', 'SELECT pg_wal_replay_pause()');
$standby->poll_query_until('postgres', "SELECT pg_get_wal_replay_pause_state() = 'paused'")
  or die 'replay never paused';
$call = start_call($primary, 'failover', 'SET synchronous_commit = remote_apply');
ok(wait_for_syncrep($primary, 'failover'),
	'failover: the call wrote its commit record and waits for the standby');
my $commit_lsn = $primary->safe_psql('postgres', 'SELECT pg_current_wal_flush_lsn()');
$standby->poll_query_until('postgres',
	"SELECT pg_last_wal_receive_lsn() >= '$commit_lsn'::pg_lsn")
  or die 'the standby never received the commit';
is($standby->safe_psql('postgres', "SELECT count(*) FROM runs WHERE key = 'failover'"),
	'0', 'failover: the standby has not applied the commit');
$primary->stop('immediate');
$call->{handle}->finish;
is($call->{out}, '', 'failover: the client never heard the commit');

$standby->promote;
is(runs_of($standby, 'failover'), '1', 'failover: the promoted standby holds the commit');
($response, $replayed) = split /\|/, $standby->safe_psql('postgres', work_call_sql('failover'));
is($replayed, 't', 'failover: the retry on the promoted standby replays');
is(runs_of($standby, 'failover'), '1', 'failover: fn ran once');
is($response, $standby->safe_psql('postgres',
		"SELECT response::text FROM idempotency.keys WHERE key = 'failover'"),
	'failover: the retry answers the committed response');
$standby->stop;

done_testing();
