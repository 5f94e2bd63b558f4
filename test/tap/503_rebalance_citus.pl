# A shard rebalance while callers run: a coordinator and two workers on
# localhost, tenant keys (idempotency.tenant_keys) co-located with the
# accounts. Every shard starts on the first worker; the second joins and
# citus_rebalance_start() moves half of the shard groups to it while four
# clients call, half of them inside their own BEGIN ... COMMIT (the
# delegated call then runs in the client's transaction). What a DBA may
# expect of a rebalance:
#
# - no client ever sees another error than 40001 (pgbench retries those
#   and aborts a client on any other): never the off-node refusal, never
#   "cannot execute a distributed query from a query on a shard";
# - every request, retried or not, ran once and its key is on its tenant's
#   node, beside the account, after the rebalance: key by key, fn ran once
#   for each stored key (withdraw_for records the key it ran for in
#   ledger), for no other, and the stored response is the first answer the
#   clients got for the key (each client records every answer it gets, in
#   answers), as is every later answer; a planted extra withdrawal for one
#   key and a planted change to another key's stored response are flagged
#   on those two keys and no other;
# - every key replays its stored response afterwards, byte for byte the
#   clients' first answer, running nothing for any key.
#
# Needs Citus; without it the file says so and is skipped. CITUS_TEST_PORT,
# when set, is the first of nine TCP ports (this file uses the last three;
# 501 and 502 the six before).
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);

use FindBin;
use lib $FindBin::RealBin;
use IdempotencyTest;

my $missing = citus_missing();
plan skip_all => $missing if $missing;

# Only the first worker joins now: every shard starts there.
my ($coordinator, @workers) = citus_cluster(slot => 2, shard_moves => 1, added => 1);

# pay() is delegated to the tenant's worker, in a transaction block too
# (force_delegation).
$coordinator->safe_psql('postgres', 'CREATE ROLE app LOGIN');
# ledger: one row per run of fn, with the key it ran for; answers: every
# answer a client got (start_paying_clients). Both co-located with the
# accounts, so that a delegated call and a client's block stay on the
# tenant's node, and moved with them.
$coordinator->safe_psql('postgres',
	tenant_accounts_sql(shard_count => 8, balance => 100000, callers => 'app')
	  . "SELECT idempotency.distribute_keys('accounts');\n" . q{
CREATE TABLE ledger (tenant bigint NOT NULL, key text NOT NULL);
SELECT create_distributed_table('ledger', 'tenant', colocate_with => 'accounts');
CREATE TABLE answers (tenant bigint NOT NULL, key text NOT NULL, answer jsonb NOT NULL,
                      answered_at timestamptz NOT NULL DEFAULT clock_timestamp());
SELECT create_distributed_table('answers', 'tenant', colocate_with => 'accounts');
GRANT INSERT ON ledger, answers TO app;
CREATE FUNCTION withdraw_for(account bigint, key text, amount bigint, pause float8)
RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO ledger VALUES (account, key);
  RETURN withdraw(account, amount, pause);
END $$;
} . delegated_pay_sql(ledger => 1));
citus_add_workers($coordinator, $workers[1]);
# Two clients may send one key at once: the second waits for the first and
# replays (wait_timeout, set for the role on every node, where the
# delegated calls run).
role_setting_on_nodes([ $coordinator, @workers ], 'app', "idempotency.wait_timeout = '10s'");

my $placements_on_second = q{SELECT count(*) FROM citus_shards
  WHERE table_name = 'idempotency.tenant_keys'::regclass AND nodeport = }
  . $workers[1]->port;
is($coordinator->safe_psql('postgres', $placements_on_second),
	'0', 'every shard starts on the first worker');

# Keys rb-1 .. rb-20000 picked at random (some are retries), the tenant
# derived from the key; half of the calls inside BEGIN ... COMMIT.
my ($pgbench, $bench_out, $bench_err) = start_paying_clients($coordinator,
	prefix => 'rb', keys => 20000, tenants => 40, pause => 0.01, seconds => 25,
	max_tries => 100, answers => 1);
usleep(3_000_000);
my $started = $coordinator->safe_psql('postgres', 'SELECT clock_timestamp()');
$coordinator->safe_psql('postgres',
	q{SELECT citus_rebalance_start(shard_transfer_mode => 'force_logical')});
$coordinator->safe_psql('postgres', 'SELECT citus_rebalance_wait()');
my $finished = $coordinator->safe_psql('postgres', 'SELECT clock_timestamp()');
$pgbench->finish;
note "pgbench: $$bench_out $$bench_err";

is( $coordinator->safe_psql('postgres', q{
SELECT state FROM pg_dist_background_job ORDER BY job_id DESC LIMIT 1}),
	'finished', 'the rebalance finished');
cmp_ok($coordinator->safe_psql('postgres', $placements_on_second),
	'>', 0, 'it moved shards to the second worker');
unlike($$bench_err, qr/aborted/,
	'no client saw another error than 40001 (pgbench retries only those)');
like($$bench_out, qr/number of failed transactions: 0 /,
	'and every request succeeded on retry');
cmp_ok(
	$coordinator->safe_psql('postgres', qq{
SELECT count(*) FROM idempotency.tenant_keys
 WHERE key LIKE 'rb-%' AND created_at BETWEEN '$started' AND '$finished'}),
	'>', 0, 'requests were stored while the rebalance ran');

