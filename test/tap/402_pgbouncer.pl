# Behind PgBouncer, in transaction pooling and in session pooling: a retried
# request runs once and every retry replays it, whichever server connection
# each transaction lands on; a concurrent duplicate gets IK409; and
# last_call_replayed() answers for the caller's own call - in the same
# statement under transaction pooling, and for a new client on a reused
# server connection under session pooling. And generic plans through the
# extended protocol under transaction pooling: pgbench's unnamed statements,
# planned generically, for many keys and values, each run once.
use strict;
use warnings;
use FindBin;
use lib $FindBin::RealBin;
use IdempotencyTest;
use IPC::Run;
use PostgreSQL::Test::BackgroundPsql;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

# BackgroundPsql sessions may only be started from a Cluster's package;
# this one connects them to PgBouncer instead of the node.
package PooledClient
{
	use parent -norequire, 'PostgreSQL::Test::Cluster';

	sub connect
	{
		my ($class, $connstr) = @_;
		return PostgreSQL::Test::BackgroundPsql->new(0,
			[ 'psql', '-XAtq', '-d', $connstr, '-v', 'VERBOSITY=verbose', '-f', '-' ]);
	}
}

my $node = preloaded_node('pgbouncer');
generic_plan_database($node, 'generic');
$node->safe_psql(
	'postgres', q{
CREATE EXTENSION idempotency;
CREATE TABLE runs (key text NOT NULL);
CREATE FUNCTION work(op_key text) RETURNS jsonb LANGUAGE sql AS $$
  INSERT INTO runs VALUES (op_key) RETURNING jsonb_build_object('key', op_key)
$$;
});

# One PgBouncer, two pools of at most two server connections on the same
# database: "txn" pools transactions, "sess" pools sessions (and resets each
# server connection with DISCARD ALL before the next client gets it).
my $bouncer_dir = PostgreSQL::Test::Utils::tempdir();
my $bouncer_port = PostgreSQL::Test::Cluster::get_free_port();
my $user = getpwuid($<);
my ($host, $port) = ($node->host, $node->port);
append_to_file("$bouncer_dir/userlist.txt", qq{"$user" ""\n});
append_to_file(
	"$bouncer_dir/pgbouncer.ini", qq{
[databases]
txn = host=$host port=$port dbname=postgres pool_mode=transaction pool_size=2
sess = host=$host port=$port dbname=postgres pool_mode=session pool_size=2
generic = host=$host port=$port dbname=generic pool_mode=transaction pool_size=2

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $bouncer_port
unix_socket_dir =
auth_type = trust
auth_file = $bouncer_dir/userlist.txt
logfile = $bouncer_dir/pgbouncer.log
pidfile = $bouncer_dir/pgbouncer.pid
max_client_conn = 20
server_reset_query = DISCARD ALL
});
my $bouncer;
# Stopped however the test ends.
END { local $?; $bouncer->kill_kill if $bouncer; }
$bouncer = IPC::Run::start([ 'pgbouncer', "$bouncer_dir/pgbouncer.ini" ],
	'>', "$bouncer_dir/stdout", '2>', "$bouncer_dir/stderr");

sub connstr
{
	my ($database) = @_;
	return "host=127.0.0.1 port=$bouncer_port dbname=$database user=$user";
}

my $deadline = time() + $PostgreSQL::Test::Utils::timeout_default;
until (run_log([ 'psql', '-XAtq', '-d', connstr('txn'), '-c', 'SELECT 1' ]))
{
	die 'PgBouncer does not answer' if time() > $deadline;
	sleep 1;
}

# The call, what it returned, whether it was a replay, and the server
# backend it ran on, all in one statement.
sub call
{
	my ($client, $key) = @_;
	my ($response, $replayed, $pid) = split /\|/,
	  $client->query_safe(
		"SELECT idempotency.idempotent_call('$key', NULL, 'SELECT work(\$1)', '$key'::text), "
		  . 'idempotency.last_call_replayed(), pg_backend_pid()');
	return { response => $response, replayed => $replayed, pid => $pid };
}

# The SQLSTATE the statement fails with; clears the client's error output.
sub sqlstate_through
{
	my ($client, $sql) = @_;
	$client->query($sql);
	my $state = $client->{stderr} =~ /ERROR:\s+([0-9A-Z]{5}):/ ? $1 : 'no error';
	$client->{stderr} = '';
	return $state;
}

