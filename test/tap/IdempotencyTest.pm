# Helpers shared by the TAP tests: a node with the library preloaded, and
# the two questions most tests ask of it.
package IdempotencyTest;

use strict;
use warnings;

use Exporter 'import';
use FindBin ();
use PostgreSQL::Test::Cluster;
use Test::More;
use IPC::Run;
use POSIX ();
use PostgreSQL::Test::Utils ();
use Time::HiRes ();

our @EXPORT =
  qw(preloaded_node sqlstate_of runs_of work_call_sql expire_keys_sql
  wait_until_serving crash_backend psql_or_undef citus_missing citus_node
  citus_cluster citus_add_workers tenant_accounts_sql delegated_pay_sql
  role_setting_on_nodes start_paying_clients replay_stored_keys
  run_storm
  check_storm check_storm_controls landed_faults report_storm
  generic_plan_database generic_plan_run
  old_release_node old_release_install_path reopen_with_current_library
  reopen_with_release store_old_release_keys
  check_old_release_keys check_old_release_keys_through_update
  check_refuses_schema_before_0_7 sqlstate_in pgbench_client pgbench_client_errors);

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
		my $killed = qr/\(PID $pid\) was terminated by signal 9/;
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

# A forked client of the storm files: runs pgbench on `db` of `node` with
# `script` (in `dir`), a batch of transactions at a time, while `more`
# gives a batch size (it is told how many the last batch processed) and
# the `deadline` (epoch seconds) has not passed. pgbench retries 40001 and
# the like itself; any other error ends a batch and is recorded in
# DIR/NAME.errors (pgbench_client_errors). `connstr`, when given, replaces
# the connection string of `db` (another user). Returns the child's pid.
sub pgbench_client
{
	my (%c) = @_;
	my $pgbench = $c{node}->installed_command('pgbench');
	my $pid = fork // die "fork: $!";
	return $pid if $pid;
	my @errors;
	while (Time::HiRes::time() < $c{deadline} && (my $batch = $c{more}->()))
	{
		my ($out, $err) = ('', '');
		IPC::Run::run(
			[ $pgbench, '-n', '-M', $c{mode}, '-c', '1', '-t', $batch, '--max-tries=100',
				'-f', "$c{dir}/$c{script}", $c{connstr} // $c{node}->connstr($c{db}) ],
			'>', \$out, '2>', \$err);
		$c{more}->($1) if $out =~ /number of transactions actually processed: (\d+)/;
		push @errors, $1 while $err =~ /aborted in command .*?: ERROR:\s+(.*)/g;
		push @errors, "$1 transactions failed after 100 tries"
		  if $out =~ /number of failed transactions: ([1-9]\d*)/;
	}
	open my $file, '>', "$c{dir}/$c{name}.errors" or POSIX::_exit(1);
	print $file map { "$_\n" } @errors;
	close $file;
	POSIX::_exit(0);
}

# The errors pgbench_client `name` recorded in `dir`, once it has ended.
sub pgbench_client_errors
{
	my ($dir, $name) = @_;
	open my $file, '<', "$dir/$name.errors" or return ("$name left no record");
	chomp(my @lines = <$file>);
	return @lines;
}

# A started Citus node with the extension preloaded, reachable over TCP on
# 127.0.0.1 (Citus connects to the other nodes by host and port), on `port`
# or a free one, of the installation `install_path` (undef: the PostgreSQL
# under test). Automatic 2PC recovery is off: tests that look at prepared
# transactions run recover_prepared_transactions() themselves.
sub citus_node
{
	my ($name, $port, $conf, $install_path) = @_;
	my $node = PostgreSQL::Test::Cluster->new($name, defined $port ? (port => $port) : (),
		defined $install_path ? (install_path => $install_path) : ());
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

# A Citus cluster on localhost: a coordinator and two workers (citus_node),
# the coordinator registered by its address and the first `added` workers
# (both by default) added to it; returns (coordinator, worker1, worker2).
# With CITUS_TEST_PORT set, a file's `slot` (0, 1, 2, ...) picks its three
# ports: CITUS_TEST_PORT + 3 * slot and the two after it; otherwise free
# ports are picked. postgresql.conf lines: `conf` on every node,
# `coordinator_conf` and `worker_conf` on those only; `shard_moves` gives
# the workers the logical replication that moving a shard with
# 'force_logical' (and the rebalancer) needs; `install_path` is the nodes'
# installation (citus_node).
sub citus_cluster
{
	my (%options) = @_;
	my $first_port = $ENV{CITUS_TEST_PORT};
	my $port = sub {
		return defined $first_port ? $first_port + 3 * ($options{slot} // 0) + $_[0] : undef;
	};
	my $conf = $options{conf} // '';
	my $worker_conf = $conf . ($options{worker_conf} // '');
	$worker_conf .= "wal_level = logical\nmax_wal_senders = 10\nmax_replication_slots = 10\n"
	  if $options{shard_moves};
	my $coordinator = citus_node('coordinator', $port->(0),
		$conf . ($options{coordinator_conf} // ''), $options{install_path});
	my @workers =
	  map { citus_node("worker$_", $port->($_), $worker_conf, $options{install_path}) } (1, 2);
	$coordinator->safe_psql('postgres',
		"SELECT citus_set_coordinator_host('127.0.0.1', " . $coordinator->port . ')');
	citus_add_workers($coordinator, @workers[ 0 .. ($options{added} // 2) - 1 ]);
	return ($coordinator, @workers);
}

# Adds `workers` to the cluster of `coordinator`, one after another.
sub citus_add_workers
{
	my ($coordinator, @workers) = @_;
	$coordinator->safe_psql('postgres', "SELECT citus_add_node('127.0.0.1', " . $_->port . ')')
	  for @workers;
	return;
}

# SQL for the tenant-key files' coordinator: the extension; accounts,
# tenants 1 to 40 with `balance` each, distributed by tenant in
# `shard_count` shards, SELECT and UPDATE on it granted to `callers` (roles
# that exist; none when not given); and withdraw(account, amount, pause),
# the operation, which counts its runs in the row it changes (withdrawals is
# how often it ran for that tenant) and sleeps `pause` seconds before it
# returns.
sub tenant_accounts_sql
{
	my (%options) = @_;
	return qq{
CREATE EXTENSION idempotency;
SET citus.shard_count = $options{shard_count};
CREATE TABLE accounts (tenant bigint PRIMARY KEY, balance bigint NOT NULL,
                       withdrawals int NOT NULL DEFAULT 0);
SELECT create_distributed_table('accounts', 'tenant');
INSERT INTO accounts SELECT g, $options{balance} FROM generate_series(1, 40) g;
} . ($options{callers} ? "GRANT SELECT, UPDATE ON accounts TO $options{callers};\n" : '') . q{
CREATE FUNCTION withdraw(account bigint, amount bigint, pause float8 DEFAULT 0) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
  left_over bigint;
BEGIN
  UPDATE accounts SET balance = balance - amount, withdrawals = withdrawals + 1
   WHERE tenant = account RETURNING balance INTO left_over;
  PERFORM pg_sleep(pause);
  RETURN jsonb_build_object('tenant', account, 'balance', left_over);
END $$;
};
}

# SQL for pay(tenant, key, amount, pause): the request, withdraw under a
# tenant key, in a function Citus runs on the worker that holds the tenant,
# in a transaction block too (force_delegation). Needs the keys distributed
# (idempotency.distribute_keys). With `ledger`, the request's fn is
# withdraw_for(tenant, key, amount, pause), which the test defines:
# withdraw that also records the key it ran for.
sub delegated_pay_sql
{
	my (%options) = @_;
	my $fn =
	  $options{ledger}
	  ? q{'SELECT withdraw_for($1, $2, $3, $4)', tenant, key, amount, pause}
	  : q{'SELECT withdraw($1, $2, $3)', tenant, amount, pause};
	return qq{
CREATE FUNCTION pay(tenant bigint, key text, amount bigint, pause float8 DEFAULT 0)
RETURNS jsonb LANGUAGE plpgsql AS \$\$
BEGIN
  RETURN idempotency.tenant_call(tenant, key, NULL,
    $fn);
END \$\$;
} . q{SELECT create_distributed_function('pay(bigint,text,bigint,float8)', 'tenant',
  colocate_with => 'idempotency.tenant_keys', force_delegation => true);
};
}

# ALTER ROLE `role` SET `setting` on each of `nodes` itself, not
# propagated by Citus: on workers too, where delegated calls run.
sub role_setting_on_nodes
{
	my ($nodes, $role, $setting) = @_;
	$_->safe_psql('postgres',
		"SET citus.enable_ddl_propagation = off; ALTER ROLE $role SET $setting")
	  for @$nodes;
	return;
}

# Callers that keep paying while a test moves shards: pgbench against the
# coordinator as role app, 4 clients (2 threads) for `seconds`, each call
# pay(1 + k % tenants, '<prefix>-k', 1[, pause]) for a key k picked at
# random out of `keys` (some are retries), half of the calls inside the
# client's own BEGIN ... COMMIT; a call that fails with 40001 is retried,
# up to `max_tries` times. With `answers`, each client also records every
# answer it got, in the same transaction as the call when in a block, as
# (tenant, key, answer) in table answers, which the test creates (answered_at
# defaults to the time of the record). Returns the IPC::Run harness and
# references to pgbench's output and errors.
sub start_paying_clients
{
	my ($coordinator, %options) = @_;
	my $pause = defined $options{pause} ? ", $options{pause}" : '';
	my $call = qq{\\set k random(1, $options{keys})
\\set t 1 + :k % $options{tenants}
};
	my $key = "'$options{prefix}-' || :k";
	# pgbench (simple query mode) puts the text of :pay where it appears,
	# dollar-quoted strings too: a jsonb answer never holds $answer$.
	my $pay =
	  $options{answers}
	  ? "SELECT pay(:t, $key, 1$pause) \\gset\n"
	  . "INSERT INTO answers (tenant, key, answer) VALUES (:t, $key, \$answer\$:pay\$answer\$);\n"
	  : "SELECT pay(:t, $key, 1$pause);\n";
	my $script = $coordinator->basedir . "/$options{prefix}.sql";
	PostgreSQL::Test::Utils::append_to_file($script, "\n$call$pay");
	my $block_script = $coordinator->basedir . "/$options{prefix}_block.sql";
	PostgreSQL::Test::Utils::append_to_file($block_script, "\n${call}BEGIN;\n${pay}COMMIT;\n");
	my ($out, $err) = ('', '');
	my $pgbench = IPC::Run::start(
		[
			'pgbench', '-n', '-h', $coordinator->host, '-p', $coordinator->port,
			'-U', 'app', '-c', '4', '-j', '2', '-T', $options{seconds},
			"--max-tries=$options{max_tries}", '-f', $script, '-f', $block_script,
			'postgres'
		],
		'>', \$out, '2>', \$err);
	return ($pgbench, \$out, \$err);
}

# Sends every stored tenant key '<prefix>-k' again as the request that
# stored it, pay(1 + k % tenants, key, 1[, pause]) as role app, one
# statement per key (Citus delegates a call made alone, not one inside a
# query with FROM). Returns the keys' stored responses and the answers,
# each a text of one line per key, in key order.
sub replay_stored_keys
{
	my ($coordinator, %options) = @_;
	my $pause = defined $options{pause} ? ", $options{pause}" : '';
	my @stored_keys = split /\n/, $coordinator->safe_psql('postgres', qq{
SELECT key FROM idempotency.tenant_keys WHERE key LIKE '$options{prefix}-%' ORDER BY key});
	my $stored_responses = $coordinator->safe_psql('postgres', qq{
SELECT response FROM idempotency.tenant_keys WHERE key LIKE '$options{prefix}-%' ORDER BY key});
	my $answers = $coordinator->safe_psql(
		'postgres',
		join('', map {
			my ($k) = /^\Q$options{prefix}\E-(\d+)$/;
			sprintf("SELECT pay(%d, '%s', 1%s);\n", 1 + $k % $options{tenants}, $_, $pause)
		} @stored_keys),
		extra_params => [ '-U', 'app' ]);
	return ($stored_responses, $answers);
}

# A storm on one node: forks `clients` processes, each running
# $run_client->(its number), and meanwhile injects faults into the node
# (inject_storm_faults, with the same options); once every client has
# exited, returns the faults' counts and the deaths of clients, a text
# each (a client that dies exits 1). Children leave through _exit: the END
# blocks of the test modules (which stop the cluster) belong to the parent.
sub run_storm
{
	my (%options) = @_;
	my %client_of_pid;
	for my $client (1 .. $options{clients})
	{
		my $pid = fork // die "fork: $!";
		if ($pid == 0)
		{
			my $finished = eval { $options{run_client}->($client); 1 };
			print STDERR "client $client: $@" unless $finished;
			POSIX::_exit($finished ? 0 : 1);
		}
		$client_of_pid{$pid} = $client;
	}
	my $injected = inject_storm_faults(%options);
	my @deaths;
	for my $pid (sort { $a <=> $b } keys %client_of_pid)
	{
		waitpid($pid, 0) == $pid or die "waitpid $pid: $!";
		push @deaths, "client $client_of_pid{$pid} exited with status $?" if $? != 0;
	}
	return ($injected, \@deaths);
}

# Faults from outside a storm's clients into `node` (run_storm's), from
# `started` (a time) until the storm ends: once it has lasted `seconds`, a
# kill -9 has crashed the server and $all_landed->() says every other kind
# of fault has reached the clients; past `deadline` seconds it ends anyway.
# Each round, every 0.1 to 0.3 s, runs $each_round->() (when given), then
# signals one backend that the condition `victims` (on pg_stat_activity)
# picks at random: a kill -9 once `kill9_every` seconds have passed since
# the faults began or since the last one, `max_kill9` at the most, counted
# when it crashed the server (crash_backend returns once the server is
# back); otherwise pg_cancel_backend (6 in 10) or pg_terminate_backend,
# counted when the function answered true. The backend is chosen and
# signalled in one statement: one chosen by one psql run is often gone by
# the next (each attempt has its own connection). Then creates the file
# `over_flag`, which tells the clients the storm is over. Returns the
# counts: { cancel, terminate, kill9 }.
sub inject_storm_faults
{
	my (%o) = @_;
	my ($node, $started) = @o{qw(node started)};
	my %count = (cancel => 0, terminate => 0, kill9 => 0);
	my $next_kill9 = Time::HiRes::time() + $o{kill9_every};
	my $over = sub {
		my $now = Time::HiRes::time();
		return $now > $started + $o{deadline}
		  || ($now > $started + $o{seconds} && $count{kill9} > 0 && $o{all_landed}->());
	};
	my $victims =
	  "SELECT pid FROM pg_stat_activity WHERE $o{victims} ORDER BY random() LIMIT 1";
	until ($over->())
	{
		Time::HiRes::sleep(0.1 + rand(0.2));
		$o{each_round}->() if $o{each_round};
		if ($count{kill9} < $o{max_kill9} && Time::HiRes::time() > $next_kill9)
		{
			my ($rc, $pid) = psql_or_undef($node, $victims);
			next if !defined $rc || $rc != 0 || $pid eq '';
			$count{kill9}++ if crash_backend($node, $pid);
			$next_kill9 = Time::HiRes::time() + $o{kill9_every};
			next;
		}
		my $fault = rand() < 0.6 ? 'cancel' : 'terminate';
		my ($rc, $signalled) = psql_or_undef($node,
			"SELECT pg_${fault}_backend(pid) FROM ($victims) AS victim");
		$count{$fault}++ if defined $rc && $rc == 0 && $signalled eq 't';
	}
	open my $flag, '>', $o{over_flag} or die "$o{over_flag}: $!";
	close $flag;
	return \%count;
}

# The storm checker, shared by every storm test. A storm describes what it
# saw in one structure:
#   attempts => { key => [ attempt, ... ] }, each attempt a hash of
#     outcome   ok, IK422, timeout, broken, stuck, unexpected or a SQLSTATE
#     request   the request the attempt sent (text; equal text, equal request)
#     response  the answer's text, for outcome ok
#     ran       true when the answer came from running the request (not a
#               replay), for outcome ok
#     changed   true when the request was sent, changed, after the key was
#               answered: it must be refused (IK422), never answered
#     detail    the error, for the report
#   effects  => { key => [ { id, request, deltas => { account => n } } ] }:
#     what the database shows applied, one entry per execution (a table
#     without a unique constraint, so that a second execution shows up)
#   stored   => { key => response text the extension stores }
#   balances => { account => what the database holds now }
#   expected_base => { account => its value before any effect, plus every
#     change from outside the storm (top-ups) }
#   answer_effect => sub (response) -> the effect id the answer names, or
#     undef for an answer that applied nothing (a stored decline)
#   every_key_answered => true when each key was retried until answered
# check_storm returns every violation of exactly-once, each a text that
# starts with the key it is about ("money: " for balances).
sub check_storm
{
	my ($storm) = @_;
	my @violations;
	my $violation = sub { push @violations, join(' ', @_) };
	my ($attempts, $effects, $stored) = @$storm{qw(attempts effects stored)};
	for my $key (sort keys %$attempts)
	{
		my @all = @{ $attempts->{$key} };
		my $applied = $effects->{$key} // [];
		$violation->("$key: $_->{outcome} " . ($_->{detail} // ''))
		  for grep { $_->{outcome} =~ /^(stuck|unexpected)$/ } @all;
		# A changed request after the answer: refused, never answered.
		my @changed = grep { $_->{changed} } @all;
		$violation->("$key: the changed request $_->{request} sent after the "
			  . "answer was answered $_->{response}")
		  for grep { $_->{outcome} eq 'ok' } @changed;
		$violation->("$key: a changed request after the answer was never refused")
		  if @changed && !grep { $_->{outcome} eq 'IK422' } @changed;
		# A refused request was not applied.
		for my $refused (grep { $_->{outcome} eq 'IK422' } @all)
		{
			$violation->("$key: request $refused->{request} was refused with "
				  . 'IK422 but applied')
			  if grep { $_->{request} eq $refused->{request} } @$applied;
		}
		my @answers = grep { $_->{outcome} eq 'ok' } @all;
		if (!@answers)
		{
			# Unacknowledged: applied at most once.
			$violation->("$key: never answered") if $storm->{every_key_answered};
			$violation->("$key: unacknowledged, but applied " . scalar(@$applied)
				  . ' times')
			  if @$applied > 1;
			next;
		}
		# Acknowledged: every answer the same text, at most one of them from
		# running the request, all for the one request that was applied.
		my $first = $answers[0];
		for my $answer (@answers[ 1 .. $#answers ])
		{
			$violation->("$key: answer $answer->{response} differs from "
				  . "the first, $first->{response}")
			  if $answer->{response} ne $first->{response};
		}
		my $runs = grep { $_->{ran} } @answers;
		$violation->("$key: $runs answers ran the request") if $runs > 1;
		$violation->("$key: stored response differs from the answer")
		  if ($stored->{$key} // '') ne $first->{response};
		my $id = $storm->{answer_effect}->($first->{response});
		if (!defined $id)
		{
			$violation->("$key: answered without effect, but applied "
				  . scalar(@$applied) . ' times')
			  if @$applied;
			next;
		}
		if (@$applied != 1)
		{
			$violation->("$key: acknowledged, but applied "
				  . scalar(@$applied) . ' times');
			next;
		}
		$violation->("$key: the answer names effect $id, the database holds "
			  . "$applied->[0]{id}")
		  if $id ne $applied->[0]{id};
		for my $answer (@answers)
		{
			$violation->("$key: answered for request $answer->{request}, "
				  . "applied $applied->[0]{request}")
			  if $answer->{request} ne $applied->[0]{request};
		}
	}
	for my $key (sort keys %$effects)
	{
		$violation->("$key: applied but never sent") unless $attempts->{$key};
		$violation->("$key: applied but no key stored")
		  unless defined $stored->{$key}
		  || !grep { defined $_->{id} } @{ $effects->{$key} };
	}
	# Money: every balance is its base plus the effects' deltas.
	my %expected = %{ $storm->{expected_base} // {} };
	for my $applied (values %$effects)
	{
		for my $effect (@$applied)
		{
			$expected{$_} += $effect->{deltas}{$_} for keys %{ $effect->{deltas} // {} };
		}
	}
	for my $account (sort keys %{ $storm->{balances} // {} })
	{
		$violation->("money: $account holds $storm->{balances}{$account}, "
			  . "the effects explain " . ($expected{$account} // 'nothing'))
		  if $storm->{balances}{$account} != ($expected{$account} // 0);
	}
	return @violations;
}

# The negative controls: for each branch of check_storm, a copy of the
# storm's observations with one fault planted, which check_storm must flag,
# on the planted key, with a violation it did not report before. Runs as
# tests (one per control) and needs a storm with at least two keys
# acknowledged with an effect, one of them with a refused changed request.
sub check_storm_controls
{
	my ($storm) = @_;
	my %before = map { $_ => 1 } check_storm($storm);
	my $clone = sub {
		my %copy = %$storm;
		$copy{attempts} = { map { $_ => [ map { {%$_} } @{ $storm->{attempts}{$_} } ] } keys %{ $storm->{attempts} } };
		$copy{effects} = { map { $_ => [ map { {%$_} } @{ $storm->{effects}{$_} } ] } keys %{ $storm->{effects} } };
		$copy{stored} = { %{ $storm->{stored} } };
		$copy{balances} = { %{ $storm->{balances} // {} } };
		return \%copy;
	};
	my @with_effect = grep {
		my $key = $_;
		my ($answer) = grep { $_->{outcome} eq 'ok' } @{ $storm->{attempts}{$key} };
		$answer && defined $storm->{answer_effect}->($answer->{response})
		  && @{ $storm->{effects}{$key} // [] } == 1
	} sort keys %{ $storm->{attempts} };
	my ($refused_key) = grep {
		grep { $_->{outcome} eq 'IK422' && $_->{changed} } @{ $storm->{attempts}{$_} }
	} @with_effect;
	# A key with an answer that ran its request: a second such answer is a
	# second run. (A key whose only answer is a replay - the run's answer
	# was lost to a fault - would take a planted running answer as its one
	# run.)
	my ($ran_key) = grep {
		my $key = $_;
		grep { $_->{outcome} eq 'ok' && $_->{ran} } @{ $storm->{attempts}{$key} }
	} @with_effect;
	my ($unacknowledged_key) = grep {
		!grep { $_->{outcome} eq 'ok' } @{ $storm->{attempts}{$_} }
	} sort keys %{ $storm->{attempts} };
	unless (cmp_ok(scalar @with_effect, '>=', 2,
			'the controls have acknowledged keys to plant into')
		&& ok(defined $refused_key, 'the controls have a refused changed request')
		&& ok(defined $ran_key, 'the controls have an answer that ran its request'))
	{
		return;
	}
	my ($one, $two) = @with_effect;
	my $first_answer = sub {
		my ($copy, $key) = @_;
		my ($answer) = grep { $_->{outcome} eq 'ok' } @{ $copy->{attempts}{$key} };
		return $answer;
	};
	my @controls = (
		[
			'a second execution of an acknowledged key', $one,
			sub {
				# Its deltas in the balances too: as a real second run.
				my ($c) = @_;
				my $effect = { %{ $c->{effects}{$one}[0] }, id => 'planted' };
				push @{ $c->{effects}{$one} }, $effect;
				$c->{balances}{$_} += $effect->{deltas}{$_} for keys %{ $effect->{deltas} // {} };
			}
		],
		[
			'a lost effect of an acknowledged key', $one,
			sub {
				my ($c) = @_;
				my $effect = pop @{ $c->{effects}{$one} };
				$c->{balances}{$_} -= $effect->{deltas}{$_} for keys %{ $effect->{deltas} // {} };
			}
		],
		[
			'an effect that is not the acknowledged one', $one,
			sub { my ($c) = @_; $c->{effects}{$one}[0]{id} = 'planted' }
		],
		[
			'a changed stored response', $one,
			sub { my ($c) = @_; $c->{stored}{$one} .= ' '; }
		],
		[
			'a replay that differs from the first answer', $one,
			sub {
				my ($c) = @_;
				my $answer = $first_answer->($c, $one);
				push @{ $c->{attempts}{$one} }, { %$answer, ran => 0, response => "$answer->{response} " };
			}
		],
		[
			'a second answer that ran the request', $ran_key,
			sub {
				my ($c) = @_;
				push @{ $c->{attempts}{$ran_key} }, { %{ $first_answer->($c, $ran_key) }, ran => 1 };
			}
		],
		[
			'an answer for another request than the applied one', $two,
			sub {
				my ($c) = @_;
				push @{ $c->{attempts}{$two} }, { %{ $first_answer->($c, $two) }, request => 'planted', ran => 0 };
			}
		],
		[
			'a replay answered to a changed request after the answer', $refused_key,
			sub {
				my ($c) = @_;
				my ($changed) = grep { $_->{changed} && $_->{outcome} eq 'IK422' } @{ $c->{attempts}{$refused_key} };
				my $answer = $first_answer->($c, $refused_key);
				@$changed{qw(outcome response ran)} = ('ok', $answer->{response}, 0);
			}
		],
		[
			'a refused request that was applied', $refused_key,
			sub {
				my ($c) = @_;
				my ($changed) = grep { $_->{changed} && $_->{outcome} eq 'IK422' } @{ $c->{attempts}{$refused_key} };
				$c->{effects}{$refused_key}[0]{request} = $changed->{request};
			}
		],
		[
			'an unacknowledged key applied twice', $unacknowledged_key // 'planted-unanswered',
			sub {
				my ($c) = @_;
				my $key = $unacknowledged_key // 'planted-unanswered';
				$c->{attempts}{$key} //= [ { outcome => 'timeout', request => 'x' } ];
				$c->{stored}{$key} //= '{}';
				push @{ $c->{effects}{$key} }, { id => 'planted1', request => 'x' }, { id => 'planted2', request => 'x' };
			}
		],
		[
			'an effect nobody asked for', 'planted-unsent',
			sub { my ($c) = @_; $c->{effects}{'planted-unsent'} = [ { id => 'planted', request => 'x' } ]; $c->{stored}{'planted-unsent'} = '{}' }
		],
		[
			'money drift', 'money',
			sub {
				my ($c) = @_;
				my ($account) = sort keys %{ $c->{balances} };
				$c->{balances}{$account} += 1;
			}
		]);
	for my $control (@controls)
	{
		my ($name, $key, $plant) = @$control;
		if ($key eq 'money' && !%{ $storm->{balances} // {} })
		{
			fail("control: $name (the storm reports no balances)");
			next;
		}
		my $copy = $clone->();
		$plant->($copy);
		my @flagged = grep { !$before{$_} } check_storm($copy);
		ok(@flagged && !grep({ !/^\Q$key\E: / } @flagged),
			"the checker flags $name, on that key only")
		  or diag("control $name on $key flagged: @flagged");
	}
	return;
}

# How often each kind of fault reached the clients, from their attempts:
# only faults that landed count.
sub landed_faults
{
	my ($attempts) = @_;
	my %seen = map { $_ => 0 } (
		'cancels', 'terminations', 'statement timeouts', 'crash restarts',
		'broken connections', 'client timeouts', 'IK409s', 'IK422s');
	for my $attempt (map { @$_ } values %$attempts)
	{
		my ($outcome, $detail) = ($attempt->{outcome}, $attempt->{detail} // '');
		$seen{cancels}++ if $outcome eq '57014' && $detail =~ /due to user request/;
		$seen{'statement timeouts'}++
		  if $outcome eq '57014' && $detail =~ /due to statement timeout/;
		$seen{terminations}++
		  if $outcome eq '57P01' && $detail =~ /administrator command/;
		$seen{'crash restarts'}++ if $outcome =~ /^57P0[23]$/;
		$seen{'broken connections'}++ if $outcome eq 'broken';
		$seen{'client timeouts'}++ if $outcome eq 'timeout';
		$seen{IK409s}++ if $outcome eq 'IK409';
		$seen{IK422s}++ if $outcome eq 'IK422';
	}
	return \%seen;
}

# Prints every outcome's count and the first violations.
sub report_storm
{
	my ($storm, $violations, $figures) = @_;
	my %count;
	$count{"outcome $_->{outcome}"}++ for map { @$_ } values %{ $storm->{attempts} };
	my %all = (%count, %{ $figures // {} });
	$all{keys} = keys %{ $storm->{attempts} };
	$all{violations} = @$violations;
	diag(sprintf('%-40s %s', $_, $all{$_})) for sort keys %all;
	diag("violation: $_") for @$violations[ 0 .. ($#$violations < 30 ? $#$violations : 29) ];
	return;
}


# A database `name` on `node` whose sessions plan every prepared statement
# generically (plan_cache_mode = force_generic_plan) and wait for a
# concurrent duplicate (so that pgbench's clients, which stop at their first
# error, meet none), with gp.apply(key, k, amount, note) as fn: it records
# each run in gp.runs.
sub generic_plan_database
{
	my ($node, $name) = @_;
	$node->safe_psql('postgres', qq{
CREATE DATABASE $name;
ALTER DATABASE $name SET plan_cache_mode = force_generic_plan;
ALTER DATABASE $name SET idempotency.wait_timeout = '30s';
});
	$node->safe_psql($name, q{
CREATE EXTENSION idempotency;
CREATE SCHEMA gp;
CREATE TABLE gp.runs (key text NOT NULL, k int NOT NULL, amount bigint NOT NULL, note text NOT NULL);
CREATE TABLE gp.plans (generic bigint NOT NULL, custom bigint NOT NULL);
CREATE FUNCTION gp.apply(key text, k int, amount bigint, note text) RETURNS jsonb LANGUAGE sql AS $$
  INSERT INTO gp.runs VALUES (key, k, amount, note)
  RETURNING jsonb_build_object('k', k, 'amount', amount, 'note', note)
$$;
});
	return;
}

# pgbench, in protocol `mode` (prepared: one named prepared statement per
# connection; extended: unnamed statements), against `connstr`: 4 clients
# call idempotent_call with one statement for random keys out of 200, each
# key's arguments (an int, a bigint, a multi-byte text) a function of the
# key, so that a key's repeats replay. Then, as tests: pgbench succeeded,
# every key that ran ran once with its own arguments, its stored response
# is what fn returned, and (prepared) the statement was planned
# generically only.
sub generic_plan_run
{
	my ($node, $database, $connstr, $mode, $label) = @_;
	my $script = PostgreSQL::Test::Utils::tempdir() . "/$label.sql";
	open my $file, '>', $script or die "$script: $!";
	print $file "\\set k random(1, 200)\n"
	  . "\\set amount (:k * 7919) % 100000 + 1\n"
	  . "SELECT idempotency.idempotent_call('$label-' || :k::int, NULL, "
	  . "'SELECT gp.apply(\$1, \$2, \$3, \$4)', '$label-' || :k::int, :k, :amount, "
	  . "'заметка-é-' || :k::int);\n"
	  . "INSERT INTO gp.plans SELECT generic_plans, custom_plans FROM pg_prepared_statements "
	  . "WHERE statement LIKE '%gp.apply%' AND statement NOT LIKE '%pg_prepared%';\n";
	close $file;
	my ($out, $err) = ('', '');
	my $ran = IPC::Run::run(
		[
			$node->installed_command('pgbench'), '-n', '-M', $mode, '-c', '4',
			'-t', '150', '-f', $script, $connstr
		],
		'>', \$out, '2>', \$err);
	ok($ran, "$label: pgbench -M $mode ran every transaction without error")
	  or diag("pgbench: $out $err");
	like($out, qr/number of transactions actually processed: 600\/600/,
		"$label: all 600 calls answered");
	my $query = sub { $node->safe_psql($database, $_[0]) };
	my $keys = $query->("SELECT count(DISTINCT key) FROM gp.runs WHERE key LIKE '$label-%'");
	cmp_ok($keys, '>=', 100, "$label: many keys ran");
	is($query->("SELECT count(*) - count(DISTINCT key) FROM gp.runs WHERE key LIKE '$label-%'"),
		'0', "$label: each key ran once");
	is( $query->(
			qq{SELECT count(*) FROM gp.runs WHERE key LIKE '$label-%' AND
		(key <> '$label-' || k OR amount <> (k * 7919) % 100000 + 1 OR note <> 'заметка-é-' || k)}
		),
		'0',
		"$label: each key ran with its own arguments");
	is( $query->(
			qq{SELECT count(*) FROM gp.runs AS r LEFT JOIN idempotency.keys AS s USING (key)
		WHERE r.key LIKE '$label-%' AND s.response IS DISTINCT FROM
		      jsonb_build_object('k', r.k, 'amount', r.amount, 'note', r.note)}
		),
		'0',
		"$label: each key stores the response of its run");
	is( $query->(
			qq{SELECT count(*) FROM idempotency.keys WHERE key LIKE '$label-%'
		AND key NOT IN (SELECT key FROM gp.runs)}
		),
		'0',
		"$label: no key stored without its run");
	if ($mode eq 'prepared')
	{
		is($query->('SELECT max(generic) > 100 AND max(custom) = 0 FROM gp.plans'),
			't', "$label: the prepared statement ran with a generic plan only");
	}
	return;
}

# --- keys written by an earlier release's library ---------------------------

# The installation (install_path) of the PostgreSQL under test with the
# library of release `version` in place of the current one, built from the
# repository's history by test/old-release.sh (cached across runs; a clone
# without that history fails here).
sub old_release_install_path
{
	my ($version) = @_;
	my ($stdout, $stderr) = ('', '');
	if (!IPC::Run::run([ "$FindBin::RealBin/../old-release.sh", $version ],
		'>', \$stdout, '2>', \$stderr))
	{
		# On the console too: a die's message goes to the file's log only,
		# and prove would show no more than "No plan found".
		my $why = "cannot build release $version of the library:\n$stderr";
		diag($why);
		die $why;
	}
	chomp $stdout;
	return $stdout;
}

# A started node whose server loads the library of release `version`
# (old_release_install_path), with the roles the old keys belong to.
sub old_release_node
{
	my ($name, $version, %options) = @_;
	my $node = PostgreSQL::Test::Cluster->new($name,
		install_path => old_release_install_path($version));
	$node->init;
	$node->append_conf('postgresql.conf',
		"shared_preload_libraries = 'idempotency'\n" . ($options{conf} // ''));
	$node->start;
	$node->safe_psql('postgres', q{
CREATE ROLE regress_app;
CREATE ROLE regress_other;
});
	return $node;
}

# A node of the installation `install_path` (undef: the PostgreSQL under
# test) on the stopped `old` node's data directory, started.
sub reopen_data_directory
{
	my ($old, $name, $install_path) = @_;
	$old->stop if defined $old->{_pid};
	my $node = PostgreSQL::Test::Cluster->new($name,
		defined $install_path ? (install_path => $install_path) : ());
	rename($old->data_dir, $node->data_dir)
	  or die "cannot move " . $old->data_dir . ": $!";
	$node->append_conf('postgresql.conf', 'port = ' . $node->port . "\n");
	$node->start;
	return $node;
}

# A node of the PostgreSQL under test (the current library) on the stopped
# `old` node's data directory, started.
sub reopen_with_current_library
{
	my ($old, $name) = @_;
	return reopen_data_directory($old, $name);
}

# The same with the library of release `version` (old_release_install_path):
# the way a DBA takes a database through an intermediate release.
sub reopen_with_release
{
	my ($old, $name, $version) = @_;
	return reopen_data_directory($old, $name, old_release_install_path($version));
}

# The keys the old library writes, beyond ASCII in their key, fn, text
# argument and client hash, all of them in LATIN1 and WIN1252 too:
# [name, role, key, request_hash SQL, argument, other request's argument]
# for idempotent_call, whose fn records its run in table runs; a claim's
# client hash and response at the end.
my $old_fn = q{INSERT INTO runs VALUES ($1, $2) RETURNING $2 || ' «½»'};
my @old_calls = (
	[ 'computed', 'regress_app', 'café-1', 'NULL', 'grüße', 'grüsse' ],
	[ 'client', 'regress_app', 'Zürich ÿ', q{'hash-ñ'}, 'naïve', 'naïve' ],
	[ 'client hex', 'regress_other', 'café-1', "'" . ('ab' x 32) . "'", 'é', 'é' ],);
my @old_claim = ('regress_other', 'naïve «claim»', 'body-é', '{"ok": "süß"}');

sub old_call_sql
{
	my ($role, $key, $hash, $arg, $n) = @_;
	return "SET client_encoding = 'UTF8'; SET ROLE $role;
SELECT idempotency.idempotent_call('$key', $hash, \$fn\$$old_fn\$fn\$, $n, '$arg'::text),
       idempotency.last_call_replayed()";
}

sub old_claim_sql
{
	my ($hash) = @_;
	my ($role, $key) = @old_claim;
	return "SET client_encoding = 'UTF8'; SET ROLE $role;
SELECT replayed, response FROM idempotency.claim('$key', '$hash')";
}

# The output of `sql` in database `db` of `node`, or its error: a replay
# that fails is a failed test, not the end of the file.
sub output_or_error
{
	my ($node, $db, $sql) = @_;
	my ($rc, $stdout, $stderr) = $node->psql($db, $sql, on_error_stop => 1);
	return $rc == 0 ? $stdout : "error: $stderr";
}

# SQLSTATE of `sql` in database `db` of `node`, or 'no error'.
sub sqlstate_in
{
	my ($node, $db, $sql) = @_;
	my ($rc, $stdout, $stderr) = $node->psql(
		$db, $sql,
		on_error_stop => 0,
		extra_params => [ '-v', 'VERBOSITY=verbose' ]);
	return $stderr =~ /ERROR:\s+([0-9A-Z]{5}):/ ? $1 : 'no error';
}

# Creates database `db` in `encoding` on `node`, the extension (at the
# library's default version, or `version`) and table runs in it, and
# stores the keys of @old_calls and @old_claim.
sub store_old_release_keys
{
	my ($node, $db, $encoding, $version) = @_;
	$node->safe_psql('postgres',
		"CREATE DATABASE $db ENCODING '$encoding' TEMPLATE template0 LOCALE 'C'");
	my $with = defined $version ? "VERSION '$version'" : '';
	$node->safe_psql($db, qq{
CREATE EXTENSION idempotency $with;
CREATE TABLE runs (n int, arg text);
GRANT SELECT, INSERT ON runs TO PUBLIC;
});
	for my $i (0 .. $#old_calls)
	{
		my ($name, $role, $key, $hash, $arg) = @{ $old_calls[$i] };
		$node->safe_psql($db, old_call_sql($role, $key, $hash, $arg, $i + 1));
	}
	my ($role, $key, $hash, $response) = @old_claim;
	$node->safe_psql($db, "BEGIN; " . old_claim_sql($hash)
		  . "; SELECT idempotency.complete('$key', '$response'); COMMIT;");
	return;
}

# What every key of store_old_release_keys must read as in `db` of `node`
# (at a version with claim), and after it: the rows, their role and their
# key's UTF-8 bytes, byte for byte; each request replays its stored
# response and fn runs for none again; another request answers IK422.
sub check_old_release_keys
{
	my ($node, $db, $what) = @_;
	my $expected = join("\n",
		sort map { "$_->[0]|" . unpack('H*', $_->[1]) }
		  ((map { [ $_->[1], $_->[2] ] } @old_calls), [ $old_claim[0], $old_claim[1] ]));
	is( $node->safe_psql(
			$db, q{SELECT scope::text || '|' || encode(convert_to(key, 'UTF8'), 'hex')
			  FROM idempotency.keys ORDER BY 1}),
		$expected,
		"$what: every key kept, byte for byte, with its role");
	for my $i (0 .. $#old_calls)
	{
		my ($name, $role, $key, $hash, $arg, $other) = @{ $old_calls[$i] };
		my $n = $i + 1;
		is(output_or_error($node, $db, old_call_sql($role, $key, $hash, $arg, $n)),
			qq{"$arg «½»"|t}, "$what: the $name key '$key' of $role replays");
		my $other_hash = $hash eq 'NULL' ? 'NULL' : q{'another'};
		is( sqlstate_in($node, $db, old_call_sql($role, $key, $other_hash, $other, $n)),
			'IK422', "$what: the $name key '$key' with another request is IK422");
	}
	my ($role, $key, $hash, $response) = @old_claim;
	is( output_or_error($node, $db, old_claim_sql($hash)),
		qq{t|$response}, "$what: the claimed key '$key' replays its response");
	is(sqlstate_in($node, $db, old_claim_sql('body-e')),
		'IK422', "$what: the claimed key with another client hash is IK422");
	is($node->safe_psql($db, 'SELECT count(*) FROM runs'),
		scalar(@old_calls), "$what: fn ran again for no key");
	return;
}

# check_old_release_keys in each of `dbs` (pairs of database and its
# description) of `node`, then ALTER EXTENSION UPDATE and the same again;
# `what` says where the keys are.
sub check_old_release_keys_through_update
{
	my ($node, $version, $what, @dbs) = @_;
	for my $db (@dbs)
	{
		check_old_release_keys($node, $db->[0],
			"$version keys in $db->[1], $what, before the update");
		$node->safe_psql($db->[0], 'ALTER EXTENSION idempotency UPDATE');
		check_old_release_keys($node, $db->[0],
			"$version keys in $db->[1], $what, updated");
	}
	return;
}

# A database whose extension is older than 0.7 (keys stored by
# store_old_release_keys), served by the current library: every function
# that opens the key table, and the C symbols only those schemas name
# (key_digest() before 0.7), refuse with 55000 and the hint that says how
# to update; nothing runs, nothing changes.
sub check_refuses_schema_before_0_7
{
	my ($node, $db, $what) = @_;
	my ($name, $role, $key, $hash, $arg) = @{ $old_calls[0] };
	my $keys_before = $node->safe_psql($db, 'SELECT count(*) FROM idempotency.keys');
	my $runs_before = $node->safe_psql($db, 'SELECT count(*) FROM runs');
	for my $call (
		[ 'idempotent_call', old_call_sql($role, $key, $hash, $arg, 1) ],
		[ 'idempotent_call of a new key', old_call_sql($role, 'new-key', 'NULL', 'x', 9) ],
		[ 'claim', old_claim_sql($old_claim[2]) ],
		[ 'claim of a new key', "SET ROLE $role; SELECT * FROM idempotency.claim('new-claim', 'h')" ],
		[ 'lookup', "SET ROLE $role; SELECT * FROM idempotency.lookup('$key')" ],
		[ 'forget', "SET ROLE $role; SELECT idempotency.forget('$key')" ],
		[ 'key_digest', q{SELECT idempotency.key_digest('x')} ])
	{
		my ($function, $sql) = @$call;
		my ($rc, $stdout, $stderr) = $node->psql(
			$db, "SET client_encoding = 'UTF8'; $sql",
			on_error_stop => 0,
			extra_params => [ '-v', 'VERBOSITY=verbose' ]);
		my $sqlstate = $stderr =~ /ERROR:\s+([0-9A-Z]{5}):/ ? $1 : 'no error';
		is($sqlstate, '55000', "$what: $function refuses with 55000");
		like(
			$stderr,
			qr/ERROR:  55000: the idempotency extension in this database is older than 0\.7, which this library no longer serves.*
HINT:  Update the extension to 0\.7 with the library of 0\.7 \(ALTER EXTENSION idempotency UPDATE TO '0\.7'\), then install this library and run ALTER EXTENSION idempotency UPDATE\./s,
			"$what: $function says so, with the hint to update through 0.7");
	}
	is($node->safe_psql($db, 'SELECT count(*) FROM idempotency.keys'),
		$keys_before, "$what: every key is still there");
	is($node->safe_psql($db, 'SELECT count(*) FROM runs'),
		$runs_before, "$what: fn ran for no call");
	return;
}

1;
