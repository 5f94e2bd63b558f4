# A shop under retries, written as application code: each delivery of an
# order opens a transaction, claims the order's key with idempotency.claim(),
# and - when it proceeds - runs several statements, branching in the client
# on what it reads (in stock: reserve and record the order; out of stock:
# decline), then completes the key with the response and commits. Some keys
# go through idempotent_call instead, with idempotency.store_errors making
# "out of stock" (P0001) a stored answer. Stock is topped up during the run,
# so a declined order retried later would succeed if its decline were not
# stored.
#
# Faults: client-side timeouts, pg_cancel_backend, pg_terminate_backend, a
# kill -9 of a backend (restart_after_crash), concurrent duplicate
# deliveries, duplicates after the answer, and changed bodies.
#
# Afterwards the shared checker (check_storm in IdempotencyTest.pm) reads
# the clients' deliveries and the database key by key: no order was
# executed twice (the orders table has no unique constraint), every answer
# for a key is the first one and the one recorded, a changed body after the
# answer was refused, a declined key never got an order, and the stock is
# explained by the orders and the top-ups; every acknowledged key replays
# its answer. Then the checker's controls: one planted fault per branch,
# each of which it must flag.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use IdempotencyTest;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;
use POSIX ();
use Time::HiRes qw(time sleep);

my $clients = 10;
# The storm lasts at least this long, and then until every kind of fault
# has reached a client and idempotent_call has stored a decline; past $storm_deadline seconds it ends anyway, and the
# test fails on the fault that never landed.
my $storm_seconds = $ENV{IDEMPOTENCY_STORM_SECONDS} // 12;
my $storm_deadline = $storm_seconds + 120;
# Clients finish their open keys after the storm; longer means stuck.
my $drain_seconds = 60;
my $items = 8;
my $initial_stock = 40;
my $max_kill9 = 1;

my $node = preloaded_node(
	'app_storm',
	conf => qq{restart_after_crash = on
max_connections = 60
log_min_messages = warning
log_min_error_statement = panic
});

$node->safe_psql(
	'postgres', qq{
CREATE EXTENSION idempotency;
CREATE ROLE shopper LOGIN;
CREATE SCHEMA shop;
GRANT USAGE ON SCHEMA shop TO shopper;
CREATE TABLE shop.stock (item int PRIMARY KEY, units int NOT NULL);
INSERT INTO shop.stock SELECT i, $initial_stock FROM generate_series(1, $items) AS i;
-- No unique constraint on op_key: a second execution of an order shows up
-- as a second row.
CREATE TABLE shop.orders (
    seq    bigserial PRIMARY KEY,
    op_key text NOT NULL,
    item   int NOT NULL,
    units  int NOT NULL);
CREATE TABLE shop.top_ups (item int NOT NULL, units int NOT NULL);
GRANT SELECT, UPDATE ON shop.stock TO shopper;
GRANT SELECT, INSERT ON shop.orders TO shopper;
GRANT USAGE ON SEQUENCE shop.orders_seq_seq TO shopper;

-- The same order as one fn, for the keys that go through idempotent_call.
-- It sleeps for the session's shop.delay, as the handler does.
CREATE FUNCTION shop.buy(op_key text, wanted_item int, wanted int)
RETURNS jsonb LANGUAGE plpgsql AS \$\$
DECLARE
  delay float8 := coalesce(nullif(current_setting('shop.delay', true), ''), '0')::float8;
  left_units int;
  entry bigint;
BEGIN
  PERFORM pg_sleep(delay / 2);
  SELECT units INTO left_units FROM shop.stock WHERE item = wanted_item FOR UPDATE;
  IF left_units < wanted THEN
    RAISE EXCEPTION 'out of stock' USING DETAIL = format('item %s', wanted_item);
  END IF;
  UPDATE shop.stock SET units = units - wanted WHERE item = wanted_item;
  INSERT INTO shop.orders (op_key, item, units) VALUES (op_key, wanted_item, wanted)
    RETURNING seq INTO entry;
  PERFORM pg_sleep(delay / 2);
  RETURN jsonb_build_object('order', entry, 'item', wanted_item, 'units', wanted,
                            'at', clock_timestamp());
END \$\$;
});

