# A bank under retries: clients move money through idempotent_call, each
# retrying its key until it gets a definite answer, while the test injects
# faults (client-side timeouts, pg_cancel_backend, pg_terminate_backend,
# statement_timeout inside fn, kill -9 of backends with restart_after_crash).
# At the end the ledger must show every acknowledged key exactly once, the
# balances must match the ledger, and every answer for a key must be the
# first one, byte for byte. Then the checker proves itself: run again on a
# database with a planted second execution and a changed stored response,
# it must flag exactly those.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;
use POSIX ();
use Time::HiRes qw(time sleep);
use FindBin;
use lib $FindBin::RealBin;
use IdempotencyTest;

my $clients = 16;
# The storm lasts at least this long (IDEMPOTENCY_STORM_SECONDS makes a
# longer one for a local soak run), and then until every kind of fault has
# been seen by a client; past $storm_deadline seconds it ends anyway, and
# the test fails on the fault that never landed.
my $storm_seconds = $ENV{IDEMPOTENCY_STORM_SECONDS} // 15;
my $storm_deadline = $storm_seconds + 300;
# Every client finishes at least this many keys, however slow the machine.
my $min_keys_per_client = 8;
# After the storm, clients finish their open keys; a key still unanswered
# after this long is stuck.
my $drain_seconds = 60;
my $accounts = 40;
my $initial_balance = 1_000_000;
my $max_kill9 = 3;

my $node = PostgreSQL::Test::Cluster->new('storm');
$node->init;
$node->append_conf(
	'postgresql.conf', qq{
shared_preload_libraries = 'idempotency'
restart_after_crash = on
max_connections = 80
log_min_messages = warning
log_min_error_statement = panic
});
$node->start;

$node->safe_psql(
	'postgres', qq{
CREATE EXTENSION idempotency;
CREATE ROLE teller LOGIN;
CREATE SCHEMA bank;
GRANT USAGE ON SCHEMA bank TO teller;
CREATE TABLE bank.accounts (id int PRIMARY KEY, balance bigint NOT NULL);
-- No unique constraint on op_key: a second execution of a key must show up
-- here as a second row, not be stopped by the ledger itself.
CREATE TABLE bank.ledger (
    seq      bigserial PRIMARY KEY,
    op_key   text NOT NULL,
    from_id  int NOT NULL,
    to_id    int NOT NULL,
    amount   bigint NOT NULL);
INSERT INTO bank.accounts SELECT i, $initial_balance FROM generate_series(1, $accounts) AS i;
GRANT SELECT, UPDATE ON bank.accounts TO teller;
GRANT SELECT, INSERT ON bank.ledger TO teller;
GRANT USAGE ON SEQUENCE bank.ledger_seq_seq TO teller;

-- Sleeps for the session's bank.delay seconds, half before and half after
-- its writes, so faults land both before fn writes and between its writes
-- and the commit. clock_timestamp() makes every execution's response unique.
CREATE FUNCTION bank.transfer(op_key text, from_id int, to_id int, amount bigint)
RETURNS jsonb LANGUAGE plpgsql AS \$\$
DECLARE
  delay float8 := coalesce(nullif(current_setting('bank.delay', true), ''), '0')::float8;
  entry bigint;
  from_balance bigint;
  to_balance bigint;
BEGIN
  PERFORM pg_sleep(delay / 2);
  PERFORM 1 FROM bank.accounts WHERE id IN (from_id, to_id) ORDER BY id FOR UPDATE;
  UPDATE bank.accounts SET balance = balance - amount WHERE id = from_id
    RETURNING balance INTO from_balance;
  UPDATE bank.accounts SET balance = balance + amount WHERE id = to_id
    RETURNING balance INTO to_balance;
  INSERT INTO bank.ledger (op_key, from_id, to_id, amount)
    VALUES (op_key, from_id, to_id, amount) RETURNING seq INTO entry;
  PERFORM pg_sleep(delay / 2);
  RETURN jsonb_build_object('seq', entry, 'from_balance', from_balance,
                            'to_balance', to_balance, 'at', clock_timestamp());
END \$\$;
});

