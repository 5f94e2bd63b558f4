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

# Only the first worker joins now: every shard starts there.
my ($coordinator, @workers) = citus_cluster(slot => 2, shard_moves => 1, added => 1);

# pay() is delegated to the tenant's worker, in a transaction block too
# (force_delegation).
$coordinator->safe_psql('postgres', 'CREATE ROLE app LOGIN');
$coordinator->safe_psql('postgres',
	tenant_accounts_sql(shard_count => 8, balance => 100000, callers => 'app')
	  . "SELECT idempotency.distribute_keys('accounts');\n"
	  . delegated_pay_sql());
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
	max_tries => 100);
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
	'every withdrawal has its key, none ran twice');
is( $coordinator->safe_psql('postgres', q{
SELECT count(*) FROM generate_series(1, 40) AS t
 WHERE (SELECT nodeport FROM citus_shards
         WHERE shardid = get_shard_id_for_distribution_column('idempotency.tenant_keys', t))
    <> (SELECT nodeport FROM citus_shards
         WHERE shardid = get_shard_id_for_distribution_column('accounts', t))}),
	'0', "every tenant's keys are on its account's node");

my $before_replays = $coordinator->safe_psql('postgres', $withdrawals);
my ($stored_responses, $replayed) =
  replay_stored_keys($coordinator, prefix => 'rb', tenants => 40, pause => 0.01);
is($replayed, $stored_responses,
	'every key replays its stored response after the rebalance');
is($coordinator->safe_psql('postgres', $withdrawals),
	$before_replays, 'and the replays ran nothing');

$_->stop for ($coordinator, @workers);
done_testing();