# Every stored rb- key ran once, and sits on its tenant's node.
my $withdrawals = q{SELECT sum(withdrawals) FROM accounts};
my $keys = q{SELECT count(*) FROM idempotency.tenant_keys WHERE key LIKE 'rb-%'};
is($coordinator->safe_psql('postgres', $withdrawals),
	$coordinator->safe_psql('postgres', $keys),
	'as many withdrawals as keys');

# Key by key, what is wrong with it, one 'key: problem' a line, '' when
# nothing is: fn ran other than once for a stored key, or ran for a key
# not stored; the stored response is not the first answer the clients got
# for the key, or some answer the clients got differs from it; an answer
# for a key not stored.
my $per_key_problems = q{
WITH s AS MATERIALIZED (
  SELECT tenant, key, response::text AS response FROM idempotency.tenant_keys
   WHERE key LIKE 'rb-%'),
r AS MATERIALIZED (
  SELECT tenant, key, count(*) AS runs FROM ledger WHERE key LIKE 'rb-%' GROUP BY tenant, key),
a AS MATERIALIZED (
  SELECT tenant, key, answer::text AS answer, answered_at FROM answers WHERE key LIKE 'rb-%'),
f AS MATERIALIZED (
  SELECT DISTINCT ON (tenant, key) tenant, key, answer FROM a ORDER BY tenant, key, answered_at),
p (key, problem) AS (
  SELECT key, CASE WHEN s.key IS NULL THEN 'ran ' || r.runs || ' times, not stored'
                   ELSE 'ran ' || coalesce(r.runs, 0) || ' times' END
    FROM s FULL JOIN r USING (tenant, key)
   WHERE s.key IS NULL OR r.runs IS DISTINCT FROM 1
  UNION ALL
  SELECT key, CASE WHEN s.key IS NULL THEN 'answered, not stored'
                   WHEN f.key IS NULL THEN 'stored, never answered'
                   ELSE 'stored response is not the first answer' END
    FROM s FULL JOIN f USING (tenant, key)
   WHERE s.response IS DISTINCT FROM f.answer
  UNION
  SELECT key, 'an answer the clients got differs from the stored response'
    FROM s JOIN a USING (tenant, key) WHERE a.answer <> s.response)
SELECT string_agg(key || ': ' || problem, E'\n' ORDER BY key, problem) FROM p};
is($coordinator->safe_psql('postgres', $per_key_problems),
	'', 'key by key: fn ran once for each stored key and for no other, and every '
	  . 'answer the clients got for a key is its stored response');
is( $coordinator->safe_psql('postgres', q{
SELECT count(*) FROM generate_series(1, 40) AS t
 WHERE (SELECT nodeport FROM citus_shards
         WHERE shardid = get_shard_id_for_distribution_column('idempotency.tenant_keys', t))
    <> (SELECT nodeport FROM citus_shards
         WHERE shardid = get_shard_id_for_distribution_column('accounts', t))}),
	'0', "every tenant's keys are on its account's node");

# The first answer the clients got for each stored key, in the order
# replay_stored_keys answers.
my $first_answers = $coordinator->safe_psql('postgres', q{
WITH f AS MATERIALIZED (
  SELECT DISTINCT ON (tenant, key) tenant, key, answer FROM answers
   WHERE key LIKE 'rb-%' ORDER BY tenant, key, answered_at)
SELECT f.answer FROM f JOIN idempotency.tenant_keys AS k USING (tenant, key)
 ORDER BY key});
my $runs_by_key = q{
SELECT string_agg(key || '=' || runs, ',' ORDER BY key)
  FROM (SELECT key, count(*) AS runs FROM ledger GROUP BY key) AS r};
my $runs_before_replays = $coordinator->safe_psql('postgres', $runs_by_key);
my $before_replays = $coordinator->safe_psql('postgres', $withdrawals);
my ($stored_responses, $replayed) =
  replay_stored_keys($coordinator, prefix => 'rb', tenants => 40, pause => 0.01);
is($replayed, $stored_responses,
	'every key replays its stored response after the rebalance');
is($replayed, $first_answers, "byte for byte the clients' first answer for it");
is($coordinator->safe_psql('postgres', $runs_by_key),
	$runs_before_replays, 'and the replays ran nothing, for any key');
is($coordinator->safe_psql('postgres', $withdrawals),
	$before_replays, 'nor withdrew anything');

# Controls: an extra withdrawal planted for one key, another key's stored
# response changed; the per-key check flags those two keys, no other.
my ($extra_run, $changed) = split /\n/, $coordinator->safe_psql('postgres', q{
SELECT key FROM idempotency.tenant_keys WHERE key LIKE 'rb-%' ORDER BY key LIMIT 2});
my $tenant_of = sub { my ($k) = $_[0] =~ /^rb-(\d+)$/; return 1 + $k % 40 };
$coordinator->safe_psql('postgres', sprintf(q{
INSERT INTO ledger VALUES (%d, '%s');
UPDATE idempotency.tenant_keys SET response = response || '{"planted": true}'
 WHERE tenant = %d AND key = '%s'},
	$tenant_of->($extra_run), $extra_run, $tenant_of->($changed), $changed));
is( $coordinator->safe_psql('postgres', $per_key_problems),
	"$extra_run: ran 2 times\n"
	  . "$changed: an answer the clients got differs from the stored response\n"
	  . "$changed: stored response is not the first answer",
	'control: a planted extra withdrawal and a changed stored response are flagged '
	  . 'on their keys only');

$_->stop for ($coordinator, @workers);
done_testing();
