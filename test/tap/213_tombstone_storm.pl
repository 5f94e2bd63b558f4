# Keys expiring while their retries arrive, with tombstones: clients retry
# the same request of a few keys that live 200 ms, again and again, while
# the expiry worker and a client calling expire() in a loop turn the
# expired keys into tombstones. The keys of each second are new ones (the
# second is part of the key), so that keys keep being born, replayed,
# expired and turned into tombstones while the storm lasts, on a fast
# machine or a slow one. Every retry is answered by a run (the first
# one), a replay of that run while the response lives, or IK410 once it has
# expired - never a second run: each key's request runs exactly once, in
# the whole storm, whether a retry met the live row, the row past its TTL
# before expiry came by, the row being turned into a tombstone by an open
# expiry transaction, or the tombstone.
#
# The control is the same storm in another database with
# idempotency.remember = 0: there the keys must run again once expired (the
# checker sees second runs), which shows the checker would see them here.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);

use FindBin;
use lib $FindBin::RealBin;
use IdempotencyTest;

my $ttl_ms = 200;
my $keys = 16;
my $clients = 4;
my $quota = 600;
# Each storm ends after its retries, or after this many seconds.
my $max_seconds = 30;

my $node = preloaded_node(
	'tombstone_storm',
	conf => qq{idempotency.expire_interval = 1s
log_min_messages = warning
});
$node->safe_psql('postgres', 'CREATE DATABASE control');
$node->safe_psql('postgres',
	"ALTER DATABASE control SET idempotency.remember = 0");
for my $db (qw(postgres control))
{
	$node->safe_psql(
		$db, qq{
CREATE EXTENSION idempotency;
ALTER DATABASE $db SET idempotency.ttl = '$ttl_ms milliseconds';
-- Two retries of one key at once: the second waits for the first.
ALTER DATABASE $db SET idempotency.wait_timeout = '30s';
-- The business write: one row per run of a key's request (no unique
-- constraint, so a second run shows as a second row).
CREATE TABLE runs (run bigserial PRIMARY KEY, key text NOT NULL);
CREATE FUNCTION pay(key text) RETURNS bigint LANGUAGE sql
  AS \$\$ INSERT INTO runs (key) VALUES (key) RETURNING run \$\$;
-- One row per retry, committed with it: how it was answered.
CREATE TABLE answers (key text NOT NULL, answer text NOT NULL);
CREATE FUNCTION retry(key text) RETURNS void LANGUAGE plpgsql AS \$\$
DECLARE
  answer text;
BEGIN
  BEGIN
    PERFORM idempotency.idempotent_call(key, NULL, 'SELECT pay(\$1)', key);
    answer := CASE WHEN idempotency.last_call_replayed() THEN 'replayed' ELSE 'ran' END;
  EXCEPTION WHEN SQLSTATE 'IK410' THEN
    answer := 'IK410';
  END;
  INSERT INTO answers VALUES (key, answer);
END \$\$;
CREATE TABLE expired (deleted bigint NOT NULL);
});
}

my $dir = PostgreSQL::Test::Utils::tempdir();
PostgreSQL::Test::Utils::append_to_file("$dir/retry.sql", qq{
\\set k random(1, $keys)
SELECT retry('storm-' || :k || '-' || floor(extract(epoch FROM clock_timestamp()))::bigint);
\\sleep 2 ms
});
PostgreSQL::Test::Utils::append_to_file("$dir/expire.sql", q{
INSERT INTO expired SELECT idempotency.expire();
\sleep 5 ms
});

# One storm in database $db: $clients clients each making $quota retries
# (pgbench retries 40001 and the like itself), and a client calling
# expire() until they are done. Returns the errors the clients met.
sub storm
{
	my ($db) = @_;
	my $deadline = time + $max_seconds;
	my $done_flag = "$dir/$db-done";
	my $start = sub {
		my ($name, $script, $more) = @_;
		return pgbench_client(node => $node, db => $db, dir => $dir, name => "$db-$name",
			mode => 'extended', script => $script, deadline => $deadline, more => $more);
	};
	my $expirer = $start->('expire', 'expire.sql', sub { -e $done_flag ? 0 : 20 });
	my @pids;
	for my $client (1 .. $clients)
	{
		my $left = $quota;
		push @pids, $start->("client$client", 'retry.sql',
			sub { $left -= $_[0] if @_; return $left > 50 ? 50 : $left });
	}
	waitpid($_, 0) for @pids;
	open my $flag, '>', $done_flag or die "$done_flag: $!";
	close $flag;
	waitpid($expirer, 0);
	my @errors;
	for my $name ('expire', map { "client$_" } 1 .. $clients)
	{
		push @errors, pgbench_client_errors($dir, "$db-$name");
	}
	return @errors;
}

# How a storm went: the keys that ran more than once, and counts.
sub outcome
{
	my ($db) = @_;
	my $query = sub { $node->safe_psql($db, $_[0]) };
	my %outcome;
	$outcome{twice} = [ split /\n/, $query->(
		'SELECT key FROM runs GROUP BY key HAVING count(*) > 1 ORDER BY key') ];
	$outcome{runs} = $query->('SELECT count(*) FROM runs');
	$outcome{keys_run} = $query->('SELECT count(DISTINCT key) FROM runs');
	for my $answer (qw(ran replayed IK410))
	{
		$outcome{$answer} = $query->("SELECT count(*) FROM answers WHERE answer = '$answer'");
	}
	$outcome{expired} = $query->('SELECT coalesce(sum(deleted), 0) FROM expired');
	$outcome{tombstones} = $query->(
		'SELECT count(*) FROM idempotency.keys WHERE expired_at IS NOT NULL');
	note("$db: " . join(', ', map { "$_ $outcome{$_}" } qw(runs keys_run ran replayed IK410 expired tombstones)));
	return \%outcome;
}

my @errors = storm('postgres');
is(scalar @errors, 0, 'no retry met an error')
  or diag(join("\n", grep { defined } @errors[ 0 .. 9 ]));
my $storm = outcome('postgres');
is_deeply($storm->{twice}, [], 'no request ran twice');
is($storm->{runs}, $storm->{keys_run}, 'each key ran once');
is($storm->{ran}, $storm->{runs}, 'each run answered as a run');
# The storm did race: retries replayed, met keys whose responses had
# expired, and expiry turned keys into tombstones meanwhile.
cmp_ok($storm->{replayed}, '>=', 100, 'retries replayed live responses');
cmp_ok($storm->{IK410}, '>=', 100, 'retries after expiry answered IK410');
cmp_ok($storm->{expired}, '>=', 1, 'expire() turned keys into tombstones meanwhile');
cmp_ok($storm->{tombstones}, '>=', 1, 'tombstones stored');

# The control: remember = 0 in database control.
@errors = storm('control');
is(scalar @errors, 0, 'control: no retry met an error')
  or diag(join("\n", grep { defined } @errors[ 0 .. 9 ]));
my $control = outcome('control');
cmp_ok(scalar @{ $control->{twice} }, '>=', 1,
	'control: without tombstones, requests ran again once expired');
is($control->{IK410}, 0, 'control: no IK410 without tombstones');
is($control->{tombstones}, 0, 'control: no tombstones');

$node->stop;
done_testing();