my $workdir = PostgreSQL::Test::Utils::tempdir;
my $psql = $node->installed_command('psql');
# The storm is over once this file exists (storm_from_outside creates it);
# a client also stops when the test that started it is gone.
my $storm_over_flag = "$workdir/storm-over";
my $storm_parent = $$;
sub storm_over { return -e $storm_over_flag || getppid() != $storm_parent }

# The handler, as application code: psql's \\if branches on what the claim
# and the reads returned, as a web handler's code would. It prints
#   ANSWER|<how>|<response>
# only after COMMIT succeeded: only then is the answer acknowledged.
my $handler = "$workdir/handler.sql";
open my $script, '>', $handler or die $!;
print $script <<'EOF';
SET statement_timeout = :statement_timeout;
BEGIN;
SELECT replayed, coalesce(response::text, 'null') AS response
  FROM idempotency.claim(:'key', :'body') \gset
\if :replayed
COMMIT;
SELECT 'ANSWER|replayed|' || :'response';
\else
SELECT pg_sleep(:delay / 2);
SELECT units >= :units AS in_stock FROM shop.stock WHERE item = :item FOR UPDATE \gset
\if :in_stock
UPDATE shop.stock SET units = units - :units WHERE item = :item;
INSERT INTO shop.orders (op_key, item, units) VALUES (:'key', :item, :units)
  RETURNING seq \gset
SELECT jsonb_build_object('order', :seq, 'item', :item, 'units', :units,
                          'at', clock_timestamp())::text AS response \gset
\set how ran
\else
SELECT jsonb_build_object('error', jsonb_build_object(
         'sqlstate', 'P0001', 'message', 'out of stock',
         'detail', 'item ' || :item, 'hint', null))::text AS response \gset
\set how declined
\endif
SELECT pg_sleep(:delay / 2);
SELECT idempotency.complete(:'key', :'response');
COMMIT;
SELECT 'ANSWER|' || :'how' || '|' || :'response';
\endif
EOF
close $script;

# The same order through idempotent_call, declines stored as errors.
my $caller = "$workdir/caller.sql";
open $script, '>', $caller or die $!;
print $script <<'EOF';
SET statement_timeout = :statement_timeout;
SET idempotency.store_errors = 'P0001';
SET shop.delay = :delay;
SELECT idempotency.idempotent_call(:'key', NULL,
         'SELECT shop.buy($1, $2, $3)', :'key'::text, :item, :units)::text AS response \gset
SELECT 'ANSWER|' || outcome || '|' || :'response' FROM idempotency.last_call();
EOF
close $script;

# Answers after which a client retries: IK409, and errors that leave it
# knowing nothing about its request.
my %retryable = map { $_ => 1 } qw(IK409 57014 57P01 57P02 57P03 53300 40P01 40001);

sub start_delivery
{
	my ($order, $units, $timeout, $delay, $statement_timeout) = @_;
	my @command = (
		'timeout', '-s', 'KILL', $timeout, $psql, '-X', '-q', '-A', '-t',
		'-h', $node->host, '-p', $node->port, '-U', 'shopper', '-d', 'postgres',
		'-v', 'ON_ERROR_STOP=1', '-v', 'VERBOSITY=verbose',
		'-v', "key=$order->{key}", '-v', "item=$order->{item}",
		'-v', "units=$units", '-v', "body=item $order->{item} units $units",
		'-v', "delay=$delay", '-v', "statement_timeout=$statement_timeout",
		'-f', $order->{api} eq 'claim' ? $handler : $caller);
	my $delivery = { out => '', err => '' };
	$delivery->{run} = IPC::Run::start(\@command, '<', \undef, '>',
		\$delivery->{out}, '2>', \$delivery->{err});
	return $delivery;
}

