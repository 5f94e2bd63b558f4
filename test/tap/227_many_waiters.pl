# Twenty callers waiting for one holder (idempotency.wait_timeout = 20 s)
# all answer as soon as it ends: when it commits, every waiter replays its
# response; when it rolls back, exactly one runs fn and the others replay
# that. The same for a claim() given up while it is held (rolled back, or
# released by a holder that stays open): one waiter takes the key, the
# others replay its response. And for claim_batch, with batches that overlap
# the holder's batch and one another. None answers IK409 at its deadline, and all answer
# within 2 s of the holder's end (a bound far below the wait, not a
# measure of speed).
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use FindBin;
use lib $FindBin::RealBin;
use IdempotencyTest;

my $waiters = 20;
my $wait = '20s';
my $prompt_s = 2;

my $node = preloaded_node('manywaiters', conf => "max_connections = 40\n");

$node->safe_psql(
	'postgres', q{
CREATE EXTENSION idempotency;
CREATE TABLE runs (key text NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp());
-- Blocks while the test holds advisory lock 4242.
-- claim(), then complete() when claimed: what it did and the response.
CREATE FUNCTION take(k text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
  taken record;
BEGIN
  SELECT * INTO taken FROM idempotency.claim(k, NULL);
  IF taken.replayed THEN
    RETURN 'replayed ' || taken.response::text;
  END IF;
  PERFORM idempotency.complete(k, jsonb_build_object('by', pg_backend_pid()));
  RETURN 'claimed';
END $$;
CREATE FUNCTION work(op_key text) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_advisory_xact_lock(4242);
  INSERT INTO runs (key) VALUES (op_key);
  RETURN jsonb_build_object('key', op_key, 'at', clock_timestamp());
END $$;
});

# How many backends wait for a claim (an advisory lock with a negative
# objsubid).
my $claim_waits = "SELECT count(*) FROM pg_locks WHERE NOT granted "
  . "AND locktype = 'advisory' AND objsubid < 0";

# The output of the statement sent with query_until, and its errors.
sub collect
{
	my ($session) = @_;
	my ($out) = $session->query('SELECT 1');
	$out =~ s/\n?1$//;
	my $err = $session->{stderr};
	$session->{stderr} = '';
	return ($out, $err);
}

sub now_epoch
{
	my ($session) = @_;
	return $session->query_safe(
		'SELECT extract(epoch FROM clock_timestamp())');
}

# Starts the waiters: each sends `sql_of($i)` (a statement whose last
# column is the clock when it answered) and waits until all of them wait
# for the holder's claim.
sub start_waiters
{
	my ($sql_of, $setup) = @_;
	my @sessions;
	for my $i (1 .. $waiters)
	{
		my $session = $node->background_psql('postgres', on_error_stop => 0);
		$session->query_safe($setup // '');
		$session->query_safe("SET idempotency.wait_timeout = '$wait'");
		$session->query_until(qr/sent/, "\\echo sent\n" . $sql_of->($i) . ";\n");
		push @sessions, $session;
	}
	$node->poll_query_until('postgres', $claim_waits, $waiters)
	  or die "the waiters never all waited for the claim";
	return @sessions;
}

# Each waiter's answer (its output without the clock), how long after
# `ended_at` the last one answered, and every error reported.
sub answers
{
	my ($ended_at, @sessions) = @_;
	my (@answers, $errors);
	my $latest = 0;
	for my $session (@sessions)
	{
		my ($out, $err) = collect($session);
		$errors .= $err;
		my ($answer, $at) = $out =~ /^(.*)\|([0-9.]+)$/s;
		push @answers, $answer // "no answer: $out";
		$latest = $at - $ended_at if defined $at && $at - $ended_at > $latest;
	}
	return (\@answers, $latest, $errors // '');
}

# idempotent_call: the holder is kept inside fn, then ends with `outcome`.
sub call_scenario
{
	my ($key, $outcome) = @_;
	my $gate = $node->background_psql('postgres');
	my $holder = $node->background_psql('postgres');
	$gate->query_safe('SELECT pg_advisory_lock(4242)');
	$holder->query_safe('BEGIN');
	$holder->query_until(qr/sent/, "\\echo sent\n" . work_call_sql($key) . ";\n");
	$node->poll_query_until('postgres',
		"SELECT count(*) > 0 FROM pg_locks WHERE NOT granted AND locktype = 'advisory' AND objsubid >= 0"
	) or die "the holder never entered fn";

	my @sessions = start_waiters(sub {
		work_call_sql($key) . ', extract(epoch FROM clock_timestamp())'
	});
	$gate->query_safe('SELECT pg_advisory_unlock(4242)');
	my ($holder_out) = collect($holder);
	# The holder stays open a second after fn: the waiters wait for its
	# transaction meanwhile.
	sleep 1;
	$holder->query_safe($outcome);
	my $ended_at = now_epoch($holder);

	my @result = answers($ended_at, @sessions);
	$_->quit for $gate, $holder, @sessions;
	my ($response) = $holder_out =~ /^(\{.*\})\|f$/m
	  or die "the holder did not run fn: $holder_out";
	return ($response, @result);
}

my ($response, $answers, $latest, $errors) =
  call_scenario('many-commit', 'COMMIT');
is(scalar(grep { $_ eq "$response|t" } @$answers),
	$waiters, "all $waiters waiters replay the holder's response")
  or diag explain $answers;
cmp_ok($latest, '<', $prompt_s,
	"... within $prompt_s s of its commit (the wait is $wait)");
is($errors, '', '... with no error');
is(runs_of($node, 'many-commit'), '1', '... and fn ran once');

($response, $answers, $latest, $errors) =
  call_scenario('many-rollback', 'ROLLBACK');
my @ran = grep { /\|f$/ } @$answers;
is(scalar(@ran), 1, 'when the holder rolls back, one waiter runs fn')
  or diag explain $answers;
my ($runner) = @ran;
$runner =~ s/\|f$/|t/;
is(scalar(grep { $_ eq $runner } @$answers),
	$waiters - 1, '... and the others replay its response');
cmp_ok($latest, '<', $prompt_s,
	"... all within $prompt_s s of the rollback");
is($errors, '', '... with no error');
is(runs_of($node, 'many-rollback'), '1', '... and fn ran once');

# claim(): the holder gives the key up while it holds it, by `ending`.
sub claim_scenario
{
	my ($key, $ending) = @_;
	my $holder = $node->background_psql('postgres');
	$holder->query_safe('BEGIN');
	$holder->query_safe("SELECT replayed FROM idempotency.claim('$key', NULL)");
	my @sessions = start_waiters(sub {
		"SELECT take('$key'), extract(epoch FROM clock_timestamp())"
	});
	sleep 1;
	$holder->query_safe($ending);
	my $ended_at = now_epoch($holder);
	my @result = answers($ended_at, @sessions);
	$holder->query_safe('COMMIT') unless $ending eq 'ROLLBACK';
	$_->quit for $holder, @sessions;
	return @result;
}

for my $ending ('ROLLBACK', "SELECT idempotency.release('claim-released')")
{
	my $key = $ending eq 'ROLLBACK' ? 'claim-rolled-back' : 'claim-released';
	my $how = $ending eq 'ROLLBACK' ? 'rolls back' : 'releases it and stays open';
	($answers, $latest, $errors) = claim_scenario($key, $ending);
	is(scalar(grep { $_ eq 'claimed' } @$answers),
		1, "when a claim()'s holder $how, one waiter takes the key")
	  or diag explain $answers;
	my $stored = $node->safe_psql('postgres',
		"SELECT response FROM idempotency.lookup('$key')");
	is(scalar(grep { $_ eq "replayed $stored" } @$answers),
		$waiters - 1, '... and the others replay its response');
	cmp_ok($latest, '<', $prompt_s, "... all within $prompt_s s");
	is($errors, '', '... with no error');
}

# claim_batch: the holder claims b1, b2 and b3; waiter i claims two of them
# and a key of its own (so that the batches overlap one another too), and
# completes its own key once its batch has answered.
my @shared = qw(b1 b2 b3);
my $holder = $node->background_psql('postgres');
$holder->query_safe('BEGIN');
is( $holder->query_safe(
		"SELECT string_agg(outcome, ',') FROM idempotency.claim_batch(ARRAY['b1', 'b2', 'b3'], NULL)"
	),
	'claimed,claimed,claimed',
	'the holder claims its batch');

my @sessions = start_waiters(
	sub {
		my ($i) = @_;
		my @keys = ($shared[ $i % 3 ], $shared[ ($i + 1) % 3 ], "own-$i");
		my $array = join(', ', map { "'$_'" } @keys);
		return "SELECT string_agg(key || ':' || outcome || ':' || coalesce(response::text, ''), ',' ORDER BY key), "
		  . "extract(epoch FROM clock_timestamp()) "
		  . "FROM idempotency.claim_batch(ARRAY[$array], NULL)";
	},
	'BEGIN');
sleep 1;
$holder->query_safe(
	q{SELECT idempotency.complete_batch(ARRAY['b1', 'b2', 'b3'], ARRAY['{"n": 1}', '{"n": 2}', '{"n": 3}']::jsonb[])}
);
$holder->query_safe('COMMIT');
my $ended_at = now_epoch($holder);
($answers, $latest, $errors) = answers($ended_at, @sessions);

my %response = (b1 => '{"n": 1}', b2 => '{"n": 2}', b3 => '{"n": 3}');
my @expected = map {
	my $i = $_;
	join(',',
		map { /^own/ ? "$_:claimed:" : "$_:replayed:$response{$_}" }
		  sort ($shared[ $i % 3 ], $shared[ ($i + 1) % 3 ], "own-$i"));
} 1 .. $waiters;
is_deeply($answers, \@expected,
	"all $waiters overlapping batches replay the holder's keys and claim their own"
);
cmp_ok($latest, '<', $prompt_s,
	"... within $prompt_s s of the holder's commit (the wait is $wait)");
is($errors, '', '... with no error');
for my $i (1 .. $waiters)
{
	$sessions[ $i - 1 ]->query_safe(
		"SELECT idempotency.complete_batch(ARRAY['own-$i'], ARRAY['{}'::jsonb])");
	$sessions[ $i - 1 ]->query_safe('COMMIT');
}
is($node->safe_psql('postgres', 'SELECT count(*) FROM idempotency.keys'),
	4 + 3 + $waiters, '... and every batch commits its own key');
$_->quit for $holder, @sessions;

$node->stop;
done_testing();
