# Tenant keys on Citus: a coordinator and two workers on localhost. The key
# table idempotency.tenant_keys is distributed with accounts (co-located by
# tenant); requests run through functions Citus delegates to the worker that
# holds the tenant, so a request is one local transaction there.
#
# - distribute_keys: superusers only, once, co-located with the table named.
# - Retries replay per tenant; a request delegated to a worker uses no
#   two-phase commit (pg_dist_transaction) and writes its key in the shard
#   beside the tenant's row; IK422 and IK409 arrive through the coordinator;
#   one key text under two tenants, or two roles, is two keys.
# - Callers cannot read or write the table on any node; a tenant's keys are
#   refused outside the node that holds them (0A000).
# - The application API (tenant_claim/tenant_complete) in a delegated handler
#   and in a session on the tenant's worker; a delegated request that needs
#   another worker is refused and leaves nothing.
# - ALTER TABLE (a column added and dropped, a CHECK constraint), REINDEX
#   CONCURRENTLY and a BEFORE INSERT trigger (run as the table's owner) on
#   the key table between the calls of one session.
# - A shard move (citus_move_shard_placement) while callers run, in
#   autocommit and inside their own BEGIN ... COMMIT: it starts once calls
#   are in flight, calls are in flight while it runs and keys are stored
#   during it, pgbench exits 0; keys move with their tenant and replay,
#   nothing ran twice; the move waits for requests in flight, requests that
#   arrive during it get 40001 only, and their retries run once on the new
#   node and replay the answer their client got.
# - Expiry through the coordinator turns expired tenant keys into tombstones
#   on every shard, also after the move; workers leave them alone; stats counts them.
# - kill -9 during calls that clients retry, of a worker's backend and of the
#   coordinator's (crash restarts), then of every process of the other worker
#   and of the coordinator (power cuts), each counted only when it landed:
#   the shared checker (check_storm) finds, per key, every answer the first,
#   applied once and equal to what is stored, changed requests refused, the
#   balances explained; every client exits 0, every error kind is counted,
#   and each planted control is flagged.
# - A worker crash right after a request's commit record: the retry replays.
# - DROP EXTENSION is refused while the key table exists.
#
# Needs Citus; without it the file says so and is skipped. CITUS_TEST_PORT,
# when set, is the first of six TCP ports (this file uses the last three).
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep time);
use POSIX ();

use FindBin;
use lib $FindBin::RealBin;
use IdempotencyTest;

my $missing = citus_missing();
plan skip_all => $missing if $missing;

my ($coordinator, @workers) = citus_cluster(
	slot => 1,
	conf => "restart_after_crash = on\n",
	shard_moves => 1);

$coordinator->safe_psql('postgres', q{
CREATE ROLE app LOGIN;
CREATE ROLE other_app LOGIN;
});
$coordinator->safe_psql('postgres',
	tenant_accounts_sql(shard_count => 8, balance => 100000, callers => 'app, other_app'));

is( $coordinator->psql('postgres', q{SELECT idempotency.distribute_keys('accounts')},
		extra_params => [ '-U', 'app' ]),
	3, 'distribute_keys is for superusers');
is(sqlstate_of($coordinator, q{SELECT idempotency.distribute_keys('idempotency.keys')}),
	'42809', 'keys are co-located only with a distributed table');
$coordinator->safe_psql('postgres', q{SELECT idempotency.distribute_keys('accounts')});
is(sqlstate_of($coordinator, q{SELECT idempotency.distribute_keys('accounts')}),
	'42P07', 'distribute_keys runs once');
is( $coordinator->safe_psql(
		'postgres', q{
SELECT format_type(a.atttypid, a.atttypmod),
       (SELECT colocationid FROM pg_dist_partition WHERE logicalrelid = 'idempotency.tenant_keys'::regclass)
     = (SELECT colocationid FROM pg_dist_partition WHERE logicalrelid = 'accounts'::regclass)
  FROM pg_attribute AS a
 WHERE a.attrelid = 'idempotency.tenant_keys'::regclass AND a.attname = 'tenant'}),
	'bigint|t', 'tenant_keys has the tenant type of accounts and is co-located with it');

# The request functions: Citus runs each on the worker that holds its
# tenant, in a transaction block too (force_delegation).
$coordinator->safe_psql('postgres', delegated_pay_sql());
$coordinator->safe_psql(
	'postgres', q{
CREATE FUNCTION pay_by_hand(tenant bigint, key text, amount bigint) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
  claimed record;
  result jsonb;
BEGIN
  SELECT * INTO claimed FROM idempotency.tenant_claim(tenant, key, amount::text);
  IF claimed.replayed THEN
    RETURN claimed.response;
  END IF;
  result := withdraw(tenant, amount, 0);
  PERFORM idempotency.tenant_complete(tenant, key, result);
  RETURN result;
END $$;
SELECT create_distributed_function('pay_by_hand(bigint,text,bigint)', 'tenant',
  colocate_with => 'idempotency.tenant_keys', force_delegation => true);

CREATE FUNCTION key_state(tenant bigint, key text) RETURNS text
LANGUAGE plpgsql AS $$
BEGIN
  RETURN (SELECT l.state FROM idempotency.tenant_lookup(tenant, key) AS l);
END $$;
SELECT create_distributed_function('key_state(bigint,text)', 'tenant',
  colocate_with => 'idempotency.tenant_keys', force_delegation => true);

CREATE FUNCTION forget_key(tenant bigint, key text) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
  RETURN idempotency.tenant_forget(tenant, key);
END $$;
SELECT create_distributed_function('forget_key(bigint,text)', 'tenant',
  colocate_with => 'idempotency.tenant_keys', force_delegation => true);
});

