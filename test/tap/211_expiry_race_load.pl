# Expiry racing replays under load: keys that live 300 ms, called again and
# again by concurrent clients while another client deletes expired keys in a
# loop. A key replays while it lives and runs again only once it has
# expired, never earlier; every answer is a response its key committed;
# every run is answered once as a run.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;

use FindBin;
use lib $FindBin::RealBin;
use IdempotencyTest;

my $ttl_ms = 300;
my $node = preloaded_node('expiry_race_load', conf => "idempotency.expire_interval = 0\nidempotency.remember = 0\n");
$node->safe_psql(
	'postgres', qq{
CREATE EXTENSION idempotency;
ALTER DATABASE postgres SET idempotency.ttl = '$ttl_ms milliseconds';
ALTER DATABASE postgres SET idempotency.wait_timeout = '30s';
CREATE SCHEMA ex;
-- One row per committed run of fn, with the time fn ran.
CREATE TABLE ex.runs (run bigserial PRIMARY KEY, key text NOT NULL,
                      at timestamptz NOT NULL DEFAULT clock_timestamp());
-- One row per answer a client got, committed with the call.
CREATE TABLE ex.answers (key text NOT NULL, response jsonb NOT NULL, replayed bool NOT NULL);
CREATE TABLE ex.expired (deleted bigint NOT NULL);
CREATE FUNCTION ex.run(key text) RETURNS jsonb LANGUAGE sql AS \$\$
  INSERT INTO ex.runs (key) VALUES (key) RETURNING jsonb_build_object('key', key, 'run', run)
\$\$;
});

my $dir = PostgreSQL::Test::Utils::tempdir();
PostgreSQL::Test::Utils::append_to_file("$dir/call.sql", q{
\set k random(1, 8)
BEGIN;
SELECT idempotency.idempotent_call('ex-' || :k, NULL, 'SELECT ex.run($1)', 'ex-' || :k)::text AS response,
       idempotency.last_call_replayed() AS replayed \gset
INSERT INTO ex.answers VALUES ('ex-' || :k, :response, :replayed);
COMMIT;
});
PostgreSQL::Test::Utils::append_to_file("$dir/expire.sql", q{
INSERT INTO ex.expired SELECT idempotency.expire();
\sleep 20 ms
});

# Calls and expiry for 8 s; a call whose key expires before its COMMIT
# fails with 40001, which pgbench retries.
my @bench = ($node->installed_command('pgbench'), '-n', '-M', 'extended', '-T', '8');
my ($call_out, $call_err, $expire_out, $expire_err) = ('', '', '', '');
my $calls = IPC::Run::start(
	[ @bench, '-c', '4', '-j', '2', '--max-tries=20', '-f', "$dir/call.sql", $node->connstr('postgres') ],
	'>', \$call_out, '2>', \$call_err);
my $expiry = IPC::Run::start([ @bench, '-c', '1', '-f', "$dir/expire.sql", $node->connstr('postgres') ],
	'>', \$expire_out, '2>', \$expire_err);
ok($calls->finish, 'the callers ran without an error') or diag("pgbench: $call_out $call_err");
ok($expiry->finish, 'the expiry loop ran without an error') or diag("pgbench: $expire_out $expire_err");

my $query = sub { $node->safe_psql('postgres', $_[0]) };
note 'runs: ' . $query->('SELECT count(*) FROM ex.runs') . ', answers: '
  . $query->('SELECT count(*) FROM ex.answers') . ', replays: '
  . $query->('SELECT count(*) FROM ex.answers WHERE replayed') . ', deleted by expiry: '
  . $query->('SELECT sum(deleted) FROM ex.expired');

# The race was run: keys replayed, ran again after expiring, and expiry
# deleted keys meanwhile.
cmp_ok($query->('SELECT count(*) FROM ex.answers WHERE replayed'), '>=', 20, 'keys replayed');
cmp_ok($query->('SELECT count(*) - count(DISTINCT key) FROM ex.runs'), '>=', 20,
	'keys ran again once expired');
cmp_ok($query->('SELECT sum(deleted) FROM ex.expired'), '>=', 1, 'expiry deleted keys meanwhile');

# A key runs again only once the run before it has expired: the row is
# written after fn, so the next run can start no earlier than the TTL after
# the last one's fn.
is( $query->(qq{
SELECT count(*) FROM (
  SELECT at - lag(at) OVER (PARTITION BY key ORDER BY run) AS gap FROM ex.runs) AS g
 WHERE gap < interval '$ttl_ms milliseconds'}),
	'0', 'no key ran again while it lived');
is( $query->(q{
SELECT count(*) FROM ex.answers AS a
 WHERE NOT EXISTS (SELECT FROM ex.runs AS r
                    WHERE r.key = a.key AND r.run = (a.response ->> 'run')::bigint)}),
	'0', 'every answer is a response its key committed');
is( $query->(q{
SELECT count(*) FROM ex.runs AS r
 WHERE (SELECT count(*) FROM ex.answers AS a
         WHERE NOT a.replayed AND (a.response ->> 'run')::bigint = r.run) <> 1}),
	'0', 'every run was answered once as a run');
is($query->('SELECT count(*) FROM ex.answers WHERE NOT replayed'),
	$query->('SELECT count(*) FROM ex.runs'), 'and no answer that ran is without its run');

$node->stop;
done_testing();