sub begin_holding_server
{
	my ($client) = @_;
	return $client->query_safe('BEGIN; SELECT pg_backend_pid()');
}

# Transaction pooling. Client C and B take turns holding one of the two
# server connections in an open transaction, so each of A's calls must run
# on the other one: A's three calls alternate between the two.
{
	my ($a, $b, $c) = map { PooledClient->connect(connstr('txn')) } 1 .. 3;

	my $c_pid = begin_holding_server($c);
	my $first = call($a, 'txn-retry');
	my $b_pid = begin_holding_server($b);
	$c->query_safe('COMMIT');
	my $second = call($a, 'txn-retry');
	begin_holding_server($c);
	$b->query_safe('COMMIT');
	my $third = call($a, 'txn-retry');
	$c->query_safe('COMMIT');

	is($b_pid, $first->{pid}, 'txn: B held the connection of the first call');
	isnt($second->{pid}, $first->{pid},
		'txn: the second call ran on another server connection');
	isnt($third->{pid}, $second->{pid},
		'txn: the third call ran on another server connection again');
	is_deeply(
		[ map { $_->{response} } $first, $second, $third ],
		[ ('{"key": "txn-retry"}') x 3 ],
		'txn: three calls, one response');
	is_deeply(
		[ map { $_->{replayed} } $first, $second, $third ],
		[ 'f', 't', 't' ],
		'txn: last_call_replayed() tells the run from the replays');
	is(runs_of($node, 'txn-retry'), '1', 'txn: fn ran once');

	# A holds the key in an open transaction; B, on the other server
	# connection, gets IK409 at once, and replays once A has committed.
	$a->query_safe('BEGIN');
	is(call($a, 'txn-busy')->{replayed}, 'f', 'txn: A runs fn');
	is( sqlstate_through(
			$b,
			"SELECT idempotency.idempotent_call('txn-busy', NULL, 'SELECT work(\$1)', 'txn-busy'::text)"
		),
		'IK409',
		'txn: a concurrent duplicate gets IK409');
	$a->query_safe('COMMIT');
	is(call($b, 'txn-busy')->{replayed}, 't', 'txn: B replays after A commits');
	is(runs_of($node, 'txn-busy'), '1', 'txn: fn ran once for the duplicate');

	$_->quit for $a, $b, $c;
}

# Session pooling: each client keeps one server connection for its session.
{
	my ($s1, $s2) = map { PooledClient->connect(connstr('sess')) } 1 .. 2;
	my $first = call($s1, 'sess-retry');
	my $second = call($s2, 'sess-retry');
	my $third = call($s1, 'sess-retry');
	isnt($second->{pid}, $first->{pid},
		'sess: the two clients have two server connections');
	is_deeply(
		[ map { $_->{replayed} } $first, $second, $third ],
		[ 'f', 't', 't' ],
		'sess: one run, two replays');
	is($third->{response}, $first->{response}, 'sess: the same response');
	is(runs_of($node, 'sess-retry'), '1', 'sess: fn ran once');

	$s1->query_safe('BEGIN');
	call($s1, 'sess-busy');
	is( sqlstate_through(
			$s2,
			"SELECT idempotency.idempotent_call('sess-busy', NULL, 'SELECT work(\$1)', 'sess-busy'::text)"
		),
		'IK409',
		'sess: a concurrent duplicate gets IK409');
	$s1->query_safe('COMMIT');

	# S1 leaves; its server connection, reset with DISCARD ALL, goes to the
	# next client, who has made no call yet.
	my $s1_pid = $first->{pid};
	$s1->quit;
	my $s3 = PooledClient->connect(connstr('sess'));
	is( $s3->query_safe(
			'SELECT pg_backend_pid(), idempotency.last_call_replayed() IS NULL'),
		"$s1_pid|t",
		'sess: a new client on a reused server connection has made no call');
	my $fresh = call($s3, 'sess-new');
	is_deeply([ $fresh->{replayed}, $fresh->{pid} ], [ 'f', $s1_pid ],
		'sess: and its first call runs fn there, with the kept plan');
	$_->quit for $s2, $s3;
}

# Generic plans through the extended protocol, in transaction pooling: four
# pgbench clients share two server connections (unnamed statements: this
# PgBouncer keeps no named prepared statement across transactions).
generic_plan_run($node, 'generic', connstr('generic'), 'extended', 'pooled');

done_testing();