sub as_app
{
	my ($sql, $role) = @_;
	return $coordinator->safe_psql('postgres', $sql,
		extra_params => [ '-U', $role // 'app' ]);
}

sub withdrawals
{
	my ($tenant) = @_;
	return $coordinator->safe_psql('postgres',
		"SELECT withdrawals FROM accounts WHERE tenant = $tenant");
}

sub two_phase_commits
{
	return $coordinator->safe_psql('postgres', 'SELECT count(*) FROM pg_dist_transaction');
}

# --- retries, one node per request -------------------------------------------
my $prepared_before = two_phase_commits();
my $first = as_app(q{SELECT pay(1, 'order-1', 10)});
is($first, '{"tenant": 1, "balance": 99990}', 'a new key runs the withdrawal');
is(as_app(q{SELECT pay(1, 'order-1', 10)}), $first, 'its retry gets the stored response');
is(withdrawals(1), '1', 'the withdrawal ran once');
as_app("SELECT pay($_, 'order-$_', 5)") for 2 .. 21;
is(two_phase_commits(), $prepared_before,
	'single-tenant requests, new keys and replays, use no two-phase commit');
my (undef, undef, $remote) = $coordinator->psql(
	'postgres', q{SET citus.log_remote_commands = on; SELECT pay(23, 'order-23', 5)},
	extra_params => [ '-U', 'app' ]);
like($remote, qr/issuing SELECT public\.pay\('23'::bigint, 'order-23'::text/,
	'the call is delegated to the worker as a whole');
unlike($remote, qr/PREPARE TRANSACTION|UPDATE public\.accounts|INSERT INTO idempotency/,
	'the coordinator sends no statement of its own and no PREPARE');

my $same_node = q{
SELECT (SELECT nodeport FROM citus_shards
         WHERE shardid = get_shard_id_for_distribution_column('idempotency.tenant_keys', %1$d))
     = (SELECT nodeport FROM citus_shards
         WHERE shardid = get_shard_id_for_distribution_column('accounts', %1$d)),
       (SELECT count(*) FROM idempotency.tenant_keys WHERE tenant = %1$d)};
is($coordinator->safe_psql('postgres', sprintf($same_node, 1)),
	't|1', "the key is stored in the shard on the tenant's node");

# --- IK422, IK409, tenants and roles -----------------------------------------
my (undef, undef, $err) = $coordinator->psql('postgres', q{SELECT pay(1, 'order-1', 11)},
	extra_params => [ '-U', 'app', '-v', 'VERBOSITY=verbose' ]);
like($err, qr/IK422/, 'the same key with another amount is IK422, through the coordinator');

my $holder = $coordinator->background_psql('postgres', extra_params => [ '-U', 'app' ]);
$holder->query_until(qr/started/, qq{\\echo started\nSELECT pay(24, 'slow', 7, 5);\n});
# Wait until the first request holds the key (a loaded machine may take
# a while to start it).
my $held = 0;
for (1 .. 100)
{
	last if $held = as_app(q{SELECT key_state(24, 'slow')}) eq 'in_progress';
	usleep(50_000);
}
ok($held, 'the first request holds the key');
(undef, undef, $err) = $coordinator->psql('postgres', q{SELECT pay(24, 'slow', 7, 5)},
	extra_params => [ '-U', 'app', '-v', 'VERBOSITY=verbose' ]);
like($err, qr/IK409/, 'a duplicate while the first runs is IK409');
is(as_app(q{SELECT key_state(24, 'slow')}), 'in_progress', 'lookup shows it in progress');
$holder->quit;
is(as_app(q{SELECT pay(24, 'slow', 7, 5)}), '{"tenant": 24, "balance": 99993}',
	'after the first commits, the duplicate replays');
is(withdrawals(24), '1', 'the slow withdrawal ran once');

is(as_app(q{SELECT pay(2, 'order-1', 10)}), '{"tenant": 2, "balance": 99985}',
	"one key text under another tenant is another key");
is(as_app(q{SELECT key_state(3, 'order-1')}), 'absent', 'and is absent for a third tenant');
is(as_app(q{SELECT key_state(1, 'order-1')}, 'other_app'), 'absent',
	"another role does not see app's key");
as_app(q{SELECT pay(1, 'order-1', 10)}, 'other_app');
is(withdrawals(1), '2', "another role's request with the same key text is its own");

# --- rights and place -----------------------------------------------------------
for my $node ($coordinator, @workers)
{
	my ($rc, undef, $denied) = $node->psql('postgres',
		q{SELECT count(*) FROM idempotency.tenant_keys},
		extra_params => [ '-U', 'app' ]);
	like($denied, qr/permission denied/, 'callers cannot read tenant_keys on ' . $node->name);
	(undef, undef, $denied) = $node->psql('postgres',
		q{INSERT INTO idempotency.tenant_keys VALUES (30, 'app', 'forged', idempotency.key_digest('forged'), '\x00', '{}', now(), now() + '1 day')},
		extra_params => [ '-U', 'app' ]);
	like($denied, qr/permission denied/, 'callers cannot write tenant_keys on ' . $node->name);
}
is( sqlstate_of(
		$coordinator, q{SELECT idempotency.tenant_call(1::bigint, 'order-1', NULL, 'SELECT 1')}),
	'0A000', "a tenant's keys are refused on a node that does not hold them");
is(sqlstate_of($coordinator, q{SELECT idempotency.tenant_call(1, 'x', NULL, 'SELECT 1')}),
	'42804', 'a tenant of another type than the tenant column is refused');
is(sqlstate_of($coordinator, q{SELECT idempotency.tenant_call(NULL::bigint, 'x', NULL, 'SELECT 1')}),
	'22004', 'a NULL tenant is refused');
# Exactly one worker holds tenant 30: there the call runs, elsewhere it is
# refused.
my @states = map {
	sqlstate_of($_, q{SELECT idempotency.tenant_call(30::bigint, 'direct', NULL, 'SELECT 1')})
} @workers;
is(join(',', sort @states), '0A000,no error',
	'connected to a worker directly, only the one holding the tenant takes its keys');

# --- the application API ------------------------------------------------------
my $by_hand = as_app(q{SELECT pay_by_hand(25, 'hand-1', 4)});
is(as_app(q{SELECT pay_by_hand(25, 'hand-1', 4)}), $by_hand,
	'tenant_claim replays what tenant_complete stored');
is(withdrawals(25), '1', 'the handler ran the withdrawal once');
is(as_app(q{SELECT forget_key(25, 'hand-1')}), 't', 'tenant_forget deletes the key');
is(as_app(q{SELECT key_state(25, 'hand-1')}), 'absent', 'and it is gone');
is(two_phase_commits(), $prepared_before, 'the application API uses no two-phase commit either');

# Handler code in a session on the worker that holds the tenant: claim,
# the handler's own statement, complete, in one local transaction.
my ($home) = grep {
	sqlstate_of($_, q{SELECT idempotency.tenant_call(26::bigint, 'probe-home', NULL, 'SELECT 1')})
	  eq 'no error'
} @workers;
my $handler = q{
BEGIN;
SELECT replayed FROM idempotency.tenant_claim(26::bigint, 'on-worker', NULL);
UPDATE accounts SET balance = balance - 3, withdrawals = withdrawals + 1 WHERE tenant = 26;
SELECT 'completed' FROM idempotency.tenant_complete(26::bigint, 'on-worker', '{"done": true}') AS c;
COMMIT;
};
is($home->safe_psql('postgres', $handler, extra_params => [ '-U', 'app' ]), "f\ncompleted",
	"claim/complete in a session on the tenant's worker");
is(as_app(q{SELECT key_state(26, 'on-worker')}), 'done', 'its key is stored');
is(withdrawals(26), '1', 'and the handler ran once');

# A delegated request that reaches a tenant on the other worker is refused
# by Citus, and nothing of it stays.
my $far_tenant = $coordinator->safe_psql('postgres', q{
SELECT t FROM generate_series(28, 35) AS t
 WHERE (SELECT nodeport FROM citus_shards WHERE shardid = get_shard_id_for_distribution_column('accounts', t))
    <> (SELECT nodeport FROM citus_shards WHERE shardid = get_shard_id_for_distribution_column('accounts', 27))
 LIMIT 1});
$coordinator->safe_psql('postgres', qq{
CREATE FUNCTION transfer(tenant bigint, key text, other bigint) RETURNS jsonb
LANGUAGE plpgsql AS \$\$
BEGIN
  RETURN idempotency.tenant_call(tenant, key, NULL,
    'SELECT withdraw(\$1, 1, 0) || withdraw(\$2, 1, 0)', tenant, other);
END \$\$;
SELECT create_distributed_function('transfer(bigint,text,bigint)', 'tenant',
  colocate_with => 'idempotency.tenant_keys', force_delegation => true);
GRANT EXECUTE ON FUNCTION transfer(bigint,text,bigint) TO app;
});
my ($transfer_rc) = $coordinator->psql('postgres', "SELECT transfer(27, 'across', $far_tenant)",
	extra_params => [ '-U', 'app' ]);
isnt($transfer_rc, 0, 'a delegated request that needs another worker fails');
is(withdrawals(27) . withdrawals($far_tenant) . as_app(q{SELECT key_state(27, 'across')}),
	'00absent', 'and leaves no withdrawal and no key');

# --- a DBA's maintenance ------------------------------------------------------
# One session (and Citus's connection from it to the tenant's worker, where
# the calls keep their plans) goes on calling while a superuser changes the
# table on every shard between its calls: stored keys replay, new keys are
# stored, each once.
my $dba_tenant = 36;
my $session = $coordinator->background_psql('postgres', extra_params => [ '-U', 'app' ]);
my $stored = $session->query_safe(qq{SELECT pay($dba_tenant, 'dba-0', 3)});
my $new_keys = 0;
for my $ddl (
	'ALTER TABLE idempotency.tenant_keys ADD COLUMN note int NOT NULL DEFAULT 7',
	'ALTER TABLE idempotency.tenant_keys ADD CONSTRAINT expires_after_creation CHECK (expires_at > created_at)',
	'REINDEX TABLE CONCURRENTLY idempotency.tenant_keys',
	'ALTER TABLE idempotency.tenant_keys DROP COLUMN note')
{
	$coordinator->safe_psql('postgres', $ddl);
	is($session->query_safe(qq{SELECT pay($dba_tenant, 'dba-0', 3)}), $stored,
		"after $ddl, a stored key replays in a session that called before");
	$new_keys++;
	like($session->query_safe(qq{SELECT pay($dba_tenant, 'dba-$new_keys', 3)}),
		qr/"balance"/, '... and a new key is stored');
}
# A trigger a DBA adds (Citus asks for citus.enable_unsafe_triggers) runs
# in the tenant's shard, as the table's owner, not as the caller.
$coordinator->safe_psql('postgres', q{
SET citus.enable_unsafe_triggers = on;
ALTER TABLE idempotency.tenant_keys ADD COLUMN written_by name;
CREATE FUNCTION stamp_writer() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  NEW.written_by := current_user;
  RETURN NEW;
END $$;
CREATE TRIGGER stamp_writer BEFORE INSERT ON idempotency.tenant_keys
  FOR EACH ROW EXECUTE FUNCTION stamp_writer()});
$new_keys++;
like($session->query_safe(qq{SELECT pay($dba_tenant, 'dba-$new_keys', 3)}),
	qr/"balance"/, 'with a BEFORE INSERT trigger on the table, a new key is stored');
is( $coordinator->safe_psql('postgres', qq{
SELECT written_by = (SELECT tableowner FROM pg_tables
                      WHERE schemaname = 'idempotency' AND tablename = 'tenant_keys')
  FROM idempotency.tenant_keys WHERE key = 'dba-$new_keys'}),
	't', "the trigger ran as the table's owner");
$coordinator->safe_psql('postgres', q{
SET citus.enable_unsafe_triggers = on;
DROP TRIGGER stamp_writer ON idempotency.tenant_keys;
ALTER TABLE idempotency.tenant_keys DROP COLUMN written_by});
is($session->query_safe(qq{SELECT pay($dba_tenant, 'dba-0', 3)}), $stored,
	'and stored keys replay after it is gone');
$session->quit;
is(withdrawals($dba_tenant), 1 + $new_keys, 'each key of the session ran once');
is( $coordinator->safe_psql('postgres',
		"SELECT count(*) FROM idempotency.tenant_keys WHERE tenant = $dba_tenant"),
	1 + $new_keys, 'and is stored');

# --- a shard move while callers run ---------------------------------------------
# Callers: 4 clients, keys mv-1 .. mv-5000 picked at random (some are
# retries), the tenant derived from the key. Two clients may send one key at
# once: the second waits for the first and replays (wait_timeout, set for
# the role on every node, where the delegated calls run). Half of the
# calls inside the client's own BEGIN ... COMMIT.
role_setting_on_nodes([ $coordinator, @workers ], 'app', "idempotency.wait_timeout = '10s'");
my $moved_tenant = 1;
my $shard = $coordinator->safe_psql('postgres',
	"SELECT get_shard_id_for_distribution_column('idempotency.tenant_keys', $moved_tenant)");
my $from_port = $coordinator->safe_psql('postgres',
	"SELECT nodeport FROM citus_shards WHERE shardid = $shard");
my ($to) = grep { $_->port != $from_port } @workers;
# pgbench runs long enough to outlast the move: the test waits until calls
# are in flight and keys stored, samples the calls in flight while the move
# runs, and checks that pgbench still ran when the move ended.
my ($pgbench, $bench_out, $bench_err) = start_paying_clients($coordinator,
	prefix => 'mv', keys => 5000, tenants => 8, seconds => 15, max_tries => 50);
my $mv_keys = q{SELECT count(*) FROM idempotency.tenant_keys WHERE key LIKE 'mv-%'};
my $calls_in_flight = q{
SELECT count(*) FROM pg_stat_activity
 WHERE usename = 'app' AND state <> 'idle' AND query LIKE '%pay(%'};
ok( $coordinator->poll_query_until('postgres',
		"SELECT ($calls_in_flight) > 0 AND ($mv_keys) > 0"),
	'callers have stored keys and have calls in flight when the move starts');
my $keys_before_move = $coordinator->safe_psql('postgres', $mv_keys);
my $move = IPC::Run::start(
	[ 'psql', '-X', '-A', '-t', '-v', 'ON_ERROR_STOP=1', '-h', $coordinator->host,
	  '-p', $coordinator->port, '-d', 'postgres', '-c',
	  "SELECT citus_move_shard_placement($shard, '127.0.0.1', $from_port, '127.0.0.1', "
	  . $to->port . ", 'force_logical')" ],
	'>', \my $move_out, '2>', \my $move_err);
my ($most_in_flight, $samples) = (0, 0);
while ($move->pumpable)
{
	my $now = $coordinator->safe_psql('postgres', $calls_in_flight);
	$most_in_flight = $now if $now > $most_in_flight;
	$samples++;
	usleep(100_000);
	$move->pump_nb;
}
ok($move->finish, 'the move succeeded') or diag("move: $move_out $move_err");
my $keys_at_move_end = $coordinator->safe_psql('postgres', $mv_keys);
ok($pgbench->pumpable, 'pgbench still ran when the move ended');
cmp_ok($most_in_flight, '>', 0, "calls were in flight while the move ran ($samples samples)");
my $bench_ok = $pgbench->finish;
note "pgbench: $$bench_out $$bench_err";
ok($bench_ok, 'pgbench exited 0: no client aborted')
  or diag('pgbench exit status ' . $pgbench->result . ": $$bench_err");
my $keys_after = $coordinator->safe_psql('postgres', $mv_keys);
unlike($$bench_err, qr/aborted/,
	'no caller failed: a request the move interrupted failed with 40001 and ran again');
like($$bench_out, qr/number of failed transactions: 0 /,
	'and none failed after its retries');
cmp_ok($keys_before_move, '>', 0, 'callers stored keys before the move');
cmp_ok($keys_at_move_end, '>', $keys_before_move, 'while it ran');
cmp_ok($keys_after, '>', $keys_at_move_end, 'and after it');
is( $coordinator->safe_psql('postgres',
		"SELECT nodeport FROM citus_shards WHERE shardid = $shard"),
	$to->port, 'the shard of tenant 1 moved to the other worker');
is($coordinator->safe_psql('postgres', sprintf($same_node, $moved_tenant)),
	't|' . $coordinator->safe_psql('postgres',
		"SELECT count(*) FROM idempotency.tenant_keys WHERE tenant = $moved_tenant"),
	"tenant 1's keys moved with its account");
# Every stored mv- key ran once: withdrawals of mv- keys per tenant equal
# the keys stored; and each replays without a new withdrawal.
my $mv_withdrawals = q{
SELECT sum(withdrawals) FROM accounts WHERE tenant BETWEEN 1 AND 8};
my $expected = $coordinator->safe_psql('postgres', q{
SELECT (SELECT count(*) FROM idempotency.tenant_keys WHERE key LIKE 'mv-%')
     + (SELECT count(*) FROM idempotency.tenant_keys WHERE tenant BETWEEN 1 AND 8 AND key NOT LIKE 'mv-%')});
is($coordinator->safe_psql('postgres', $mv_withdrawals), $expected,
	'every withdrawal during the move has its key, none ran twice');
my ($stored_responses, $replayed_responses) =
  replay_stored_keys($coordinator, prefix => 'mv', tenants => 8);
is($replayed_responses, $stored_responses, 'every key replays its stored response after the move');
is($coordinator->safe_psql('postgres', $mv_withdrawals), $expected, 'and the replays ran nothing');

# --- a shard move while calls in transaction blocks are in flight ---------------
# Clients call as a new user would, most inside their own BEGIN ... COMMIT
# (the delegated call then stays in the client's transaction), one in
# autocommit, each retrying its request until it is answered. The test holds
# the requests' work back on the tenant's worker with an advisory lock (the
# gate) and waits for each state to be there before going on:
#   1. three requests are in flight: past the key check, waiting in fn;
#   2. the move is waiting for them, for the last moment of the move;
#   3. two more requests have arrived and wait behind the move;
# then it opens the gate. Every error a client saw is 40001, and every
# request, retried, ran once and stored its key on the tenant's new node.
$coordinator->safe_psql('postgres', q{
CREATE FUNCTION withdraw_gated(account bigint, amount bigint) RETURNS jsonb
LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_advisory_xact_lock_shared(4242);
  RETURN withdraw(account, amount, 0);
END $$;
CREATE FUNCTION pay_gated(tenant bigint, key text, amount bigint) RETURNS jsonb
LANGUAGE plpgsql AS $$
BEGIN
  RETURN idempotency.tenant_call(tenant, key, NULL,
    'SELECT withdraw_gated($1, $2)', tenant, amount);
END $$;
SELECT create_distributed_function('pay_gated(bigint,text,bigint)', 'tenant',
  colocate_with => 'idempotency.tenant_keys', force_delegation => true);
});
# A tenant whose shard the move above left alone.
my $block_tenant = $coordinator->safe_psql('postgres', qq{
SELECT t FROM generate_series(37, 40) AS t
 WHERE get_shard_id_for_distribution_column('accounts', t)
    <> get_shard_id_for_distribution_column('accounts', $moved_tenant)
 LIMIT 1});
my $block_shard = $coordinator->safe_psql('postgres',
	"SELECT get_shard_id_for_distribution_column('idempotency.tenant_keys', $block_tenant)");
my $block_from = $coordinator->safe_psql('postgres',
	"SELECT nodeport FROM citus_shards WHERE shardid = $block_shard");
my ($block_source) = grep { $_->port == $block_from } @workers;
my ($block_target) = grep { $_->port != $block_from } @workers;
my $block_withdrawals = withdrawals($block_tenant);

my $block_results = $coordinator->basedir . '/in_blocks';
mkdir $block_results;
# Sends one request until it is answered: `BEGIN`, the call, `COMMIT` as three
# round trips (or the call alone, in autocommit). Writes each error's SQLSTATE
# and, at the end, the answer.
sub request_until_answered
{
	my ($key, $in_block) = @_;
	my $pid = fork();
	die "fork: $!" unless defined $pid;
	return $pid if $pid;
	open my $out, '>', "$block_results/$key" or die;
	$out->autoflush(1);
	my @call = ('-c', "SELECT pay_gated($block_tenant, '$key', 1)");
	@call = ('-c', 'BEGIN', @call, '-c', 'COMMIT') if $in_block;
	for (1 .. 50)
	{
		my ($stdout, $stderr) = ('', '');
		IPC::Run::run(
			[ 'psql', '-X', '-A', '-t', '-q', '-v', 'ON_ERROR_STOP=1', '-v', 'VERBOSITY=verbose',
			  '-h', $coordinator->host, '-p', $coordinator->port, '-U', 'app', '-d', 'postgres',
			  @call ],
			'>', \$stdout, '2>', \$stderr);
		if ($stdout =~ /"balance"/)
		{
			chomp $stdout;
			print $out "answer|$stdout\n";
			last;
		}
		my ($sqlstate) = $stderr =~ /ERROR:\s+([0-9A-Z]{5}):/;
		print $out 'error|' . ($sqlstate // "none: $stderr") . "\n";
	}
	close $out;
	POSIX::_exit(0);
}

# Waits until `sql` returns `want` on `node`.
sub state_reached
{
	my ($node, $sql, $want) = @_;
	return $node->poll_query_until('postgres', $sql, $want);
}
my $gate_waiters = q{
SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = 4242 AND objsubid = 1 AND NOT granted};
# Citus's lock on the placement of a group of co-located shards (advisory,
# class 8): the move asks for it in exclusive mode, requests in share mode.
my $placement_waiters = q{
SELECT count(*) FROM pg_locks
 WHERE locktype = 'advisory' AND objsubid = 8 AND mode = '%s' AND NOT granted};

my $gate = $block_source->background_psql('postgres');
$gate->query_safe('SELECT pg_advisory_lock(4242)');
my @in_flight = (
	[ 'blk-1', 1 ], [ 'blk-2', 1 ], [ 'blk-3', 0 ]);
my @arriving = ([ 'blk-4', 1 ], [ 'blk-5', 0 ]);
my @block_clients = map { request_until_answered(@$_) } @in_flight;
ok(state_reached($block_source, $gate_waiters, '3'),
	'three requests are in flight: past the key check, held in fn');
my $block_move = IPC::Run::start(
	[ 'psql', '-X', '-A', '-t', '-v', 'ON_ERROR_STOP=1', '-h', $coordinator->host,
	  '-p', $coordinator->port, '-d', 'postgres', '-c',
	  "SELECT citus_move_shard_placement($block_shard, '127.0.0.1', $block_from, "
	  . "'127.0.0.1', ${\ $block_target->port }, 'force_logical')" ],
	'>', \my $block_move_out, '2>', \my $block_move_err);
ok(state_reached($block_source, sprintf($placement_waiters, 'ExclusiveLock'), '1'),
	'the move waits for the requests in flight before it switches the placement');
push @block_clients, map { request_until_answered(@$_) } @arriving;
ok(state_reached($block_source, sprintf($placement_waiters, 'ShareLock'), '2'),
	'two requests that arrived meanwhile wait for the move');
$gate->query_safe('SELECT pg_advisory_unlock(4242)');
$gate->quit;
$block_move->finish;
is($block_move_err, '', 'the move succeeded');
waitpid($_, 0) for @block_clients;
my (%answers, @errors);
for my $call (@in_flight, @arriving)
{
	open my $in, '<', "$block_results/$call->[0]" or die;
	for my $line (<$in>)
	{
		chomp $line;
		my ($kind, $value) = split /\|/, $line, 2;
		push @errors, $value if $kind eq 'error';
		$answers{ $call->[0] } = $value if $kind eq 'answer';
	}
}
note 'errors clients saw: ' . join(', ', @errors);
is(scalar(keys %answers), 5, 'every request was answered in the end');
is_deeply([ grep { $_ ne '40001' } @errors ], [], 'every error a client saw was 40001');
cmp_ok(scalar @errors, '>=', 2,
	'the requests that arrived during the move were refused with 40001 and retried');
is( $coordinator->safe_psql('postgres', "SELECT nodeport FROM citus_shards WHERE shardid = $block_shard"),
	$block_target->port, 'the shard moved');
is(withdrawals($block_tenant), $block_withdrawals + 5, 'each request ran once');
is($coordinator->safe_psql('postgres', sprintf($same_node, $block_tenant)),
	"t|" . $coordinator->safe_psql('postgres',
		"SELECT count(*) FROM idempotency.tenant_keys WHERE tenant = $block_tenant"),
	"the keys are on the tenant's new node beside its account");
is( as_app(join '', map { "SELECT pay_gated($block_tenant, '$_->[0]', 1);\n" } @in_flight, @arriving),
	join("\n", map { $answers{ $_->[0] } } @in_flight, @arriving),
	'each key replays the answer its client got');
is(withdrawals($block_tenant), $block_withdrawals + 5, 'and the replays ran nothing');

# --- expiry and stats ------------------------------------------------------------
# Expired an hour ago: expiry's cutoff is the oldest start of a transaction
# still open in the database, and the move above can leave one (Citus's own
# sessions) open past a second.
$coordinator->safe_psql('postgres', q{
UPDATE idempotency.tenant_keys SET created_at = now() - interval '2 hours', expires_at = now() - interval '1 hour' WHERE key LIKE 'mv-%'});
my $expired = $coordinator->safe_psql('postgres',
	q{SELECT count(*) FROM idempotency.tenant_keys WHERE key LIKE 'mv-%'});
is($workers[0]->safe_psql('postgres', 'SELECT idempotency.expire()'), '0',
	'a worker leaves tenant keys to the coordinator');
is($coordinator->safe_psql('postgres', 'SELECT idempotency.expire()'), $expired,
	'the coordinator turns every expired tenant key into its tombstone once, on every shard, the moved one too');
is( $coordinator->safe_psql('postgres',
		q{SELECT count(*) FROM idempotency.tenant_keys WHERE key LIKE 'mv-%'}),
	'0', 'no expired key is left');
is( $coordinator->safe_psql('postgres',
		q{SELECT count(*) FROM idempotency.tenant_keys WHERE expired_at IS NOT NULL AND response IS NULL AND key = ''}),
	$expired, 'each left its tombstone');
is( $coordinator->safe_psql('postgres', q{
SELECT s.keys = (SELECT count(*) FROM idempotency.keys WHERE expired_at IS NULL)
                + (SELECT count(*) FROM idempotency.tenant_keys WHERE expired_at IS NULL)
   AND s.tombstones = (SELECT count(*) FROM idempotency.keys WHERE expired_at IS NOT NULL)
                    + (SELECT count(*) FROM idempotency.tenant_keys WHERE expired_at IS NOT NULL)
   AND s.tombstones > 0
  FROM idempotency.stats AS s WHERE s.datname = current_database()}),
	't', 'idempotency.stats counts live tenant keys and tenant tombstones apart');
$coordinator->safe_psql('postgres', q{
UPDATE idempotency.tenant_keys SET created_at = now() - interval '2 hours', expires_at = now() - interval '1 hour' WHERE tenant = 2});
$coordinator->safe_psql('postgres', q{ALTER SYSTEM SET idempotency.expire_interval = 1; SELECT pg_reload_conf()});
ok( $coordinator->poll_query_until('postgres',
		q{SELECT count(*) > 0 AND count(*) = count(expired_at) FROM idempotency.tenant_keys WHERE tenant = 2}),
	"the coordinator's expiry worker turns expired tenant keys into tombstones");

# --- kill -9 during calls ------------------------------------------------------------
# Three clients send keys one after another (storm-<client>-<n>, each for one
# of tenants 9 .. 20, withdrawing 1), each retried until it is answered, until
# told to stop. Every third answered key is sent again (it must replay), every
# fourth again withdrawing 2 (a changed request after the answer: it must be
# refused with IK422). Each attempt is a line of its client's log: what the
# client saw (an answer, IK422, a timeout, a broken connection or the
# SQLSTATE of its error), the answer's text and whether it ran the request.
# Meanwhile a backend of a worker, then of the coordinator, is killed during
# a call (each crash restarts its node); then the other worker, then the
# coordinator, loses every process at once, as in a power cut, and is started
# again. The test waits on what it can see: clients answering before the
# first fault and again after each node is back, and a client failing while
# a node is cut off. A fault counts when it landed: a crash when the server
# log shows the killed backend, a power cut when the node's log shows its
# recovery and clients saw calls fail meanwhile. Afterwards the shared
# checker (check_storm) reads every attempt, the ledger of withdrawals (one
# row per run, with the effect id the answer names), the stored keys and the
# balances; and each planted control must be flagged.
$coordinator->safe_psql(
	'postgres', q{
CREATE TABLE storm_ledger (tenant bigint NOT NULL, key text NOT NULL, effect uuid NOT NULL,
                           amount bigint NOT NULL);
SELECT create_distributed_table('storm_ledger', 'tenant', colocate_with => 'accounts');
GRANT INSERT ON storm_ledger TO app;
CREATE FUNCTION storm_withdraw(account bigint, key text, amount bigint) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
  effect uuid := gen_random_uuid();
  left_over bigint;
BEGIN
  UPDATE accounts SET balance = balance - amount, withdrawals = withdrawals + 1
   WHERE tenant = account RETURNING balance INTO left_over;
  INSERT INTO storm_ledger VALUES (account, key, effect, amount);
  PERFORM pg_sleep(0.1);
  RETURN jsonb_build_object('tenant', account, 'effect', effect, 'balance', left_over);
END $$;
CREATE FUNCTION storm_pay(tenant bigint, key text, amount bigint) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
  response jsonb;
BEGIN
  response := idempotency.tenant_call(tenant, key, NULL,
    'SELECT storm_withdraw($1, $2, $3)', tenant, key, amount);
  RETURN CASE WHEN idempotency.last_call_replayed() THEN 'replayed' ELSE 'ran' END
      || '|' || response::text;
END $$;
SELECT create_distributed_function('storm_pay(bigint,text,bigint)', 'tenant',
  colocate_with => 'idempotency.tenant_keys', force_delegation => true);
});

my $storm_dir = $coordinator->basedir . '/storm';
my $test_pid = $$;
mkdir $storm_dir;
my @storm_tenants = (9 .. 20);
my %storm_base = map { split /\|/ } split /\n/, $coordinator->safe_psql('postgres',
	'SELECT tenant, balance FROM accounts WHERE tenant BETWEEN 9 AND 20');
# What clients may see in this storm besides answers and IK422 for changed
# requests: the crashes' and power cuts' errors, and a key still held by a
# request that a crash or timeout interrupted.
my %storm_error_kinds = map { $_ => 1 } qw(timeout broken IK409 57P01 57P02 57P03
  08000 08001 08003 08006 40001 XX000);

# One attempt: (outcome, ran, response, detail).
sub storm_attempt
{
	my ($tenant, $key, $amount) = @_;
	my ($out, $err) = ('', '');
	my $run = IPC::Run::start(
		[ 'timeout', '-s', 'KILL', '30', 'psql', '-X', '-A', '-t', '-q',
		  '-v', 'ON_ERROR_STOP=1', '-v', 'VERBOSITY=verbose',
		  '-h', $coordinator->host, '-p', $coordinator->port, '-U', 'app', '-d', 'postgres',
		  '-c', "SELECT storm_pay($tenant, '$key', $amount)" ],
		'<', \undef, '>', \$out, '2>', \$err);
	$run->finish;
	my $status = $run->full_result(0);
	my ($exit, $signal) = ($status >> 8, $status & 127);
	return ('timeout') if $signal == 9 || $exit == 124 || $exit == 137;
	if ($exit == 0)
	{
		return ('ok', $1 eq 'ran' ? 1 : 0, $2) if $out =~ /^(ran|replayed)\|(.*)$/m;
		return ('unexpected', undef, undef, "no answer: $out $err");
	}
	return ($1, undef, undef, $2) if $err =~ /(?:ERROR|FATAL):\s+([0-9A-Z]{5}):\s*(.*)/;
	return ('broken', undef, undef, $err)
	  if $err =~ /server closed the connection|connection to server|could not send|terminating connection|no connection to the server/;
	return ('unexpected', undef, undef, "exit $exit: $err");
}

# A client: keys one after another until told to stop (or the test is
# gone), each attempt a line of its log.
sub storm_client
{
	my ($client) = @_;
	open my $log, '>', "$storm_dir/$client" or die "$storm_dir/$client: $!";
	$log->autoflush(1);
	for my $n (1 .. 100_000)
	{
		last if -e "$storm_dir/stop" || getppid() != $test_pid;
		my ($tenant, $key) = ($storm_tenants[ ($n + $client) % @storm_tenants ], "storm-$client-$n");
		# Sends the request until it gets a definite answer; returns it.
		my $until_definite = sub {
			my ($amount, $changed) = @_;
			for (1 .. 150)
			{
				my ($outcome, $ran, $response, $detail) = storm_attempt($tenant, $key, $amount);
				$detail = ($detail // '') =~ s/[\t\n]/ /gr;
				print $log join("\t", Time::HiRes::time(), $key, $tenant, $amount, $changed ? 't' : 'f',
					$outcome, $ran // '', $response // '', $detail), "\n";
				return $outcome if $outcome =~ /^(ok|IK422|unexpected)$/;
				usleep(200_000);
			}
			return 'unanswered';
		};
		next if $until_definite->(1, 0) ne 'ok';
		$until_definite->(1, 0) if $n % 3 == 0;
		$until_definite->(2, 1) if $n % 4 == 0;
	}
	close $log;
	return;
}

# Every attempt of every client so far, by key, as check_storm reads them.
sub storm_attempts
{
	my %attempts;
	for my $client (1 .. 3)
	{
		open my $in, '<', "$storm_dir/$client" or next;
		while (my $line = <$in>)
		{
			next unless $line =~ s/\n\z//;
			my ($at, $key, $tenant, $amount, $changed, $outcome, $ran, $response, $detail) =
			  split /\t/, $line, 9;
			push @{ $attempts{$key} }, {
				at => $at, tenant => $tenant, request => $amount, changed => $changed eq 't',
				outcome => $outcome, ran => $ran, response => $response, detail => $detail };
		}
	}
	return \%attempts;
}

# How many attempts since `since` (a time) answered, or failed (neither an
# answer nor IK422).
sub storm_attempts_since
{
	my ($since, $failed) = @_;
	return scalar grep {
		$_->{at} >= $since && ($failed ? $_->{outcome} !~ /^(ok|IK422)$/ : $_->{outcome} eq 'ok')
	} map { @$_ } values %{ storm_attempts() };
}

# Waits until `count` attempts since `since` answered (or failed); false
# when they did not within the default timeout.
sub storm_reaches
{
	my ($since, $count, $failed) = @_;
	my $deadline = time + $PostgreSQL::Test::Utils::timeout_default;
	while (time < $deadline)
	{
		return 1 if storm_attempts_since($since, $failed) >= $count;
		usleep(100_000);
	}
	return 0;
}

my %storm_client_of;
for my $client (1 .. 3)
{
	my $pid = fork();
	die "fork: $!" unless defined $pid;
	if ($pid == 0)
	{
		# Not exit: the test's END blocks would stop the nodes.
		my $finished = eval { storm_client($client); 1 };
		print STDERR "storm client $client died: $@" unless $finished;
		POSIX::_exit($finished ? 0 : 1);
	}
	$storm_client_of{$pid} = $client;
}

# The pid of a backend of `node` running a client's call, or '' when none
# showed up within 5 s.
sub backend_in_a_call
{
	my ($node) = @_;
	for (1 .. 100)
	{
		my $backend = $node->safe_psql('postgres', q{
SELECT pid FROM pg_stat_activity WHERE usename = 'app' AND state = 'active'
   AND query LIKE '%storm_pay(%' LIMIT 1});
		return $backend if $backend;
		usleep(50_000);
	}
	return '';
}

# SIGKILL to a backend of `node` running a client's call, until one crashes
# the node (a call may end between being found and being killed): true when
# the server log shows the backend killed.
sub crash_during_a_call
{
	my ($node) = @_;
	for (1 .. 20)
	{
		my $backend = backend_in_a_call($node);
		return 1 if $backend && crash_backend($node, $backend);
	}
	return 0;
}

# SIGKILL to the postmaster of `node` and every process it started, at
# once: the postmaster is stopped first, so that it starts nothing new.
sub power_cut
{
	my ($node) = @_;
	open my $pidfile, '<', $node->data_dir . '/postmaster.pid' or die;
	my $postmaster = <$pidfile>;
	chomp $postmaster;
	kill 'STOP', $postmaster;
	my @children = split ' ', `pgrep -P $postmaster`;
	kill 'KILL', @children;
	$node->kill9;
	# Until its parent reaps it, the postmaster's pid still counts as a
	# running postmaster for the next start.
	for (1 .. 600)
	{
		last unless kill 0, $postmaster;
		usleep(100_000);
	}
	return;
}

my %storm_figures;
my $storm_started = time;
ok(storm_reaches($storm_started, 6), 'the storm answers keys before the first fault');
for my $victim ($workers[0], $coordinator)
{
	my $crashed = crash_during_a_call($victim);
	ok($crashed, 'killed a backend of ' . $victim->name
		  . ' during a call: its log shows it, the node crash-restarted');
	$storm_figures{'crash restarts in a server log'} += $crashed;
	ok($victim->poll_query_until('postgres', 'SELECT true'),
		$victim->name . ' is back after its crash restart');
	my $back = time;
	ok(storm_reaches($back, 3), 'clients are answered again after the crash of ' . $victim->name);
}
for my $victim ($workers[1], $coordinator)
{
	ok(backend_in_a_call($victim), $victim->name . ' is running a call');
	my $offset = -s $victim->logfile;
	my $cut = time;
	power_cut($victim);
	my $seen = storm_reaches($cut, 1, 'failed');
	$victim->start;
	ok($victim->poll_query_until('postgres', 'SELECT true'),
		$victim->name . ' is back after its restart');
	my $back = time;
	my $recovered = $victim->log_contains(qr/database system was not properly shut down; automatic recovery in progress/,
		$offset);
	my $failures = storm_attempts_since($cut, 'failed') - storm_attempts_since($back, 'failed');
	ok($seen && $recovered, 'the power cut of ' . $victim->name
		  . " landed: clients saw $failures calls fail, its log shows the recovery");
	$storm_figures{'power cuts that landed'}++ if $seen && $recovered;
	$storm_figures{'calls failed during the power cut of ' . $victim->name} = $failures;
	ok(storm_reaches($back, 3), 'clients are answered again after the power cut of ' . $victim->name);
}
# Enough keys for the checker, however fast the machine: the storm goes on
# until clients have been answered for 30 keys.
my $keys_answered = sub {
	my $attempts = storm_attempts();
	return scalar grep { my $key = $_; grep { $_->{outcome} eq 'ok' } @{ $attempts->{$key} } }
	  keys %$attempts;
};
my $enough_deadline = time + $PostgreSQL::Test::Utils::timeout_default;
usleep(100_000) while $keys_answered->() < 30 && time < $enough_deadline;
open my $stop, '>', "$storm_dir/stop" or die;
close $stop;
my @storm_deaths;
for my $pid (sort { $a <=> $b } keys %storm_client_of)
{
	waitpid($pid, 0) == $pid or die "waitpid $pid: $!";
	push @storm_deaths, "client $storm_client_of{$pid} exited with status $?" if $? != 0;
}
is_deeply(\@storm_deaths, [], 'every storm client ran to its end');
$storm_figures{seconds} = sprintf('%.1f', time - $storm_started);

my $storm_attempts = storm_attempts();
# Every acknowledged key replays its first answer now.
my @answered = sort grep {
	grep { $_->{outcome} eq 'ok' } @{ $storm_attempts->{$_} }
} keys %$storm_attempts;
my %first_answer = map {
	my $key = $_;
	($key => (grep { $_->{outcome} eq 'ok' } @{ $storm_attempts->{$key} })[0])
} @answered;
my @replays = split /\n/, as_app(join '',
	map { "SELECT storm_pay($first_answer{$_}{tenant}, '$_', $first_answer{$_}{request});\n" } @answered);
my @storm_violations;
for my $i (0 .. $#answered)
{
	my $key = $answered[$i];
	push @storm_violations, "$key: replayed " . ($replays[$i] // 'nothing')
	  . ", its first answer was $first_answer{$key}{response}"
	  unless ($replays[$i] // '') eq "replayed|$first_answer{$key}{response}";
}

# The storm as check_storm reads it.
my %storm_effects;
for my $row (split /\n/, $coordinator->safe_psql('postgres',
	'SELECT key, tenant, effect, amount FROM storm_ledger'))
{
	my ($key, $tenant, $effect, $amount) = split /\|/, $row;
	push @{ $storm_effects{$key} },
	  { id => $effect, request => $amount, deltas => { $tenant => -$amount } };
}
my $storm = {
	attempts => $storm_attempts,
	effects => \%storm_effects,
	stored => { map { split /\|/, $_, 2 } split /\n/, $coordinator->safe_psql('postgres',
		q{SELECT key, response::text FROM idempotency.tenant_keys WHERE key LIKE 'storm-%'}) },
	balances => { map { split /\|/ } split /\n/, $coordinator->safe_psql('postgres',
		'SELECT tenant, balance FROM accounts WHERE tenant BETWEEN 9 AND 20') },
	expected_base => \%storm_base,
	answer_effect => sub { $_[0] =~ /"effect": "([0-9a-f-]+)"/ ? $1 : undef },
	every_key_answered => 1,
};
push @storm_violations, check_storm($storm);
my $storm_seen = landed_faults($storm_attempts);
$storm_figures{"seen by clients: $_"} = $storm_seen->{$_} for keys %$storm_seen;
$storm_figures{'answers that replayed'} =
  grep { $_->{outcome} eq 'ok' && !$_->{ran} } map { @$_ } values %$storm_attempts;
$storm_figures{'keys answered'} = @answered;
report_storm($storm, \@storm_violations, \%storm_figures);
my %storm_kinds;
$storm_kinds{ $_->{outcome} }++ for map { @$_ } values %$storm_attempts;
is_deeply([ sort grep { !/^(ok|IK422)$/ && !$storm_error_kinds{$_} } keys %storm_kinds ], [],
	'clients saw no error of another kind than the faults cause');
is(scalar @storm_violations, 0,
	'per key: every answer is the first, ran once and is applied once, as stored; '
	  . 'changed requests refused; the balances are explained');
cmp_ok(scalar @answered, '>=', 30, 'the storm answered at least 30 keys');
is($storm_figures{'crash restarts in a server log'}, 2, 'both crash restarts landed');
is($storm_figures{'power cuts that landed'}, 2, 'both power cuts landed');
cmp_ok($storm_figures{'answers that replayed'}, '>=', 1, 'duplicates after an answer replayed');
cmp_ok($storm_seen->{IK422s}, '>=', 1, 'changed requests after an answer were refused');
check_storm_controls($storm);

# --- a worker crash at the commit boundary ---------------------------------------
# The worker has written the request's commit record and waits to
# acknowledge it (for a synchronous standby that never connects, for this
# role only) when its backend is killed. The client never heard back; the
# withdrawal and its key committed together, so the retry replays.
$coordinator->safe_psql('postgres', q{
CREATE ROLE slow_committer LOGIN;
GRANT SELECT, UPDATE ON accounts TO slow_committer});
for my $worker (@workers)
{
	$worker->safe_psql('postgres', q{
SET citus.enable_ddl_propagation = off;
ALTER ROLE slow_committer SET synchronous_commit = on;
ALTER SYSTEM SET synchronous_commit = local;
ALTER SYSTEM SET synchronous_standby_names = 'never_connects';
SELECT pg_reload_conf()});
}
my $edge_tenant = 39;
my ($edge_worker) = grep {
	$_->port == $coordinator->safe_psql('postgres',
		"SELECT nodeport FROM citus_shards WHERE shardid = get_shard_id_for_distribution_column('accounts', $edge_tenant)")
} @workers;
my $committer = $coordinator->background_psql('postgres',
	extra_params => [ '-U', 'slow_committer' ], on_error_stop => 0);
$committer->query_until(qr/started/,
	qq{\\echo started\nSELECT pay($edge_tenant, 'commit-edge', 9);\n});
my $waiting = '';
for (1 .. 200)
{
	$waiting = $edge_worker->safe_psql('postgres', q{
SELECT pid FROM pg_stat_activity WHERE usename = 'slow_committer' AND wait_event = 'SyncRep'});
	last if $waiting;
	usleep(50_000);
}
ok($waiting, "the request's commit record is written, its acknowledgement waits");
kill 'KILL', $waiting if $waiting;
ok($edge_worker->poll_query_until('postgres', 'SELECT true'), 'the worker is back');
$committer->quit;
for my $worker (@workers)
{
	$worker->safe_psql('postgres', q{
ALTER SYSTEM RESET synchronous_standby_names;
ALTER SYSTEM RESET synchronous_commit;
SELECT pg_reload_conf()});
}
is(withdrawals($edge_tenant), '1', 'the withdrawal committed before the crash');
is(as_app(qq{SELECT key_state($edge_tenant, 'commit-edge')}, 'slow_committer'), 'done',
	'and its key with it');
is( as_app(qq{SELECT pay($edge_tenant, 'commit-edge', 9)}, 'slow_committer'),
	'{"tenant": 39, "balance": 99991}',
	'the retry replays the response the client never got');
is(withdrawals($edge_tenant), '1', 'and withdraws nothing');

# The key table depends on the extension's type.
is(sqlstate_of($coordinator, 'DROP EXTENSION idempotency'), '2BP01',
	'DROP EXTENSION is refused while idempotency.tenant_keys exists');

$coordinator->stop;
$_->stop for @workers;
done_testing();
