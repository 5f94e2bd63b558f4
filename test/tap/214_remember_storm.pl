# A key's window after its TTL (idempotency.remember) is fixed when the key
# is claimed, with its TTL: a caller judging the expired row and expiry
# turning it into a tombstone end the window at the same instant, whatever
# their own settings (postgresql.conf, ALTER DATABASE, ALTER ROLE, ALTER
# ROLE IN DATABASE, a superuser's SET).
#
# First the cases one at a time, in a database whose remember is 2s: a role
# remembering 7 days (a late retry is refused before expiry comes by, after
# it, and after the database's 2 s have passed: its request runs once), a
# role remembering 10 s in this database (refused until then, then
# absent), a role remembering nothing (absent before and after expiry, no
# tombstone). expire() runs as a superuser who set yet another remember.
#
# Then a storm: keys of several roles whose remember differs from the
# database's, living 200 ms, retried again and again for four seconds
# while the worker (every second) and a superuser's expire() in a loop
# (remember 0) convert them. A ledger counts the runs of each key; the
# checker flags every key of a remembering role that ran twice, and is
# shown to flag one planted double run.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);

use FindBin;
use lib $FindBin::RealBin;
use IdempotencyTest;

my $node = preloaded_node(
	'remember_storm',
	conf => qq{idempotency.expire_interval = 0
idempotency.remember = '3s'
log_min_messages = warning
});

