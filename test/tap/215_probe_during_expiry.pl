# A key looked up at the instant expiry turns it into a tombstone. A call
# reads a key's index entries a page at a time and their rows after: when
# expiry deletes the live row and inserts the tombstone, and commits, in
# between, the scan holds the live row's entry, whose row is gone, and not
# the tombstone's. Nothing found, the key would pass for new: a retry would
# run its request again and fail on the key's primary key (23505), and
# lookup() would say 'absent'.
#
# One client makes keys that live a few milliseconds and turns each into a
# tombstone at once with expire(), publishing each committed key; others
# look the newest key up and retry its request meanwhile. Every lookup must
# find the key, and every retry be a replay or IK410.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);

use FindBin;
use lib $FindBin::RealBin;
use IdempotencyTest;

my $seconds = 15;

my $node = preloaded_node('probe_during_expiry',
	conf => "idempotency.expire_interval = 0\nlog_min_messages = warning\n");
$node->safe_psql(
	'postgres', q{
CREATE EXTENSION idempotency;
ALTER DATABASE postgres SET idempotency.remember = '1 hour';
CREATE SEQUENCE serial;
-- The newest key whose call committed.
CREATE TABLE published (key text NOT NULL);
INSERT INTO published VALUES ('none yet');
-- The business write: one row per run of a key's request.
CREATE TABLE runs (key text NOT NULL);
CREATE FUNCTION pay(key text) RETURNS text LANGUAGE sql
  AS $$ INSERT INTO runs VALUES (key) RETURNING key $$;
-- A lookup that did not find a committed key (expiry deleting it while it
-- is live by the lookup's clock is 'in_progress').
CREATE TABLE missed (key text NOT NULL, answer text NOT NULL);
CREATE FUNCTION retry() RETURNS void LANGUAGE plpgsql AS $$
DECLARE
  published_key text := (SELECT key FROM published);
BEGIN
  IF published_key = 'none yet' THEN
    RETURN;
  END IF;
  -- A new key first: a call after a new key claims before it looks, and
  -- then looks once.
  PERFORM idempotency.idempotent_call('new-' || nextval('serial'), NULL, 'SELECT 1');
  PERFORM idempotency.idempotent_call(published_key, NULL, 'SELECT pay($1)',
                                      published_key);
EXCEPTION WHEN SQLSTATE 'IK410' THEN
  NULL;
END $$;
});

my $dir = PostgreSQL::Test::Utils::tempdir();
PostgreSQL::Test::Utils::append_to_file(
	"$dir/convert.sql", q{
SET idempotency.ttl = '3 ms';
BEGIN;
SELECT idempotency.idempotent_call('key-' || nextval('serial'), NULL, 'SELECT pay($1)', 'key-' || currval('serial'));
UPDATE published SET key = 'key-' || currval('serial');
COMMIT;
\sleep 4 ms
SELECT idempotency.expire();
});
PostgreSQL::Test::Utils::append_to_file(
	"$dir/look.sql", q{
INSERT INTO missed
SELECT p.key, l.state FROM published AS p, LATERAL idempotency.lookup(p.key) AS l
 WHERE p.key <> 'none yet' AND l.state IN ('absent', 'expired');
});
PostgreSQL::Test::Utils::append_to_file("$dir/retry.sql", "SELECT retry();\n");

my $deadline = time + $seconds;
# Name, script, transactions a pgbench run.
my @clients = (
	[ 'convert', 'convert.sql', 50 ],
	[ 'look', 'look.sql', 2000 ],
	[ 'retry-1', 'retry.sql', 1000 ],
	[ 'retry-2', 'retry.sql', 1000 ]);
my @pids = map {
	my $client = $_;
	pgbench_client(
		node => $node, db => 'postgres', dir => $dir,
		name => $client->[0], mode => 'simple', script => $client->[1],
		deadline => $deadline, more => sub { $client->[2] })
} @clients;
waitpid($_, 0) for @pids;

my @errors = map { pgbench_client_errors($dir, $_->[0]) } @clients;
is(scalar @errors, 0, 'no client met an error (a retry of a key never 23505)')
  or diag(join("\n", grep { defined } @errors[ 0 .. 9 ]));

my $count = sub { $node->safe_psql('postgres', $_[0]) };
my $tombstones = $count->('SELECT count(*) FROM idempotency.keys WHERE expired_at IS NOT NULL');
note("tombstones written: $tombstones");
cmp_ok($tombstones, '>=', 100, 'expire() turned keys into tombstones meanwhile');
is($count->('SELECT count(*) FROM missed'), 0,
	'every lookup of a committed key found it')
  or diag($count->('SELECT key, answer FROM missed LIMIT 10'));
is($count->('SELECT count(*) FROM (SELECT key FROM runs GROUP BY key HAVING count(*) > 1) AS again'),
	0, "each key's request ran once");

$node->stop;
done_testing();
