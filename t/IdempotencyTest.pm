# Helpers shared by the TAP tests: a node with the library preloaded, and
# the two questions most tests ask of it.
package IdempotencyTest;

use strict;
use warnings;

use Exporter 'import';
use PostgreSQL::Test::Cluster;

our @EXPORT =
  qw(preloaded_node sqlstate_of runs_of work_call_sql expire_keys_sql
  wait_until_serving crash_backend psql_or_undef citus_missing citus_node);

# A started node with shared_preload_libraries = 'idempotency', plus the
# postgresql.conf lines in `conf` and the init options in `init`.
sub preloaded_node
{
	my ($name, %options) = @_;
	my $node = PostgreSQL::Test::Cluster->new($name);
	$node->init(%{ $options{init} // {} });
	$node->append_conf('postgresql.conf',
		"shared_preload_libraries = 'idempotency'\n" . ($options{conf} // ''));
	$node->start;
	return $node;
}

# The SQLSTATE a statement fails with in database postgres, or 'no error'.
sub sqlstate_of
{
	my ($node, $sql) = @_;
	my ($rc, $stdout, $stderr) = $node->psql(
		'postgres', $sql,
		on_error_stop => 0,
		extra_params => [ '-v', 'VERBOSITY=verbose' ]);
	return $stderr =~ /ERROR:\s+([0-9A-Z]{5}):/ ? $1 : 'no error';
}

# How often fn ran for `key`: the tests' fn records each run in table runs.
sub runs_of
{
	my ($node, $key) = @_;
	return $node->safe_psql('postgres',
		"SELECT count(*) FROM runs WHERE key = '$key'");
}

# A call whose fn is the tests' work(key) function, answering the response
# and whether it was replayed.
sub work_call_sql
{
	my ($key) = @_;
	return "SELECT idempotency.idempotent_call('$key', NULL, "
	  . "'SELECT work(\$1)', '$key'::text), idempotency.last_call_replayed()";
}

# SQL that moves the lifetime of the keys matching `condition` (an SQL
# condition on idempotency.keys) into the past, TTL unchanged, so that they
# are expired now. A transaction cannot commit a key that has already
# expired, so a test makes expired keys this way (as a superuser).
sub expire_keys_sql
{
	my ($condition) = @_;
	return "UPDATE idempotency.keys "
	  . "SET created_at = created_at - (expires_at - now()) - interval '1 second', "
	  . "expires_at = now() - interval '1 second' WHERE $condition;";
}

# Waits until `node` accepts connections again, after a crash restart. A
# psql started while the server restarts may exit before it reads its
# input, and IPC::Run then dies writing the query to it (EPIPE): such
# attempts are retried, not fatal.
sub wait_until_serving
{
	my ($node) = @_;
	my $deadline = time + $PostgreSQL::Test::Utils::timeout_default;
	while (time < $deadline)
	{
		my $up = eval { $node->safe_psql('postgres', 'SELECT 1') eq '1' };
		return if $up;
		select(undef, undef, undef, 0.2);
	}
	die 'the server did not come back after a crash restart';
}

# SIGKILL to backend `pid` of `node`; true when it crashed the server: the
# log shows that backend killed (a backend that had just exited takes the
# signal as a zombie, and nothing happens). Returns once the server serves
# again.
sub crash_backend
{
	my ($node, $pid) = @_;
	my $offset = -s $node->logfile;
	my $crashed = 0;
	if (kill('KILL', $pid) == 1)
	{
		my $killed = qr/server process \(PID $pid\) was terminated by signal 9/;
		for (1 .. 50)
		{
			$crashed = $node->log_contains($killed, $offset);
			last if $crashed;
			select(undef, undef, undef, 0.1);
		}
	}
	wait_until_serving($node);
	return $crashed;
}

# $node->psql's (rc, stdout), or an empty list when psql could not even be
# run to its end (the server restarting under it): for fault injectors,
# whose every attempt may meet a crash restart.
sub psql_or_undef
{
	my ($node, $sql) = @_;
	my @result = eval { $node->psql('postgres', $sql) };
	return @result;
}

# Why the Citus tests cannot run here (Citus is not installed into the
# PostgreSQL under test), or '' when they can.
sub citus_missing
{
	my $pkglibdir = `pg_config --pkglibdir`;
	chomp $pkglibdir;
	return '' if -f "$pkglibdir/citus.so";
	return "Citus is not installed ($pkglibdir/citus.so is missing); "
	  . 'docs/scale-out.md says how to get it';
}

# A started Citus node with the extension preloaded, reachable over TCP on
# 127.0.0.1 (Citus connects to the other nodes by host and port), on `port`
# or a free one. Automatic 2PC recovery is off: tests that look at prepared
# transactions run recover_prepared_transactions() themselves.
sub citus_node
{
	my ($name, $port, $conf) = @_;
	my $node = PostgreSQL::Test::Cluster->new($name, defined $port ? (port => $port) : ());
	$node->init;
	$node->append_conf(
		'postgresql.conf', qq{
shared_preload_libraries = 'citus,idempotency'
listen_addresses = '127.0.0.1'
max_prepared_transactions = 20
citus.recover_2pc_interval = -1
} . ($conf // ''));
	$node->start;
	$node->safe_psql('postgres', 'CREATE EXTENSION citus');
	return $node;
}

1;