# The ledger, the business function and a retry's outcome, in database $db.
sub prepare_database
{
	my ($db) = @_;
	$node->safe_psql(
		$db, q{
CREATE EXTENSION idempotency;
-- One row per run of a key's request; no unique constraint, so a second
-- run shows as a second row.
CREATE TABLE runs (run bigserial PRIMARY KEY, key text NOT NULL,
                   role text NOT NULL DEFAULT current_user);
GRANT INSERT, SELECT ON runs TO PUBLIC;
GRANT USAGE ON SEQUENCE runs_run_seq TO PUBLIC;
CREATE FUNCTION pay(key text) RETURNS bigint LANGUAGE sql
  AS $$ INSERT INTO runs (key) VALUES (key) RETURNING run $$;
-- One row per retry: how it was answered.
CREATE TABLE answers (key text NOT NULL, role text NOT NULL DEFAULT current_user,
                      answer text NOT NULL);
GRANT INSERT, SELECT ON answers TO PUBLIC;
CREATE FUNCTION attempt(key text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
  answer text;
BEGIN
  BEGIN
    PERFORM idempotency.idempotent_call(key, NULL, 'SELECT pay($1)', key);
    answer := CASE WHEN idempotency.last_call_replayed() THEN 'replayed' ELSE 'ran' END;
  EXCEPTION WHEN SQLSTATE 'IK410' THEN
    answer := 'IK410';
  END;
  INSERT INTO answers (key, answer) VALUES (key, answer);
  RETURN answer;
END $$;
});
}

# Waits until `sql` answers 't' in $db, at most the default timeout.
sub wait_for
{
	my ($db, $sql, $what) = @_;
	ok($node->poll_query_until($db, $sql), $what);
}

# --- the cases one at a time ------------------------------------------------

$node->safe_psql(
	'postgres', q{
CREATE DATABASE r3;
ALTER DATABASE r3 SET idempotency.remember = '2s';
-- '7 days' is 168 hours here, whatever the machine's time zone.
ALTER DATABASE r3 SET timezone = 'UTC';
CREATE ROLE dave LOGIN;
ALTER ROLE dave SET idempotency.remember = '7 days';
CREATE ROLE carol LOGIN;
ALTER ROLE carol SET idempotency.remember = 0;
CREATE ROLE frank LOGIN;
ALTER ROLE frank IN DATABASE r3 SET idempotency.remember = '10s';
});
prepare_database('r3');

my %as = map { $_ => [ extra_params => [ '-U', $_ ] ] } qw(dave carol frank);
sub attempt_as
{
	my ($role) = @_;
	return $node->safe_psql('r3', "SET idempotency.ttl = '1s'; SELECT attempt('dd-1')",
		@{ $as{$role} });
}
sub state_as
{
	my ($role) = @_;
	return $node->safe_psql('r3', "SELECT state FROM idempotency.lookup('dd-1')",
		@{ $as{$role} });
}
# A role's row: tombstone or not, and the window it stores or keeps.
sub row_of
{
	my ($role) = @_;
	return $node->safe_psql(
		'r3', qq{
SELECT CASE WHEN expired_at IS NULL THEN 'live' ELSE 'tombstone ' || (expires_at - expired_at) END
  FROM idempotency.keys WHERE scope::text = '$role'});
}
sub runs_as
{
	my ($role) = @_;
	return $node->safe_psql('r3', "SELECT count(*) FROM runs WHERE role = '$role'");
}

is(attempt_as($_), 'ran', "$_: the request runs") for qw(dave carol frank);
wait_for('r3', 'SELECT bool_and(expires_at <= now()) FROM idempotency.keys',
	'the three keys expired');

# Before expiry comes by: each caller's answer by the key's own window.
is(attempt_as('dave'), 'IK410', 'dave (7 days), before expiry: IK410');
is(attempt_as('frank'), 'IK410', 'frank (10 s in r3), before expiry: IK410');
is(state_as('carol'), 'expired', 'carol (0), before expiry: expired, not remembered');

# expire() by a superuser who set yet another window, in a database of 2 s.
$node->safe_psql('r3', "SET idempotency.remember = '1s'; SELECT idempotency.expire()");
is(row_of('dave'), 'tombstone 7 days', "dave's tombstone keeps his 7 days");
is(row_of('frank'), 'tombstone 00:00:10', "frank's tombstone keeps his 10 s");
is(row_of('carol'), '', "carol's key deleted without a tombstone");

is(attempt_as('dave'), 'IK410', 'dave, after expiry: IK410');
is(attempt_as('frank'), 'IK410', 'frank, after expiry: IK410');
is(state_as('carol'), 'absent', 'carol, after expiry: absent, as before it');

# Past the database's and the superuser's windows: still refused.
wait_for('r3',
	q{SELECT bool_and(now() > expired_at + interval '2.5s') FROM idempotency.keys},
	"the database's window has passed");
is(attempt_as('dave'), 'IK410', 'dave, past the database window: IK410');
is(attempt_as('frank'), 'IK410', 'frank, past the database window: IK410');

# frank's key is refused until his 10 s end, then forgotten (lookup says
# expired: a retry would run as new).
my $deadline = time + $PostgreSQL::Test::Utils::timeout_default;
sleep 1 until state_as('frank') eq 'expired' || time > $deadline;
is(state_as('frank'), 'expired', "frank's key is forgotten after his window");
is(runs_as('dave'), 1, "dave's request ran once");
is(runs_as('frank'), 1, "frank's request ran once");
is(attempt_as('carol'), 'ran', 'carol: her expired key runs as new (remember 0)');

# --- the storm -------------------------------------------------------------

my $ttl_ms = 200;
my $keys = 12;
my $quota = 800;
# Retries of one key come for this many seconds: past the TTL, past the
# database's window and the worker's rounds.
my $bucket_seconds = 4;
# The storm ends after its retries, or after this many seconds.
my $max_seconds = 40;

# The database remembers 1 s, the server 3 s; each retrying role remembers
# longer, from another place, but role zero, which remembers nothing. The
# expiry worker runs every second with the database's setting, and a
# superuser's expire() with remember 0.
$node->safe_psql(
	'postgres', q{
CREATE DATABASE storm;
ALTER DATABASE storm SET idempotency.remember = '1s';
ALTER DATABASE storm SET idempotency.wait_timeout = '30s';
CREATE ROLE long_role LOGIN;
ALTER ROLE long_role SET idempotency.remember = '1 hour';
CREATE ROLE local_role LOGIN;
ALTER ROLE local_role IN DATABASE storm SET idempotency.remember = '30 min';
CREATE ROLE zero_role LOGIN;
ALTER ROLE zero_role SET idempotency.remember = 0;
});
prepare_database('storm');
$node->safe_psql('storm', 'CREATE TABLE expired (deleted bigint NOT NULL)');
$node->safe_psql('postgres', "ALTER SYSTEM SET idempotency.expire_interval = '1s'");
$node->reload;

my $dir = PostgreSQL::Test::Utils::tempdir();
my $retry = qq{
\\set k random(1, $keys)
SET idempotency.ttl = '$ttl_ms milliseconds';
SELECT attempt(current_user || '-' || :k || '-' || floor(extract(epoch FROM clock_timestamp()) / $bucket_seconds)::bigint);
\\sleep 2 ms
};
PostgreSQL::Test::Utils::append_to_file("$dir/retry.sql", $retry);
# The superuser's keys, under the window it sets in its session.
PostgreSQL::Test::Utils::append_to_file("$dir/retry_superuser.sql",
	"SET idempotency.remember = '20 min';\n" . $retry);
PostgreSQL::Test::Utils::append_to_file("$dir/expire.sql", q{
SET idempotency.remember = 0;
INSERT INTO expired SELECT idempotency.expire();
\sleep 400 ms
});

my $storm_deadline = time + $max_seconds;
my $done_flag = "$dir/done";
my $start = sub {
	my ($name, $script, $user, $more) = @_;
	my $connstr = $node->connstr('storm') . ($user ? " user=$user" : '');
	return pgbench_client(
		node => $node, db => 'storm', dir => $dir, name => $name,
		mode => 'extended', script => $script, deadline => $storm_deadline,
		more => $more, connstr => $connstr);
};
my $expirer = $start->('expire', 'expire.sql', undef, sub { -e $done_flag ? 0 : 2 });
my %clients = (
	long_role => 'retry.sql',
	local_role => 'retry.sql',
	zero_role => 'retry.sql',
	superuser => 'retry_superuser.sql');
my @pids;
for my $client (sort keys %clients)
{
	my $left = $quota;
	push @pids,
	  $start->($client, $clients{$client}, $client eq 'superuser' ? undef : $client,
		sub { $left -= $_[0] if @_; return $left > 50 ? 50 : $left });
}
waitpid($_, 0) for @pids;
open my $flag, '>', $done_flag or die "$done_flag: $!";
close $flag;
waitpid($expirer, 0);
my @errors = map { pgbench_client_errors($dir, $_) } ('expire', sort keys %clients);
is(scalar @errors, 0, 'storm: no retry met an error')
  or diag(join("\n", grep { defined } @errors[ 0 .. 9 ]));

my $superuser = $node->safe_psql('storm', 'SELECT current_user');
my $remembering = "role IN ('long_role', 'local_role', '$superuser')";

# The checker: every key of a role that remembers longer than the storm and
# ran more than once.
sub ran_twice
{
	return [ split /\n/, $node->safe_psql(
		'storm', "SELECT key FROM runs WHERE $remembering
		           GROUP BY key HAVING count(*) > 1 ORDER BY key") ];
}
my $count = sub { $node->safe_psql('storm', $_[0]) };

note('storm: '
	  . join(', ', map { "$_ " . $count->("SELECT count(*) FROM answers WHERE answer = '$_'") }
		  qw(ran replayed IK410))
	  . ', expire() deleted ' . $count->('SELECT coalesce(sum(deleted), 0) FROM expired'));
is_deeply(ran_twice(), [], 'storm: no request of a remembering role ran twice');
for my $role ('long_role', 'local_role', $superuser)
{
	cmp_ok($count->("SELECT count(*) FROM answers WHERE role = '$role' AND answer = 'IK410'"),
		'>=', 20, "storm: $role got IK410 for late retries");
	cmp_ok($count->("SELECT count(*) FROM answers WHERE role = '$role' AND answer = 'replayed'"),
		'>=', 20, "storm: $role got replays of live responses");
}
is($count->("SELECT count(*) FROM answers WHERE role = 'zero_role' AND answer = 'IK410'"),
	0, 'storm: zero_role, remembering nothing, never got IK410');
cmp_ok($count->(
		"SELECT count(*) FROM (SELECT key FROM runs WHERE role = 'zero_role'
		  GROUP BY key HAVING count(*) > 1) AS again"),
	'>=', 1, 'storm: zero_role ran expired keys again, as remember 0 says');
cmp_ok($count->('SELECT coalesce(sum(deleted), 0) FROM expired'),
	'>=', 1, "storm: the superuser's expire() converted keys meanwhile");
# Which of the two converts a key is a race; the worker ran its rounds.
cmp_ok($count->(
		"SELECT coalesce(sum(rounds), 0) FROM idempotency.expiry_status WHERE datname = 'storm'"),
	'>=', 1, 'storm: the worker ran rounds meanwhile');
note('storm: the worker deleted '
	  . $count->("SELECT coalesce(sum(total_deleted), 0) FROM idempotency.expiry_status WHERE datname = 'storm'"));

# The checker flags a double run: a second ledger row for one key, written
# past the extension.
my $planted = $count->("SELECT key FROM runs WHERE role = 'long_role' ORDER BY run LIMIT 1");
$node->safe_psql('storm', "INSERT INTO runs (key, role) VALUES ('$planted', 'long_role')");
is_deeply(ran_twice(), [$planted], 'the checker flags a planted double run');

$node->stop;
done_testing();
