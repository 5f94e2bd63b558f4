# Claims of expired keys racing expiry and VACUUM: handlers (claim, a
# business write, complete, COMMIT, in READ COMMITTED) over a few keys that
# live 250 ms, with pauses between the statements, while the expiry worker,
# a client calling expire() and VACUUM of idempotency.keys in a loop delete
# the expired rows and free their slots. The key table stays one page or
# two, so a freed slot is soon taken by another key's new row. complete()
# replaces the expired row that claim() found; it must never delete another
# row that has come to its address since (another key's response: that key
# would run again on its next retry), nor fail on a freed slot (55000).
#
# Each committed handler records its answer in the same transaction: the
# run it made or replayed, its transaction's start (what claim() compares a
# key's expiry with) and, for a run, the expiry of the response it stored.
# The checker then goes key by key: a key runs again only once its last
# run's response has expired at the start of the new run's transaction
# (every other retry replays); every run is answered once as a run; a
# replay answers a run of its key that lived at the replay's start; every
# key whose last response still lives is stored with it. Then its
# controls, planted in the database: a key's row deleted and its request
# run again within its TTL (what the bug does), and a live key's row
# deleted; the checker must flag exactly that key each time.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;
use Time::HiRes qw(time);

use FindBin;
use lib $FindBin::RealBin;
use IdempotencyTest;

my $ttl_ms = 250;
my $keys = 24;
# The storm ends after its handlers, or after this many seconds.
my $max_seconds = 40;

my $node = preloaded_node(
	'claim_expiry_storm',
	conf => qq{idempotency.expire_interval = 1s
# Expired keys are replaced, not remembered (213 is the storm with
# tombstones).
idempotency.remember = 0
autovacuum = off
log_min_messages = warning
});
$node->safe_psql(
	'postgres', qq{
CREATE EXTENSION idempotency;
ALTER DATABASE postgres SET idempotency.ttl = '$ttl_ms milliseconds';
ALTER DATABASE postgres SET idempotency.wait_timeout = '30s';
-- The business write: one row per run of a key's request (no unique
-- constraint, so a second run shows as a second row).
CREATE TABLE runs (run bigserial PRIMARY KEY, key text NOT NULL);
-- One row per committed handler, committed with it.
CREATE TABLE answers (key text NOT NULL, replayed bool NOT NULL, response jsonb,
                      started timestamptz NOT NULL, expires_at timestamptz);
CREATE TABLE expired (deleted bigint NOT NULL);
});

# The handler for key 'storm-' || :k. Pauses on the client between its
# statements (a pause inside the server would hold a snapshot, and VACUUM
# could not free the slot meanwhile).
my $handler = q{
\set pause1 random(0, 30)
\set pause2 random(0, 30)
BEGIN;
SELECT replayed, response::text AS response FROM idempotency.claim('storm-' || :k, NULL) \gset
\if :replayed
INSERT INTO answers VALUES ('storm-' || :k, true, :response, now(), NULL);
COMMIT;
\else
\sleep :pause1 ms
INSERT INTO runs (key) VALUES ('storm-' || :k) RETURNING run \gset
\sleep :pause2 ms
SELECT idempotency.complete('storm-' || :k, jsonb_build_object('run', :run::bigint));
INSERT INTO answers SELECT 'storm-' || :k, false, response, now(), expires_at
  FROM idempotency.lookup('storm-' || :k);
COMMIT;
\endif
};
my $dir = PostgreSQL::Test::Utils::tempdir();
PostgreSQL::Test::Utils::append_to_file("$dir/storm.sql", "\\set k random(1, $keys)\n$handler");
PostgreSQL::Test::Utils::append_to_file("$dir/one.sql", $handler);
PostgreSQL::Test::Utils::append_to_file("$dir/expire.sql", q{
INSERT INTO expired SELECT idempotency.expire();
VACUUM idempotency.keys;
\sleep 5 ms
});
PostgreSQL::Test::Utils::append_to_file("$dir/vacuum.sql", q{
VACUUM idempotency.keys;
\sleep 2 ms
});

