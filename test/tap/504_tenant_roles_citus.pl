# A role that has tenant keys (idempotency.tenant_keys, distributed by
# Citus) cannot be dropped until they are gone, on a coordinator and two
# workers on localhost. Each tenant key is written on the worker that holds
# its tenant's shard, inside a call Citus delegates there; Citus runs DROP
# ROLE and DROP OWNED on every node.
#
# - DROP ROLE of a role with tenant keys fails on the coordinator (2BP01,
#   the worker's refusal: "privileges for column scope of table
#   idempotency.tenant_keys") and leaves the role and its keys everywhere.
# - DROP OWNED BY deletes its tenant keys on every node (another role's
#   stay and replay), and DROP ROLE then succeeds on every node. DROP
#   OWNED waits for a transaction storing a tenant key of the role on a
#   worker, and deletes that key too.
# - idempotency.mark_key_roles() on a worker marks the roles that have
#   tenant keys in its shards (a mark lost, as pg_upgrade loses them, comes
#   back) and deletes the tenant keys of roles that no longer exist there.
# - A shard moved to the other worker keeps its role undroppable (the old
#   node's mark stays; mark_key_roles marks it on the new node), and DROP
#   OWNED deletes its rows on the node it moved to.
# - After the move and DROP ROLE (of a role cleared by DROP OWNED, and of
#   one whose marks were lost, whose keys stay in both placements),
#   mark_key_roles on the node the shard left, which still holds the old
#   placement, raises nothing and deletes the old placement's keys of the
#   role gone; a new role of the same name does not replay them (its
#   request runs); new roles of the old names cannot be dropped while they
#   have keys, on either worker, also after another mark_key_roles on the
#   node the shard left.
#
# Needs Citus; without it the file says so and is skipped. CITUS_TEST_PORT,
# when set, is the first of fifteen TCP ports (this file uses the fourth
# three; 501, 502 and 503 the nine before, 505 the last three).
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

# No expiry worker: its rounds would run mark_key_roles, which this file
# runs itself where it checks what it does.
# The old placement of a moved shard stays until the end (no cleanup by the
# maintenance daemon), so that mark_key_roles on the node the shard left
# deterministically meets it.
my ($coordinator, @workers) = citus_cluster(
	slot => 3,
	conf => "idempotency.expire_interval = 0\n",
	coordinator_conf => "citus.defer_shard_delete_interval = -1\n");
my @nodes = ($coordinator, @workers);

# The callers get their rights on accounts through payers: a role that is
# only a member of another owns nothing and holds no privilege, so its
# tenant keys are all that can keep it from being dropped.
$coordinator->safe_psql(
	'postgres', q{
CREATE ROLE payers;
CREATE ROLE alice LOGIN IN ROLE payers;
CREATE ROLE bob LOGIN IN ROLE payers;
CREATE ROLE carol LOGIN IN ROLE payers;
CREATE ROLE dave LOGIN IN ROLE payers;
CREATE ROLE erin LOGIN IN ROLE payers;
});
$coordinator->safe_psql('postgres',
	tenant_accounts_sql(shard_count => 4, balance => 1000, callers => 'payers')
	  . "SELECT idempotency.distribute_keys('accounts');\n"
	  . delegated_pay_sql());

# The worker (its port) that holds a tenant's shard of the keys.
sub node_of_tenant
{
	my ($tenant) = @_;
	return $coordinator->safe_psql(
		'postgres', qq{
SELECT s.nodeport FROM citus_shards AS s
 WHERE s.shardid = get_shard_id_for_distribution_column('idempotency.tenant_keys', $tenant)});
}

