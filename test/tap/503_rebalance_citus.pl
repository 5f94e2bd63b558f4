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
#   node, beside the account, after the rebalance;
# - every key replays its stored response afterwards, running nothing.
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

my $port_base = $ENV{CITUS_TEST_PORT};
my $worker_conf =
  "wal_level = logical\nmax_wal_senders = 10\nmax_replication_slots = 10\n";
my $coordinator =
  citus_node('coordinator', defined $port_base ? $port_base + 6 : undef);
my @workers = map {
	citus_node("worker$_", defined $port_base ? $port_base + 6 + $_ : undef,
		$worker_conf)
} (1, 2);

$coordinator->safe_psql('postgres',
	"SELECT citus_set_coordinator_host('127.0.0.1', " . $coordinator->port . ')');
$coordinator->safe_psql('postgres',
	"SELECT citus_add_node('127.0.0.1', " . $workers[0]->port . ')');

# withdraw counts its runs in the row it changes: withdrawals is how often
# the operation ran for that tenant. pay() is delegated to the tenant's
# worker, in a transaction block too (force_delegation).
$coordinator->safe_psql(
	'postgres', q{
CREATE EXTENSION idempotency;
CREATE ROLE app LOGIN;
SET citus.shard_count = 8;
CREATE TABLE accounts (tenant bigint PRIMARY KEY, balance bigint NOT NULL,
                       withdrawals int NOT NULL DEFAULT 0);
SELECT create_distributed_table('accounts', 'tenant');
INSERT INTO accounts SELECT g, 100000 FROM generate_series(1, 40) g;
GRANT SELECT, UPDATE ON accounts TO app;
CREATE FUNCTION withdraw(account bigint, amount bigint, pause float8) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
  left_over bigint;
BEGIN
  UPDATE accounts SET balance = balance - amount, withdrawals = withdrawals + 1
   WHERE tenant = account RETURNING balance INTO left_over;
  PERFORM pg_sleep(pause);
  RETURN jsonb_build_object('tenant', account, 'balance', left_over);
END $$;
SELECT idempotency.distribute_keys('accounts');
CREATE FUNCTION pay(tenant bigint, key text, amount bigint, pause float8 DEFAULT 0)
RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
  RETURN idempotency.tenant_call(tenant, key, NULL,
    'SELECT withdraw($1, $2, $3)', tenant, amount, pause);
END $$;
SELECT create_distributed_function('pay(bigint,text,bigint,float8)', 'tenant',
  colocate_with => 'idempotency.tenant_keys', force_delegation => true);
});
$coordinator->safe_psql('postgres',
	"SELECT citus_add_node('127.0.0.1', " . $workers[1]->port . ')');
# Two clients may send one key at once: the second waits for the first and
# replays (wait_timeout, set for the role on every node, where the
# delegated calls run).
$_->safe_psql('postgres',
	q{SET citus.enable_ddl_propagation = off; ALTER ROLE app SET idempotency.wait_timeout = '10s'})
  for ($coordinator, @workers);

my $placements_on_second = q{SELECT count(*) FROM citus_shards
  WHERE table_name = 'idempotency.tenant_keys'::regclass AND nodeport = }
  . $workers[1]->port;
is($coordinator->safe_psql('postgres', $placements_on_second),
	'0', 'every shard starts on the first worker');

# Keys rb-1 .. rb-20000 picked at random (some are retries), the tenant
# derived from the key; half of the calls inside BEGIN ... COMMIT.
my $script = $coordinator->basedir . '/rebalance.sql';
PostgreSQL::Test::Utils::append_to_file($script, q{
\set k random(1, 20000)
\set t 1 + :k % 40
SELECT pay(:t, 'rb-' || :k, 1, 0.01);
});
my $block_script = $coordinator->basedir . '/rebalance_block.sql';
PostgreSQL::Test::Utils::append_to_file($block_script, q{
\set k random(1, 20000)
\set t 1 + :k % 40
BEGIN;
SELECT pay(:t, 'rb-' || :k, 1, 0.01);
COMMIT;
});
my $pgbench = IPC::Run::start(
	[
		'pgbench', '-n', '-h', $coordinator->host, '-p', $coordinator->port,
		'-U', 'app', '-c', '4', '-j', '2', '-T', '25', '--max-tries=100',
		'-f', $script, '-f', $block_script, 'postgres'
	],
	'>', \my $bench_out, '2>', \my $bench_err);
usleep(3_000_000);
my $started = $coordinator->safe_psql('postgres', 'SELECT clock_timestamp()');
$coordinator->safe_psql('postgres',
	q{SELECT citus_rebalance_start(shard_transfer_mode => 'force_logical')});
$coordinator->safe_psql('postgres', 'SELECT citus_rebalance_wait()');
my $finished = $coordinator->safe_psql('postgres', 'SELECT clock_timestamp()');
$pgbench->finish;
note "pgbench: $bench_out $bench_err";

is( $coordinator->safe_psql('postgres', q{
SELECT state FROM pg_dist_background_job ORDER BY job_id DESC LIMIT 1}),
	'finished', 'the rebalance finished');
cmp_ok($coordinator->safe_psql('postgres', $placements_on_second),
	'>', 0, 'it moved shards to the second worker');
unlike($bench_err, qr/aborted/,
	'no client saw another error than 40001 (pgbench retries only those)');
like($bench_out, qr/number of failed transactions: 0 /,
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
	'every withdrawal has its key, none ran twice');
is( $coordinator->safe_psql('postgres', q{
SELECT count(*) FROM generate_series(1, 40) AS t
 WHERE (SELECT nodeport FROM citus_shards
         WHERE shardid = get_shard_id_for_distribution_column('idempotency.tenant_keys', t))
    <> (SELECT nodeport FROM citus_shards
         WHERE shardid = get_shard_id_for_distribution_column('accounts', t))}),
	'0', "every tenant's keys are on its account's node");

# Citus delegates `SELECT pay(...)` alone, not inside a query with FROM:
# one statement per key.
my @stored_keys = split /\n/, $coordinator->safe_psql('postgres', q{
SELECT key FROM idempotency.tenant_keys WHERE key LIKE 'rb-%' ORDER BY key});
my $stored_responses = $coordinator->safe_psql('postgres', q{
SELECT response FROM idempotency.tenant_keys WHERE key LIKE 'rb-%' ORDER BY key});
my $before_replays = $coordinator->safe_psql('postgres', $withdrawals);
my $replayed = $coordinator->safe_psql(
	'postgres',
	join('', map {
		my ($k) = /^rb-(\d+)$/;
		sprintf("SELECT pay(%d, '%s', 1, 0.01);\n", 1 + $k % 40, $_)
	} @stored_keys),
	extra_params => [ '-U', 'app' ]);
is($replayed, $stored_responses,
	'every key replays its stored response after the rebalance');
is($coordinator->safe_psql('postgres', $withdrawals),
	$before_replays, 'and the replays ran nothing');

$_->stop for ($coordinator, @workers);
done_testing();