my $psql = $node->installed_command('psql');
my $host = $node->host;
my $port = $node->port;

# Answers after which a client retries the same key: IK409 (someone else
# holds it), and the errors that leave it knowing nothing about its request
# (cancelled statement, terminated or crashed backend, server restarting or
# full, deadlock, serialization failure). A broken connection and a
# client-side timeout are retried too.
my %retryable_sqlstate = map { $_ => 1 } qw(
  IK409 57014 57P01 57P02 57P03 53300 40P01 40001);

# Starts one attempt in a fresh connection, in the background.
sub start_attempt
{
	my ($statements, $client_timeout) = @_;
	my @command = (
		'timeout', '-s', 'KILL', $client_timeout, $psql, '-X', '-q', '-A',
		'-t', '-h', $host, '-p', $port, '-U', 'teller', '-d', 'postgres',
		'-v', 'ON_ERROR_STOP=1', '-v', 'VERBOSITY=verbose',
		map { ('-c', $_) } @$statements);
	my $attempt = { out => '', err => '' };
	$attempt->{handle} = IPC::Run::start(\@command, '<', \undef, '>',
		\$attempt->{out}, '2>', \$attempt->{err});
	return $attempt;
}

# Waits for an attempt; returns (outcome, response, replayed, detail).
# outcome is ok, IK422, timeout, a retryable SQLSTATE, broken (no SQLSTATE:
# the connection failed) or unexpected.
sub finish_attempt
{
	my ($attempt) = @_;
	$attempt->{handle}->finish;
	my ($out, $err) = ($attempt->{out}, $attempt->{err});
	# timeout(1) ends itself with the signal it sent, after killing psql.
	my $status = $attempt->{handle}->full_result(0);
	my ($exit, $signal) = ($status >> 8, $status & 127);
	return ('timeout') if $signal == 9 || $exit == 124 || $exit == 137;
	if ($exit == 0)
	{
		my ($response, $replayed) = $out =~ /^(\{.*\})\|([tf])$/m
		  or return ('unexpected', undef, undef, "unparsable output: $out");
		return ('ok', $response, $replayed eq 't');
	}
	if ($err =~ /(?:ERROR|FATAL):\s+([0-9A-Z]{5}):\s*(.*)/)
	{
		my ($sqlstate, $message) = ($1, $2);
		# The error's context names fn's function when it was raised
		# while fn ran.
		$message .= ' [in fn]' if $err =~ /PL\/pgSQL function bank\.transfer\(/;
		return ('IK422') if $sqlstate eq 'IK422';
		return ($sqlstate, undef, undef, $message)
		  if $retryable_sqlstate{$sqlstate};
		return ('unexpected', undef, undef, "$sqlstate: $message");
	}
	return ('broken', undef, undef, $err)
	  if $err =~ /server closed the connection|connection to server|could not send|terminating connection|no connection to the server|SSL SYSCALL/;
	return ('unexpected', undef, undef, "exit $exit: $err");
}

sub attempt
{
	return finish_attempt(start_attempt(@_));
}

# The request of a key shared by a pair of clients is a function of the key,
# so both send the same request.
sub shared_request
{
	my ($pair, $n) = @_;
	my $from = ($pair * 7 + $n * 13) % $accounts + 1;
	my $to = ($from + $n % ($accounts - 1)) % $accounts + 1;
	return ($from, $to, ($pair * 31 + $n * 17) % 97 + 1);
}

# The select list of one call: its response as text, and whether it was a
# replay.
sub call_sql
{
	my ($key, $from, $to, $amount) = @_;
	return "idempotency.idempotent_call('$key', NULL, "
	  . "'SELECT bank.transfer(\$1, \$2, \$3, \$4)', '$key'::text, $from, $to, "
	  . "${amount}::bigint)::text, idempotency.last_call_replayed()";
}

# One attempt as a line of the client's log; `changed` marks a changed
# request sent after the key was answered.
sub log_attempt
{
	my ($log, $request, $amount, $outcome, $response, $replayed, $detail) = @_;
	$detail //= '';
	$detail =~ s/[\t\n]/ /g;
	print $log join("\t",
		$request->{key}, $request->{from}, $request->{to}, $amount, $outcome,
		$response // '', defined $replayed ? ($replayed ? 't' : 'f') : '',
		$request->{changed} ? 't' : 'f', $detail),
	  "\n";
}

# The storm is over once this file exists (the fault injector creates it).
my $workdir = PostgreSQL::Test::Utils::tempdir;
my $storm_over_flag = "$workdir/storm-over";
my $storm_parent = $$;
# A client also stops when the test that started it is gone.
sub storm_over { return -e $storm_over_flag || getppid() != $storm_parent }

# One client: a sequence of keys, each retried until a definite answer (a
# response, or IK422 for a payload), logging every attempt as a line
#   key \t from \t to \t amount \t outcome \t response \t replayed \t changed \t detail
sub run_client
{
	my ($client) = @_;
	srand($client * 7919 + $$);
	open my $log, '>', "$workdir/client$client.log" or die $!;
	$log->autoflush(1);
	my $pair = $client % ($clients / 2);
	my ($unique_n, $shared_n) = (0, 0);
	# Set once the client sees the storm over.
	my $give_up;

	while (!storm_over() || $unique_n + $shared_n < $min_keys_per_client)
	{
		$give_up //= time + $drain_seconds if storm_over();
		my ($key, $from, $to, $amount, $may_mutate);
		if (rand() < 0.25)
		{
			# Shared with the paired client: concurrent duplicates.
			$shared_n++;
			$key = "shared-$pair-$shared_n";
			($from, $to, $amount) = shared_request($pair, $shared_n);
			$may_mutate = 0;
		}
		else
		{
			$unique_n++;
			$key = sprintf('c%02d-%05d-%08x', $client, $unique_n, int(rand(2**32)));
			$from = 1 + int(rand($accounts));
			$to = 1 + ($from + int(rand($accounts - 1))) % $accounts;
			$amount = 1 + int(rand(100));
			$may_mutate = 1;
		}
		my $request = { key => $key, from => $from, to => $to };
		my $sent = $amount;
		my $acknowledged;
		my $explicit_transaction = rand() < 0.3;
		while (!defined $acknowledged)
		{
			if (defined $give_up && time > $give_up)
			{
				log_attempt($log, $request, $sent, 'stuck');
				last;
			}
			my $storming = !storm_over();
			$give_up //= time + $drain_seconds unless $storming;
			my $delay = $storming && rand() < 0.35 ? sprintf('%.3f', rand(0.3)) : 0;
			# A double click: the same request again, at the same moment,
			# from another connection, while the first is inside fn.
			my $double_click = $storming && rand() < 0.1;
			$delay = '0.100' if $double_click && $delay < 0.1;
			my @statements = ("SET bank.delay = $delay");
			push @statements, 'SET statement_timeout = 100'
			  if $storming && rand() < 0.2;
			push @statements, 'SET idempotency.wait_timeout = 150'
			  if rand() < 0.2;
			if ($explicit_transaction)
			{
				push @statements, 'BEGIN', 'SELECT ' . call_sql($key, $from, $to, $sent),
				  "SELECT pg_sleep($delay / 2)", 'COMMIT';
			}
			else
			{
				push @statements, 'SELECT ' . call_sql($key, $from, $to, $sent);
			}
			my $client_timeout = $storming && rand() < 0.1 ? 0.15 : 20;
			my $first = start_attempt(\@statements, $client_timeout);
			my $twin = $double_click
			  ? start_attempt([ 'SELECT ' . call_sql($key, $from, $to, $sent) ], 20)
			  : undef;
			my ($outcome, $response, $replayed, $detail) = finish_attempt($first);
			log_attempt($log, $request, $sent, $outcome, $response, $replayed,
				$detail);
			if ($twin)
			{
				my @twin_result = finish_attempt($twin);
				log_attempt($log, $request, $sent, @twin_result);
				($outcome, $response, $replayed, $detail) = @twin_result
				  if $outcome ne 'ok' && $twin_result[0] eq 'ok';
			}

			if ($outcome eq 'ok')
			{
				$acknowledged = $response;
			}
			elsif ($outcome eq 'IK422')
			{
				# The other payload of this key was applied: go back to the
				# one the key was not refused for.
				$sent = $sent == $amount ? $amount + 1000 : $amount;
			}
			elsif ($outcome eq 'unexpected')
			{
				sleep 0.05;
			}
			else
			{
				# Unknown outcome: retry; now and then a buggy client
				# retries the key with another payload.
				$sent = $amount + 1000
				  if $may_mutate && $outcome eq 'timeout' && rand() < 0.5;
				sleep(0.005 + rand(0.03));
			}
		}
		# A duplicate delivery of an acknowledged request must replay.
		if (defined $acknowledged && rand() < 0.3)
		{
			my ($outcome, $response, $replayed, $detail) =
			  attempt([ 'SELECT ' . call_sql($key, $from, $to, $sent) ], 20);
			log_attempt($log, $request, $sent, $outcome, $response, $replayed,
				$detail);
		}
		# A different request under an acknowledged key must be refused: it
		# is sent until it gets a definite answer (every client's first key
		# does it, so that every run has some).
		if (defined $acknowledged && $may_mutate && ($unique_n == 1 || rand() < 0.1))
		{
			my $other = $sent == $amount ? $amount + 1000 : $amount;
			my $changed = { %$request, changed => 1 };
			for (1 .. 20)
			{
				my ($outcome, $response, $replayed, $detail) =
				  attempt([ 'SELECT ' . call_sql($key, $from, $to, $other) ], 20);
				log_attempt($log, $changed, $other, $outcome, $response, $replayed,
					$detail);
				last if $outcome =~ /^(ok|IK422|unexpected)$/;
				sleep(0.005 + rand(0.03));
			}
		}
	}
	close $log;
}

# Every attempt of every client so far, by key, as check_storm reads
# them; and, per client, the keys it saw answered.
sub read_client_logs
{
	my (%attempts_by_key, %answered_by_client);
	for my $client (1 .. $clients)
	{
		open my $log, '<', "$workdir/client$client.log" or next;
		while (my $line = <$log>)
		{
			next unless chomp $line;    # a line still being written
			my ($key, $from, $to, $amount, $outcome, $response, $replayed,
				$changed, $detail)
			  = split /\t/, $line, 9;
			push @{ $attempts_by_key{$key} },
			  {
				from => $from,
				to => $to,
				request => $amount,
				outcome => $outcome,
				response => $response,
				ran => $outcome eq 'ok' && $replayed ne 't',
				changed => $changed eq 't',
				detail => $detail
			  };
			$answered_by_client{$client}{$key} = 1 if $outcome eq 'ok';
		}
	}
	return (\%attempts_by_key, \%answered_by_client);
}

# What the clients saw: how often each kind of fault reached them. Read
# while the storm runs (to end it once every kind has landed) and for the
# final figures.
sub effects_seen
{
	my ($attempts) = @_;
	($attempts) = read_client_logs() unless $attempts;
	my $seen = landed_faults($attempts);
	$seen->{'statement timeouts in fn'} =
	  grep { $_->{outcome} eq '57014' && $_->{detail} =~ /due to statement timeout.*\[in fn\]/ }
	  map { @$_ } values %$attempts;
	return $seen;
}

# Faults from outside the clients, until the storm ends: it ends when it
# has lasted $storm_seconds and every kind of fault has landed, both as an
# effect the injector saw (a signal function that answered true, a SIGKILL
# that crashed the server) and as an error a client saw. Counts only real
# effects.
my $started = time;
my ($injected, $client_deaths) = run_storm(
	clients => $clients,
	run_client => \&run_client,
	node => $node,
	started => $started,
	seconds => $storm_seconds,
	deadline => $storm_deadline,
	victims => "usename = 'teller' AND state = 'active'",
	max_kill9 => $max_kill9,
	kill9_every => $storm_seconds / ($max_kill9 + 1),
	all_landed => sub {
		my $seen = effects_seen();
		return !grep { $seen->{$_} == 0 } (
			'cancels', 'terminations', 'statement timeouts in fn',
			'client timeouts', 'IK409s', 'IK422s');
	},
	over_flag => $storm_over_flag);
is_deeply($client_deaths, [], 'every client ran to its end');
my $elapsed = time - $started;

my ($attempts_by_key, $answered_by_client) = read_client_logs();
my %attempts_by_key = %$attempts_by_key;
my %answered_by_client = %$answered_by_client;
my %figures;
$figures{calls} = map { @$_ } values %attempts_by_key;
$figures{replays} = grep { $_->{outcome} eq 'ok' && !$_->{ran} } map { @$_ } values %attempts_by_key;
$figures{retries} = $figures{calls} - keys %attempts_by_key;

# The storm as check_storm reads it: the clients' attempts, each key's
# ledger rows, the stored responses and the balances.
sub read_storm
{
	my %effects;
	for my $row (split /\n/, $node->safe_psql('postgres',
			'SELECT op_key, seq, from_id, to_id, amount FROM bank.ledger'))
	{
		my ($key, $seq, $from, $to, $amount) = split /\|/, $row;
		push @{ $effects{$key} },
		  {
			id => $seq,
			request => $amount,
			deltas => { $from => -$amount, $to => $amount }
		  };
	}
	my %stored = map { split /\|/, $_, 2 } split /\n/, $node->safe_psql(
		'postgres',
		"SELECT key, response::text FROM idempotency.keys WHERE scope::text = 'teller'");
	my %balances = map { split /\|/ } split /\n/,
	  $node->safe_psql('postgres', 'SELECT id, balance FROM bank.accounts');
	return {
		attempts => \%attempts_by_key,
		effects => \%effects,
		stored => \%stored,
		balances => \%balances,
		expected_base => { map { $_ => $initial_balance } 1 .. $accounts },
		answer_effect => sub { $_[0] =~ /"seq": (\d+)/ ? $1 : undef },
		every_key_answered => 1,
	};
}

my $storm = read_storm();
my @violations = check_storm($storm);
my $violation = sub { push @violations, join(' ', @_) };

# A replay of every acknowledged key now, by one session, still answers the
# first response.
my @acknowledged = grep {
	grep { $_->{outcome} eq 'ok' } @{ $attempts_by_key{$_} }
} sort keys %attempts_by_key;
my $replay_script = join(";\n",
	map {
		my ($first) = grep { $_->{outcome} eq 'ok' } @{ $attempts_by_key{$_} };
		"SELECT '$_', "
		  . call_sql($_, $first->{from}, $first->{to}, $first->{request})
	} @acknowledged) . ";\n";
my ($replay_out, $replay_err) = ('', '');
IPC::Run::run(
	[
		$psql, '-X', '-q', '-A', '-t', '-h', $host, '-p', $port, '-U', 'teller',
		'-d', 'postgres', '-v', 'ON_ERROR_STOP=1'
	],
	'<', \$replay_script, '>', \$replay_out, '2>', \$replay_err);
is($replay_err, '', 'the final replay of every acknowledged key raised no error');
my %final = map { my ($k, $r, $f) = split /\|/, $_; ($k => [ $r, $f ]) }
  split /\n/, $replay_out;
for my $key (@acknowledged)
{
	my ($first) = grep { $_->{outcome} eq 'ok' } @{ $attempts_by_key{$key} };
	my ($response, $replayed) = @{ $final{$key} // [ '', '' ] };
	$violation->("$key: final replay answered $response, first answer was "
		  . $first->{response})
	  if $response ne $first->{response};
	$violation->("$key: final call ran fn again") if $replayed ne 't';
}

$figures{'acknowledged keys'} = @acknowledged;
$figures{'ledger rows'} = $node->safe_psql('postgres', 'SELECT count(*) FROM bank.ledger');
# Faults that took effect: crashes the server log shows, and errors clients
# saw (a cancel or termination that hit an idle moment is not counted);
# signals sent are reported, not counted as landed.
$figures{"signals sent: $_"} = $injected->{$_} for qw(cancel terminate);
$figures{'crashes in the server log'} = $injected->{kill9};
my $seen = effects_seen(\%attempts_by_key);
$figures{"seen by clients: $_"} = $seen->{$_} for keys %$seen;
$figures{seconds} = sprintf('%.1f', $elapsed);
report_storm($storm, \@violations, \%figures);

is(scalar @violations, 0, 'no violation of exactly-once');
# Every kind of fault took effect (the figures above say how often).
cmp_ok($injected->{kill9}, '>=', 1, 'the storm crashed the server');
cmp_ok($seen->{cancels}, '>=', 1, 'clients saw their statements cancelled');
cmp_ok($seen->{terminations}, '>=', 1, 'clients saw their backends terminated');
cmp_ok($seen->{'client timeouts'}, '>=', 1, 'clients timed out');
cmp_ok($seen->{'statement timeouts in fn'}, '>=', 1,
	'statement_timeout fired inside fn');
cmp_ok($seen->{IK409s}, '>=', 1, 'concurrent duplicates met IK409');
cmp_ok($seen->{IK422s}, '>=', 1, 'changed requests met IK422');
cmp_ok($figures{replays}, '>=', 1, 'retries were answered by replays');
is_deeply(
	[
		grep { keys %{ $answered_by_client{$_} // {} } < $min_keys_per_client }
		  1 .. $clients
	],
	[],
	"every client saw at least $min_keys_per_client of its keys answered");
ok($node->log_contains('terminated by signal 9'),
	'the server log shows the crash restarts');

# The checker catches what it is there to catch: each of its branches,
# given the storm's observations with one fault planted, flags that fault.
check_storm_controls($storm);

# And through the database: the same reader and checker, run on the
# database with a planted second execution of one acknowledged key, a
# changed stored response of another and money moved outside the ledger,
# flag exactly those.
my ($doubled, $altered) = @acknowledged[ 0, 1 ];
$node->safe_psql(
	'postgres', qq{
INSERT INTO bank.ledger (op_key, from_id, to_id, amount)
  SELECT op_key, from_id, to_id, amount FROM bank.ledger WHERE op_key = '$doubled';
UPDATE idempotency.keys SET response = response || '{"planted": true}'
 WHERE scope::text = 'teller' AND key = '$altered';
UPDATE bank.accounts SET balance = balance + 1 WHERE id = 1;
});
my @planted = check_storm(read_storm());
my @money = grep { /^money: / } @planted;
is_deeply(
	[ sort grep { !/^money: / } @planted ],
	[
		sort "$doubled: acknowledged, but applied 2 times",
		"$altered: stored response differs from the answer"
	],
	'the checker flags a planted second execution and a changed stored response'
);
ok(grep({ /^money: 1 holds/ } @money), 'the checker flags money moved outside the ledger');

$node->stop;
done_testing();