# Two tenants on each worker, and the shard of each.
my %tenants_on;
for my $tenant (1 .. 40)
{
	my $port = node_of_tenant($tenant);
	push @{ $tenants_on{$port} }, $tenant
	  if @{ $tenants_on{$port} // [] } < 2;
}
my @tenants = map { @{ $tenants_on{ $_->port } // [] } } @workers;
is(scalar @tenants, 4, 'two tenants on each worker');

# Every call is delegated: a session of `role` on the coordinator, one
# call per statement (Citus delegates a call made alone).
sub pay_as
{
	my ($role, $tenant, $key) = @_;
	return $coordinator->safe_psql('postgres',
		"SET ROLE $role; SELECT pay($tenant, '$key', 1)");
}

sub withdrawals
{
	my ($tenant) = @_;
	return $coordinator->safe_psql('postgres',
		"SELECT withdrawals FROM accounts WHERE tenant = $tenant");
}

for my $tenant (@tenants)
{
	pay_as($_, $tenant, "$_-$tenant") for ('alice', 'bob', 'carol');
}

# How many tenant keys `role` has, by worker (all nodes through Citus).
sub keys_by_node
{
	my ($role) = @_;
	return $coordinator->safe_psql(
		'postgres', qq{
WITH k AS MATERIALIZED (
  SELECT k.tenant FROM idempotency.tenant_keys AS k WHERE k.scope::text = '$role')
SELECT string_agg(n.port || ':' || n.keys, ',' ORDER BY n.port) FROM (
  SELECT s.nodeport AS port, count(*) AS keys FROM k
    JOIN citus_shards AS s ON s.shardid =
         get_shard_id_for_distribution_column('idempotency.tenant_keys', k.tenant)
   GROUP BY s.nodeport) AS n});
}
my $both = join ',', map { $_->port . ':2' } @workers;
is(keys_by_node('alice'), $both, 'alice has two tenant keys on each worker');

# The marks of `role` on a node: pg_shdepend rows on its relation of
# idempotency.tenant_keys.
sub marks_on
{
	my ($node, $role) = @_;
	return $node->safe_psql(
		'postgres', qq{
SELECT count(*) FROM pg_shdepend AS d
 WHERE d.refclassid = 'pg_authid'::regclass
   AND d.refobjid = (SELECT oid FROM pg_roles WHERE rolname = '$role')
   AND d.classid = 'pg_class'::regclass
   AND d.objid = 'idempotency.tenant_keys'::regclass
   AND d.dbid = (SELECT oid FROM pg_database WHERE datname = current_database())});
}
is(join(',', map { marks_on($_, 'alice') } @nodes),
	'0,1,1', 'alice is marked on each worker, where her keys were written');

sub role_exists_everywhere
{
	my ($role) = @_;
	return join ',',
	  map {
		$_->safe_psql('postgres',
			"SELECT count(*) FROM pg_roles WHERE rolname = '$role'")
	  } @nodes;
}

# DROP ROLE fails on the coordinator with the worker's refusal.
my ($rc, $stdout, $stderr) = $coordinator->psql(
	'postgres', 'DROP ROLE alice',
	extra_params => [ '-v', 'VERBOSITY=verbose' ]);
like($stderr, qr/ERROR:\s+2BP01:/, 'DROP ROLE alice fails with 2BP01');
like(
	$stderr,
	qr/privileges for column scope of table idempotency\.tenant_keys/,
	'the refusal names the tenant keys');
is(role_exists_everywhere('alice'), '1,1,1', 'alice still exists on every node');
is(keys_by_node('alice'), $both, 'and her tenant keys are all there');

# Also with REASSIGN OWNED first: keys never pass to another role.
$coordinator->safe_psql('postgres', 'REASSIGN OWNED BY alice TO payers');
is(sqlstate_of($coordinator, 'DROP ROLE alice'),
	'2BP01', 'DROP ROLE alice fails after REASSIGN OWNED');

# A mark lost on a worker (pg_upgrade does not carry pg_shdepend) comes
# back with mark_key_roles() there.
my $worker1 = $workers[0];
$worker1->safe_psql(
	'postgres', q{
DELETE FROM pg_shdepend AS d
 WHERE d.refobjid = 'alice'::regrole
   AND d.objid = 'idempotency.tenant_keys'::regclass});
is(marks_on($worker1, 'alice'), '0', 'alice\'s mark on worker1 removed');
is($worker1->safe_psql('postgres', 'SELECT idempotency.mark_key_roles()'),
	'0', 'mark_key_roles on worker1 deletes nothing');
is(marks_on($worker1, 'alice'), '1', 'and marks alice there again');

# Carol's marks lost everywhere, then carol dropped: her tenant keys belong
# to no role on the workers, and mark_key_roles deletes them there.
for my $worker (@workers)
{
	$worker->safe_psql(
		'postgres', q{
DELETE FROM pg_shdepend AS d
 WHERE d.refobjid = 'carol'::regrole
   AND d.objid = 'idempotency.tenant_keys'::regclass});
}
$coordinator->safe_psql('postgres', 'DROP ROLE carol');
is(role_exists_everywhere('carol'), '0,0,0', 'carol, unmarked, is dropped');
is( join(
		',',
		map { $_->safe_psql('postgres', 'SELECT idempotency.mark_key_roles()') }
		  @workers),
	'2,2',
	'mark_key_roles on each worker deletes the two tenant keys of no role');
is($coordinator->safe_psql('postgres',
		"SELECT count(*) FROM idempotency.tenant_keys WHERE scope::text = '-'"),
	'0', 'no tenant key of no role is left');

# DROP OWNED BY, run on the coordinator, deletes alice's tenant keys on
# every node and her marks; then DROP ROLE succeeds everywhere.
$coordinator->safe_psql('postgres', 'DROP OWNED BY alice');
is(keys_by_node('alice'), '', 'DROP OWNED BY alice deletes her tenant keys');
is(join(',', map { marks_on($_, 'alice') } @nodes),
	'0,0,0', 'and her marks on every node');
is(keys_by_node('bob'), join(',', map { $_->port . ':2' } @workers),
	'bob\'s tenant keys stay');
$coordinator->safe_psql('postgres', 'DROP ROLE alice');
is(role_exists_everywhere('alice'), '0,0,0', 'alice is dropped on every node');

# Bob's keys replay: nothing runs again.
my %before = map { $_ => withdrawals($_) } @tenants;
pay_as('bob', $_, "bob-$_") for @tenants;
is_deeply({ map { $_ => withdrawals($_) } @tenants },
	\%before, 'bob\'s keys replay, running nothing');

# DROP OWNED waits for a tenant key being stored on a worker, and deletes it
# too: bob's call, delegated inside his open transaction, holds the worker's
# idempotency.tenant_keys until he commits.
my $late_tenant = $tenants[0];
my $late_worker =
  (grep { $_->port == node_of_tenant($late_tenant) } @workers)[0];
my $storer = $coordinator->background_psql('postgres');
$storer->query_safe('SET ROLE bob');
$storer->query_safe('BEGIN');
$storer->query_safe("SELECT pay($late_tenant, 'bob-late', 1)");
my $dropper = $coordinator->background_psql('postgres');
$dropper->query_until(qr/sent/, "\\echo sent\nDROP OWNED BY bob;\n");
ok( $late_worker->poll_query_until(
		'postgres', q{SELECT EXISTS (SELECT FROM pg_stat_activity
  WHERE query LIKE 'DROP OWNED%' AND wait_event_type = 'Lock')}),
	'DROP OWNED waits on the worker for the transaction storing a key');
$storer->query_safe('COMMIT');
$dropper->query_safe('SELECT 1');
$storer->quit;
$dropper->quit;
is(keys_by_node('bob'), '',
	'DROP OWNED BY bob deletes his tenant keys, the one stored meanwhile too');
$coordinator->safe_psql('postgres', 'DROP ROLE bob');
is(role_exists_everywhere('bob'), '0,0,0', 'bob is dropped on every node');

# A shard moved: dave's only key is on worker1, in a shard moved to
# worker2 afterwards. Worker1's mark stays, so dave still cannot be
# dropped; mark_key_roles on worker2 marks him there; DROP OWNED deletes
# the key on worker2.
my $moved_tenant = $tenants_on{ $worker1->port }[0];
pay_as('dave', $moved_tenant, 'dave-1');
my $erin_first = pay_as('erin', $moved_tenant, 'erin-1');
is(marks_on($worker1, 'dave'), '1', 'dave is marked on worker1');
my $moved_shard = $coordinator->safe_psql('postgres',
	"SELECT get_shard_id_for_distribution_column('idempotency.tenant_keys', $moved_tenant)");
$coordinator->safe_psql(
	'postgres', qq{
SELECT citus_move_shard_placement(
  $moved_shard,
  '127.0.0.1', ${\ $worker1->port }, '127.0.0.1', ${\ $workers[1]->port },
  shard_transfer_mode => 'block_writes')});
is(node_of_tenant($moved_tenant),
	$workers[1]->port, 'dave\'s tenant moved to worker2');
is(keys_by_node('dave'), $workers[1]->port . ':1', 'and his key with it');
is(sqlstate_of($coordinator, 'DROP ROLE dave'),
	'2BP01', 'DROP ROLE dave still fails after the move');
is(marks_on($workers[1], 'dave'), '0', 'dave has no mark on worker2 yet');
$workers[1]->safe_psql('postgres', 'SELECT idempotency.mark_key_roles()');
is(marks_on($workers[1], 'dave'), '1', 'mark_key_roles on worker2 marks him');
$coordinator->safe_psql('postgres', 'DROP OWNED BY dave');
is(keys_by_node('dave'), '', 'DROP OWNED BY dave deletes the moved key');
$coordinator->safe_psql('postgres', 'DROP ROLE dave');
is(role_exists_everywhere('dave'), '0,0,0', 'dave is dropped on every node');

# After the move and DROP ROLE: mark_key_roles on the node the shard left.
# Erin's key moved with dave's; her marks lost on both workers (as
# pg_upgrade loses them), DROP ROLE erin succeeds and leaves her key in the
# shard on worker2 and in the old placement on worker1, a key of no role.
my $old_placement = "idempotency.tenant_keys_$moved_shard";
is($worker1->safe_psql('postgres', "SELECT to_regclass('$old_placement') IS NOT NULL"),
	't', 'worker1 still holds the old placement of the moved shard');
for my $worker (@workers)
{
	$worker->safe_psql(
		'postgres', q{
DELETE FROM pg_shdepend AS d
 WHERE d.refobjid = 'erin'::regrole
   AND d.objid = 'idempotency.tenant_keys'::regclass});
}
$coordinator->safe_psql('postgres', 'DROP ROLE erin');
is(role_exists_everywhere('erin'), '0,0,0', 'erin, unmarked, is dropped');
my $no_role_keys = "SELECT count(*) FROM $old_placement WHERE scope::text = '-'";
is( $worker1->safe_psql('postgres', $no_role_keys) . '|'
	  . $workers[1]->safe_psql('postgres', $no_role_keys),
	'1|1', 'her key is left, of no role, in the old placement and the new');

my ($rc_marks, $marked, $marks_err) =
  $worker1->psql('postgres', 'SELECT idempotency.mark_key_roles()');
is("$rc_marks|$marks_err", '0|',
	'mark_key_roles on the node the shard left raises nothing');
is($marked, '1', 'and deletes one key');
is($worker1->safe_psql('postgres', 'SELECT 1'), '1', 'worker1 still serves');
is($worker1->safe_psql('postgres', $no_role_keys),
	'0', "the old placement's key of no role is gone");

# New roles with the old names. A new erin does not replay the old erin's
# key: her request runs (on worker2, where the key of no role still is). A
# new dave stores a key in a shard that stayed on worker1, his only one.
$coordinator->safe_psql('postgres', q{
CREATE ROLE dave LOGIN IN ROLE payers;
CREATE ROLE erin LOGIN IN ROLE payers});
my $ran_before = withdrawals($moved_tenant);
my $erin_again = pay_as('erin', $moved_tenant, 'erin-1');
is(withdrawals($moved_tenant), $ran_before + 1,
	'a new erin runs her request under the old erin\'s key');
isnt($erin_again, $erin_first, 'and is not answered the old erin\'s response');
my ($stayed_tenant) = grep { node_of_tenant($_) == $worker1->port } 1 .. 40;
my $stayed_before = withdrawals($stayed_tenant);
pay_as('dave', $stayed_tenant, 'dave-2');
is(withdrawals($stayed_tenant), $stayed_before + 1, 'a new dave stores a key on worker1');

# mark_key_roles on the old node again, the new roles there: nothing to
# delete, and neither new role can be dropped while it has a key (dave's
# only mark is worker1's, which mark_key_roles there must keep).
($rc_marks, $marked, $marks_err) =
  $worker1->psql('postgres', 'SELECT idempotency.mark_key_roles()');
is("$rc_marks|$marked|$marks_err", '0|0|',
	'mark_key_roles on the node the shard left, once more: no error, nothing deleted');
is( join(',', map { sqlstate_of($coordinator, "DROP ROLE $_") } qw(dave erin)),
	'2BP01,2BP01', 'DROP ROLE of the new dave and erin, who have keys, fails');
is(role_exists_everywhere('dave') . ';' . role_exists_everywhere('erin'),
	'1,1,1;1,1,1', 'both still exist on every node');

$_->stop for @nodes;
done_testing();
