# A Citus cluster whose tenant keys the 0.7 library stored (test/old-release.sh)
# moves to the current library and updates: until ALTER EXTENSION UPDATE the
# current library serves the 0.7 tables as they are (tenant keys replay,
# expiry deletes expired ones); the update, run on the coordinator, reaches
# every node, adds expired_at to the distributed idempotency.tenant_keys and
# every shard, keeps every key byte for byte, and from then on a tenant key
# whose response expires leaves a tombstone that refuses a late retry
# (IK410); idempotency.stats counts live tenant keys and tombstones apart.
#
# Needs Citus; without it the file says so and is skipped.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use FindBin;
use lib $FindBin::RealBin;
use IdempotencyTest;

my $missing = citus_missing();
plan skip_all => $missing if $missing;

my $conf = "idempotency.expire_interval = 0\n";
my ($old_coordinator, @old_workers) = citus_cluster(
	slot => 6,
	conf => $conf,
	install_path => old_release_install_path('0.7'));
$old_coordinator->safe_psql('postgres',
	tenant_accounts_sql(shard_count => 4, balance => 1000)
	  . q{SELECT idempotency.distribute_keys('accounts');});
is($old_coordinator->safe_psql('postgres',
		q{SELECT extversion FROM pg_extension WHERE extname = 'idempotency'}),
	'0.7', 'the cluster is at 0.7, with the 0.7 library');

my $tenant = 1;
# Tenant calls are made on the worker that holds the tenant.
my $shard = $old_coordinator->safe_psql('postgres',
	"SELECT get_shard_id_for_distribution_column('idempotency.tenant_keys', $tenant)");
my $home_port = $old_coordinator->safe_psql('postgres',
	"SELECT nodeport FROM citus_shards WHERE shardid = $shard");
my ($old_home) = grep { $_->port == $home_port } @old_workers;

sub call_sql
{
	my ($key, $amount) = @_;
	return "SELECT idempotency.tenant_call(${tenant}::bigint, '$key', NULL, "
	  . "'SELECT withdraw(\$1, \$2)', ${tenant}::bigint, ${amount}::bigint)";
}

# Two keys the 0.7 library stores: one that stays live, one whose response
# expires after the update.
my %first;
for my $key ('kept', 'late')
{
	$first{$key} = $old_home->safe_psql('postgres', call_sql($key, 1));
	like($first{$key}, qr/"balance"/, "0.7: tenant key '$key' runs");
}
my $rows_query = q{SELECT key, request_hash, response, created_at, expires_at
  FROM idempotency.tenant_keys ORDER BY key};
my $rows_before = $old_coordinator->safe_psql('postgres', $rows_query);

# Every node on its data directory and port (Citus knows the nodes by port),
# now with the current library.
sub reopen_on_same_port
{
	my ($old, $name) = @_;
	$old->stop;
	my $node = PostgreSQL::Test::Cluster->new($name, port => $old->port);
	rename($old->data_dir, $node->data_dir)
	  or die "cannot move " . $old->data_dir . ": $!";
	$node->start;
	return $node;
}
my @workers = map { reopen_on_same_port($old_workers[$_], "current_worker$_") } (0, 1);
my $coordinator = reopen_on_same_port($old_coordinator, 'current_coordinator');
my ($home) = grep { $_->port == $home_port } @workers;

sub withdrawals
{
	return $coordinator->safe_psql('postgres',
		"SELECT withdrawals FROM accounts WHERE tenant = $tenant");
}
my $ran = withdrawals();

# --- the current library on the 0.7 tables ---------------------------------------
is($home->safe_psql('postgres', call_sql('kept', 1)), $first{kept},
	'before the update: the tenant key replays its stored response');
is(withdrawals(), $ran, '... without running again');

# --- the update -------------------------------------------------------------------
$coordinator->safe_psql('postgres', 'ALTER EXTENSION idempotency UPDATE');
my $version = $coordinator->safe_psql('postgres',
	q{SELECT extversion FROM pg_extension WHERE extname = 'idempotency'});
isnt($version, '0.7', "the coordinator is past 0.7 ($version)");
is( $coordinator->safe_psql('postgres', q{
SELECT string_agg(DISTINCT result, ',') FROM run_command_on_workers(
  $$SELECT extversion FROM pg_extension WHERE extname = 'idempotency'$$)}),
	$version, 'so is every worker');
is( $coordinator->safe_psql('postgres', q{
SELECT format_type(atttypid, atttypmod) FROM pg_attribute
 WHERE attrelid = 'idempotency.tenant_keys'::regclass AND attname = 'expired_at'}),
	'timestamp with time zone', 'idempotency.tenant_keys has expired_at');
is( $coordinator->safe_psql('postgres', q{
SELECT count(*), bool_and(success AND result = 'timestamp with time zone')
  FROM run_command_on_shards('idempotency.tenant_keys',
    $$SELECT format_type(atttypid, atttypmod) FROM pg_attribute
       WHERE attrelid = '%s'::regclass AND attname = 'expired_at'$$)}),
	'4|t', '... and so has each of its four shards');
is($coordinator->safe_psql('postgres', $rows_query), $rows_before,
	'every tenant key kept byte for byte');
is($home->safe_psql('postgres', call_sql('kept', 1)), $first{kept},
	'after the update: the tenant key replays');
is(withdrawals(), $ran, '... without running again');

# --- tombstones from now on ------------------------------------------------------
$coordinator->safe_psql('postgres', qq{
UPDATE idempotency.tenant_keys SET created_at = now() - interval '2 hours',
       expires_at = now() - interval '1 hour' WHERE tenant = $tenant AND key = 'late'});
is($coordinator->safe_psql('postgres', 'SELECT idempotency.expire()'), '1',
	"expiry on the coordinator takes 'late', stored by 0.7");
is( $coordinator->safe_psql('postgres', q{
SELECT key = '', response IS NULL, expired_at IS NOT NULL FROM idempotency.tenant_keys
 WHERE expired_at IS NOT NULL}),
	't|t|t', '... and leaves its tombstone');
is(sqlstate_of($home, call_sql('late', 1)), 'IK410',
	'a late retry of its request is refused (IK410)');
is(sqlstate_of($home, call_sql('late', 2)), 'IK422', '... another request IK422');
is(withdrawals(), $ran, 'nothing ran again');
is( $coordinator->safe_psql('postgres', q{
SELECT keys, tombstones FROM idempotency.stats WHERE datname = current_database()}),
	'1|1', 'idempotency.stats: one live tenant key, one tenant tombstone');
like($home->safe_psql('postgres', call_sql('new', 1)), qr/"balance"/, 'a new key runs');
is(withdrawals(), $ran + 1, 'once');

$coordinator->stop;
$_->stop for @workers;
done_testing();