# The storm: handler clients, each running $quota handlers for random keys
# (or until the deadline, on a starved machine), and meanwhile a client
# calling expire() then VACUUM, and one running VACUUM, until the handlers
# are done. Each client runs pgbench again and again, a batch at a time. A
# key whose COMMIT comes after its expiry fails with 40001 (so does the
# replacement of an expired row that expiry is deleting), which pgbench
# retries; any other error ends the batch, and is recorded.
my $pgbench = $node->installed_command('pgbench');
my $clients = 6;
my $quota = 800;
my $deadline = time + $max_seconds;
my $done_flag = "$dir/handlers-done";
sub start_client
{
	my ($name, $mode, $script, $more) = @_;
	return pgbench_client(node => $node, db => 'postgres', dir => $dir, name => $name,
		mode => $mode, script => $script, deadline => $deadline, more => $more);
}
my $until_done = sub { return -e $done_flag ? 0 : 20 };
my %loops = (
	'expire() and VACUUM' => start_client('expire', 'simple', 'expire.sql', $until_done),
	'VACUUM' => start_client('vacuum', 'simple', 'vacuum.sql', $until_done));
my @clients;
for my $client (1 .. $clients)
{
	my $left = $quota;
	push @clients, start_client("client$client", 'extended', 'storm.sql',
		sub { $left -= $_[0] if @_; return $left > 50 ? 50 : $left });
}
my $errors_of = sub { return pgbench_client_errors($dir, $_[0]) };
my @errors;
for my $client (1 .. $clients)
{
	waitpid($clients[ $client - 1 ], 0);
	is($?, 0, "handler client $client ran to its end");
	push @errors, $errors_of->("client$client");
}
open my $flag, '>', $done_flag or die "$done_flag: $!";
close $flag;
for my $loop (sort keys %loops)
{
	waitpid($loops{$loop}, 0);
	my @loop_errors = $errors_of->($loop =~ /expire/ ? 'expire' : 'vacuum');
	ok($? == 0 && !@loop_errors, "$loop: ran without an error") or diag("$loop: @loop_errors");
}
my %error_count;
$error_count{$_}++ for @errors;
diag("handler error: $_ ($error_count{$_} times)") for sort keys %error_count;
is(scalar(grep { /attempted to delete invisible tuple/ } @errors), 0,
	'no complete() met a freed slot (55000)');
is(scalar @errors, 0, 'no handler met an error');

my $query = sub { $node->safe_psql('postgres', $_[0]) };
my $us = sub { "(extract(epoch FROM $_[0]) * 1000000)::bigint" };

# The storm as the checker reads it, key by key: runs (the business
# writes), the answers of runs and replays, what is stored now, and now.
sub read_storm
{
	my %storm = (runs => {}, ran => {}, replays => {}, stored => {});
	for (split /\n/, $query->('SELECT key, run FROM runs ORDER BY run'))
	{
		my ($key, $run) = split /\|/;
		push @{ $storm{runs}{$key} }, $run;
	}
	for (split /\n/, $query->(
		"SELECT key, replayed, response ->> 'run', " . $us->('started') . ', '
		  . $us->('expires_at') . ' FROM answers'))
	{
		my ($key, $replayed, $run, $started, $expires) = split /\|/;
		push @{ $storm{ $replayed eq 't' ? 'replays' : 'ran' }{$key} },
		  { run => $run, started => $started, expires => $expires };
	}
	my ($now, @stored) = split /\n/, $query->(
		'SELECT ' . $us->('now()') . "::text UNION ALL (SELECT key || '|' || (response ->> 'run') || '|' || "
		  . $us->('expires_at') . " FROM idempotency.keys WHERE key LIKE 'storm-%')");
	$storm{now} = $now;
	for (@stored)
	{
		my ($key, $run, $expires) = split /\|/;
		$storm{stored}{$key} = { run => $run, expires => $expires };
	}
	return \%storm;
}