# (outcome, how, response, detail); outcome is ok, IK422, timeout, broken,
# a retryable SQLSTATE or unexpected.
sub finish_delivery
{
	my ($delivery) = @_;
	$delivery->{run}->finish;
	my $status = $delivery->{run}->full_result(0);
	my ($exit, $signal) = ($status >> 8, $status & 127);
	my ($out, $err) = ($delivery->{out}, $delivery->{err});
	return ('timeout') if $signal == 9 || $exit == 124 || $exit == 137;
	if ($exit == 0)
	{
		return ('ok', $1, $2) if $out =~ /^ANSWER\|(\w+)\|(.*)$/m;
		return ('unexpected', undef, undef, "no answer: $out $err");
	}
	if ($err =~ /(?:ERROR|FATAL):\s+([0-9A-Z]{5}):\s*(.*)/)
	{
		return ('IK422') if $1 eq 'IK422';
		return ($1, undef, undef, $2) if $retryable{$1};
		return ('unexpected', undef, undef, "$1: $2");
	}
	return ('broken', undef, undef, $err)
	  if $err =~ /server closed the connection|connection to server|could not send|terminating connection|no connection to the server/;
	return ('unexpected', undef, undef, "exit $exit: $err");
}

# One delivery as a line of the client's log; `changed` marks a changed
# body sent after the key was answered.
sub log_delivery
{
	my ($log, $order, $units, @result) = @_;
	my ($outcome, $how, $response, $detail) = map { $_ // '' } @result;
	$detail =~ s/[\t\n]/ /g;
	print $log join("\t", $order->{key}, $order->{api}, $order->{item}, $units,
		$outcome, $how, $response, $order->{changed} ? 't' : 'f', $detail), "\n";
}

sub run_client
{
	my ($client) = @_;
	srand($client * 104729 + $$);
	open my $log, '>', "$workdir/client$client.log" or die $!;
	$log->autoflush(1);
	my $n = 0;
	my $give_up;
	while (!storm_over())
	{
		$n++;
		my $order = {
			key => sprintf('c%02d-%04d-%06x', $client, $n, int(rand(2**24))),
			api => rand() < 0.7 ? 'claim' : 'call',
			item => 1 + int(rand($items)),
		};
		my $units = 1 + int(rand(4));
		my $sent = $units;
		my $answered;
		while (!defined $answered)
		{
			my $storming = !storm_over();
			$give_up //= time + $drain_seconds unless $storming;
			if (defined $give_up && time > $give_up)
			{
				log_delivery($log, $order, $sent, 'stuck');
				last;
			}
			my $delay = $storming && rand() < 0.4 ? sprintf('%.3f', rand(0.2)) : 0;
			# Fires in the handler's or fn's sleep when the delay is long.
			my $statement_timeout = $storming && rand() < 0.15 ? 50 : 0;
			my $timeout = $storming && rand() < 0.1 ? 0.12 : 20;
			# A duplicate delivery at the same moment, while the first one
			# holds the key.
			my $double = $storming && rand() < 0.15;
			($delay, $statement_timeout, $timeout) = ('0.200', 0, 20) if $double;
			my $first = start_delivery($order, $sent, $timeout, $delay,
				$statement_timeout);
			my $twin = $double ? start_delivery($order, $sent, 20, 0, 0) : undef;
			my @result = finish_delivery($first);
			log_delivery($log, $order, $sent, @result);
			if ($twin)
			{
				my @twin = finish_delivery($twin);
				log_delivery($log, $order, $sent, @twin);
				@result = @twin if $result[0] ne 'ok' && $twin[0] eq 'ok';
			}
			if ($result[0] eq 'ok')
			{
				$answered = 1;
			}
			elsif ($result[0] eq 'IK422')
			{
				# The other body was applied: go back to it.
				$sent = $sent == $units ? $units + 1000 : $units;
			}
			else
			{
				# No answer: retry; now and then a buggy client retries
				# with a changed body.
				$sent = $units + 1000 if $result[0] eq 'timeout' && rand() < 0.3;
				sleep(0.005 + rand(0.02));
			}
		}
		next unless $answered;
		# Duplicates after the answer: the same body replays, a changed one
		# is refused.
		if (rand() < 0.3)
		{
			log_delivery($log, $order, $sent,
				finish_delivery(start_delivery($order, $sent, 20, 0, 0)));
		}
		# The changed body is sent until it gets a definite answer (every
		# client's first key does it, so that every run has some).
		if ($n == 1 || rand() < 0.1)
		{
			my $other = $sent == $units ? $units + 1000 : $units;
			my $changed = { %$order, changed => 1 };
			for (1 .. 20)
			{
				my @result = finish_delivery(start_delivery($changed, $other, 20, 0, 0));
				log_delivery($log, $changed, $other, @result);
				last if $result[0] =~ /^(ok|IK422|unexpected)$/;
				sleep(0.005 + rand(0.02));
			}
		}
	}
	close $log;
}

# Every delivery of every client so far, by key, as check_storm reads
# them.
sub read_client_logs
{
	my %deliveries;
	for my $client (1 .. $clients)
	{
		open my $log, '<', "$workdir/client$client.log" or next;
		while (my $line = <$log>)
		{
			next unless chomp $line;    # a line still being written
			my ($key, $api, $item, $units, $outcome, $how, $response, $changed,
				$detail)
			  = split /\t/, $line, 9;
			push @{ $deliveries{$key} },
			  {
				api => $api,
				item => $item,
				request => $units,
				outcome => $outcome,
				how => $how,
				response => $response,
				ran => $outcome eq 'ok' && $how !~ /^replayed/,
				changed => $changed eq 't',
				detail => $detail
			  };
		}
	}
	return \%deliveries;
}

# The faults the storm must land, each seen by a client.
my @fault_kinds = ('cancels', 'terminations', 'statement timeouts',
	'client timeouts', 'IK409s', 'IK422s');

# Faults from outside, and stock top-ups, until the storm ends: when it has
# lasted $storm_seconds, the server crashed (its log says so) and every
# kind of fault has reached a client (or past $storm_deadline). Signals
# are reported, not counted as landed: clients count what reached them.
my $started = time;
my $top_ups = 0;
my ($outside, $client_deaths) = run_storm(
	clients => $clients,
	run_client => \&run_client,
	node => $node,
	started => $started,
	seconds => $storm_seconds,
	deadline => $storm_deadline,
	victims => "usename = 'shopper' AND state <> 'idle'",
	max_kill9 => $max_kill9,
	kill9_every => $storm_seconds / 4,
	# A stored decline through idempotent_call needs an item out of stock
	# when such a key arrives: the storm goes on until one happened too.
	all_landed => sub {
		my $logs = read_client_logs();
		my $seen = landed_faults($logs);
		return 0 if grep { $seen->{$_} == 0 } @fault_kinds;
		return grep { $_->{outcome} eq 'ok' && $_->{how} eq 'stored_error' }
		  map { @$_ } values %$logs;
	},
	each_round => sub {
		return if rand() >= 0.25;
		my $item = 1 + int(rand($items));
		my ($rc) = psql_or_undef($node,
			"BEGIN; UPDATE shop.stock SET units = units + 5 WHERE item = $item; "
			  . "INSERT INTO shop.top_ups VALUES ($item, 5); COMMIT;");
		$top_ups++ if defined $rc && $rc == 0;
	},
	over_flag => $storm_over_flag);
is_deeply($client_deaths, [], 'every client ran to its end');

my %deliveries = %{ read_client_logs() };
my %figures;
$figures{deliveries} = map { @$_ } values %deliveries;
$figures{"answer $_->{how}"}++
  for grep { $_->{outcome} eq 'ok' } map { @$_ } values %deliveries;

# The storm as check_storm reads it: the deliveries, each key's orders,
# the stored responses and the stock.
sub read_storm
{
	my %effects;
	for my $row (split /\n/,
		$node->safe_psql('postgres', 'SELECT op_key, seq, item, units FROM shop.orders'))
	{
		my ($key, $seq, $item, $units) = split /\|/, $row;
		push @{ $effects{$key} },
		  { id => $seq, request => $units, deltas => { $item => -$units } };
	}
	my %stored = map { split /\|/, $_, 2 } split /\n/, $node->safe_psql('postgres',
		"SELECT key, response::text FROM idempotency.keys WHERE scope::text = 'shopper'");
	my %stock = map { split /\|/ } split /\n/,
	  $node->safe_psql('postgres', 'SELECT item, units FROM shop.stock');
	my %base = map { split /\|/ } split /\n/, $node->safe_psql('postgres',
		"SELECT i, $initial_stock + coalesce((SELECT sum(units) FROM shop.top_ups WHERE item = i), 0) "
		  . "FROM generate_series(1, $items) AS i");
	return {
		attempts => \%deliveries,
		effects => \%effects,
		stored => \%stored,
		balances => \%stock,
		expected_base => \%base,
		# A declined order's answer is a stored error: nothing applied.
		answer_effect => sub { $_[0] =~ /"order": (\d+)/ ? $1 : undef },
		every_key_answered => 1,
	};
}

# Every answered key replays its first answer now, stock having been topped
# up meanwhile: a declined order stays declined.
$node->safe_psql('postgres',
	"UPDATE shop.stock SET units = units + 100000; "
	  . "INSERT INTO shop.top_ups SELECT item, 100000 FROM shop.stock;");
my @violations;
my $violation = sub { push @violations, join(' ', @_) };
for my $key (sort keys %deliveries)
{
	my ($first) = grep { $_->{outcome} eq 'ok' } @{ $deliveries{$key} };
	next unless $first;
	$figures{'declined keys'}++ if $first->{response} =~ /"error"/;
	my $order = { key => $key, api => $first->{api}, item => $first->{item} };
	my ($outcome, $how, $response) =
	  finish_delivery(start_delivery($order, $first->{request}, 20, 0, 0));
	$violation->("$key: delivered again, answered "
		  . join(' ', map { $_ // '' } $outcome, $how, $response))
	  unless $outcome eq 'ok'
	  && $how =~ /^replayed/
	  && $response eq $first->{response};
}
my $storm = read_storm();
push @violations, check_storm($storm);

$figures{"signals sent: $_"} = $outside->{$_} for qw(cancel terminate);
$figures{'crashes in the server log'} = $outside->{kill9};
$figures{'top-ups'} = $top_ups;
my $seen = landed_faults(\%deliveries);
$figures{"seen by clients: $_"} = $seen->{$_} for keys %$seen;
$figures{seconds} = sprintf('%.1f', time - $started);
report_storm($storm, \@violations, \%figures);

is(scalar @violations, 0, 'no order executed twice, every answer replays, no decline later succeeds');
# Every kind of fault landed: the server log shows the crash, clients saw
# the others (figures above say how often).
cmp_ok($outside->{kill9}, '>=', 1, 'the server crashed');
cmp_ok($seen->{$_}, '>=', 1, "clients saw $_") for @fault_kinds;
cmp_ok($figures{'answer replayed'} // 0, '>=', 1, 'duplicates were answered by replays');
cmp_ok($figures{'declined keys'} // 0, '>=', 1, 'orders were declined');
cmp_ok($figures{'answer stored_error'} // 0, '>=', 1, 'idempotent_call stored declines');
cmp_ok(scalar(grep { my $key = $_; grep { $_->{outcome} eq 'ok' } @{ $deliveries{$key} } } keys %deliveries),
	'>=', 20, 'the storm answered enough orders');

# The checker catches what it is there to catch: each branch, given the
# storm's observations with one fault planted, flags it.
check_storm_controls($storm);

$node->stop;
done_testing();