# Every violation, each a text that starts with its key.
sub check_storm_keys
{
	my ($storm) = @_;
	my @violations;
	my %all = map { %{ $storm->{$_} } } qw(runs ran replays stored);
	for my $key (sort keys %all)
	{
		my $violation = sub { push @violations, "$key: $_[0]" };
		my @runs = @{ $storm->{runs}{$key} // [] };
		my %answer_of;
		for my $answer (@{ $storm->{ran}{$key} // [] })
		{
			$violation->("run $answer->{run} answered as a run twice")
			  if $answer_of{ $answer->{run} };
			$answer_of{ $answer->{run} } = $answer;
		}
		my %is_run = map { $_ => 1 } @runs;
		$violation->("answered as a run $_, which is not one of its runs")
		  for grep { !$is_run{$_} } sort keys %answer_of;
		$violation->("run $_ was never answered") for grep { !$answer_of{$_} } @runs;
		# A key runs again only once its last response has expired at the
		# start of the new run's transaction; before, a retry replays.
		for my $i (1 .. $#runs)
		{
			my ($before, $after) = @answer_of{ @runs[ $i - 1, $i ] };
			next unless $before && $after;
			$violation->(sprintf('ran again (run %s) %.1f ms before run %s\'s response expired',
					$runs[$i], ($before->{expires} - $after->{started}) / 1000, $runs[ $i - 1 ]))
			  if $after->{started} < $before->{expires};
		}
		for my $replay (@{ $storm->{replays}{$key} // [] })
		{
			my $answer = $answer_of{ $replay->{run} // '' };
			if (!$answer)
			{
				$violation->('replayed ' . ($replay->{run} // 'NULL') . ', not one of its runs');
				next;
			}
			$violation->("replayed run $replay->{run} after it expired")
			  if $replay->{started} >= $answer->{expires};
		}
		# The last response is stored while it lives; nothing else is.
		my $last = @runs ? $answer_of{ $runs[-1] } : undef;
		my $stored = $storm->{stored}{$key};
		if ($last && $last->{expires} > $storm->{now} && !$stored)
		{
			$violation->("run $runs[-1]'s response, which lives for another "
				  . sprintf('%.1f ms, is not stored', ($last->{expires} - $storm->{now}) / 1000));
		}
		$violation->("stores run $stored->{run}, its last run is " . ($runs[-1] // 'none'))
		  if $stored && (!@runs || $stored->{run} ne $runs[-1]);
	}
	return @violations;
}

my $storm = read_storm();
my @violations = check_storm_keys($storm);
my $count = sub { my ($what) = @_; my $n = 0; $n += @$_ for values %{ $storm->{$what} }; $n };
my $runs = $count->('runs');
my $replays = $count->('replays');
my $deleted = $query->('SELECT coalesce(sum(deleted), 0) FROM expired');
my $vacuumed = $query->(
	"SELECT vacuum_count || ' vacuums, ' || pg_relation_size('idempotency.keys') / 8192 || ' pages'"
	  . " FROM pg_stat_user_tables WHERE relid = 'idempotency.keys'::regclass");
note("runs: $runs, replays: $replays, keys deleted by expire(): $deleted, $vacuumed");
diag("violation: $_") for @violations[ 0 .. ($#violations < 30 ? $#violations : 29) ];
is(scalar @violations, 0,
	'every key ran again only once expired, replayed meanwhile, and kept its live response');

# The storm did race: keys replayed, ran again once expired (claims of
# expired rows), and expiry deleted rows meanwhile.
cmp_ok($replays, '>=', 100, 'keys replayed');
cmp_ok($runs - keys %{ $storm->{runs} }, '>=', 100, 'keys ran again once expired');
cmp_ok($deleted, '>=', 20, 'expire() deleted keys meanwhile');

# The controls, once every storm key has expired. The handler for key k,
# alone, with a TTL of an hour: a legitimate run again (not flagged).
Time::HiRes::sleep(($ttl_ms + 50) / 1000);
sub handle
{
	my ($k) = @_;
	local $ENV{PGOPTIONS} = '-c idempotency.ttl=1h';
	my ($out, $err) = ('', '');
	IPC::Run::run([ $pgbench, '-n', '-M', 'extended', '-t', '1', '-D', "k=$k",
			'-f', "$dir/one.sql", $node->connstr('postgres') ], '>', \$out, '2>', \$err)
	  or die "handler for storm-$k: $out $err";
	return;
}
# The violations the checker reports now and did not report before.
my @reported = @violations;
my $new_violations = sub {
	my %before = map { $_ => 1 } @reported;
	@reported = check_storm_keys(read_storm());
	return grep { !$before{$_} } @reported;
};
handle(1);
handle(2);
is_deeply([ $new_violations->() ], [], 'control: keys run again once expired are not flagged');

# A row lost as the bug loses it (another key's complete() deleting it),
# then a retry within the TTL: the request runs a second time.
$query->("DELETE FROM idempotency.keys WHERE key = 'storm-1'");
handle(1);
my @flagged = $new_violations->();
ok(@flagged && !grep({ !/^storm-1: ran again/ } @flagged),
	'control: the checker flags a key run twice within its TTL, that key only')
  or diag("flagged: @flagged");

# A live row lost, no retry.
$query->("DELETE FROM idempotency.keys WHERE key = 'storm-2'");
@flagged = $new_violations->();
ok(@flagged && !grep({ !/^storm-2: run \d+'s response, which lives .* is not stored$/ } @flagged),
	'control: the checker flags a live key whose row was lost, that key only')
  or diag("flagged: @flagged");

$node->stop;
done_testing();
