# Where a tenant key is written, on a coordinator and two workers on
# localhost: into the tenant's shard on the worker that holds it, through
# Citus's router and under its placement lock, by sessions
# connected to the workers themselves (their backends keep the statements'
# plans and what they last checked between calls).
#
# - A DBA's CHECK constraint and BEFORE INSERT trigger on the key table act
#   on the key's row (23514; a trigger that skips the row or moves it to
#   another key: 09000), and the request leaves nothing; a column a DBA
#   added gets its default. A key stored earlier in the same statement
#   replays.
# - Citus's rules for a transaction that reaches this node's shards: a
#   transaction that already reached them through a connection writes its key
#   through Citus (a later statement over that connection sees it); a key
#   written here is seen by a later multi-shard statement of the same
#   transaction. A backend's memory for the key's INSERT does not grow with
#   the keys it stores.
# - A shard move (logical replication) while a request is in flight on the
#   old node: the move waits for it, and carries its key; a request that
#   arrives during the switch-over, and a later one in a session that stored
#   keys there before the move, get 40001 and write nothing into the old
#   placement, nor does a transaction whose snapshot predates the move
#   (Citus's metadata is read as of now); on the new node every key is there
#   once and replays, and each request ran once. Moved back, a session that
#   stored keys in the shard's old relation writes into the new one.
# - Every replay answers byte for byte what the key's first run answered,
#   and runs nothing: fn records each run with its key (table runs), and
#   each key's runs are counted after each replay.
#
# Needs Citus; without it the file says so and is skipped. CITUS_TEST_PORT,
# when set, is the first of fifteen TCP ports (this file uses the last
# three; 501 to 504 the twelve before).
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

# The old placement of a moved shard stays until the test drops it
# (citus_cleanup_orphaned_resources), instead of whenever the maintenance
# daemon comes round.
my ($coordinator, @workers) = citus_cluster(
	slot => 4,
	conf => "idempotency.expire_interval = 0\n",
	coordinator_conf => "citus.defer_shard_delete_interval = -1\n",
	shard_moves => 1);

$coordinator->safe_psql(
	'postgres',
	tenant_accounts_sql(shard_count => 4, balance => 1000) . q{
-- withdraw, recording in runs the key it ran for (co-located with the
-- accounts: it moves with them).
CREATE TABLE runs (tenant bigint NOT NULL, key text NOT NULL);
SELECT create_distributed_table('runs', 'tenant', colocate_with => 'accounts');
CREATE FUNCTION withdraw_as(account bigint, amount bigint, k text) RETURNS jsonb
LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO runs VALUES (account, k);
  RETURN withdraw(account, amount);
END $$;
-- The same, held back by an advisory lock (the gate) the test holds.
CREATE FUNCTION withdraw_gated(account bigint, amount bigint, k text) RETURNS jsonb
LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_advisory_xact_lock_shared(4242);
  RETURN withdraw_as(account, amount, k);
END $$;
-- A key whose fn reaches no distributed table, then every shard of the keys.
CREATE FUNCTION call_then_count(k text) RETURNS bigint LANGUAGE plpgsql AS $$
BEGIN
  PERFORM idempotency.tenant_call(1::bigint, k, NULL,
    'SELECT pg_catalog.jsonb_build_object(''k'', $1)', k);
  RETURN (SELECT count(*) FROM idempotency.tenant_keys AS t WHERE t.key = k);
END $$;
SELECT idempotency.distribute_keys('accounts');
});

my $tenant = 1;
my $shard = $coordinator->safe_psql('postgres',
	"SELECT get_shard_id_for_distribution_column('idempotency.tenant_keys', $tenant)");
my $home_port = $coordinator->safe_psql('postgres',
	"SELECT nodeport FROM citus_shards WHERE shardid = $shard");
my ($source) = grep { $_->port == $home_port } @workers;
my ($target) = grep { $_->port != $home_port } @workers;

sub call_sql
{
	my ($key, $fn) = @_;
	$fn //= 'withdraw_as';
	return "SELECT idempotency.tenant_call(${tenant}::bigint, '$key', NULL, "
	  . "'SELECT $fn(\$1, \$2, \$3)', ${tenant}::bigint, 1::bigint, '$key'::text)";
}

sub withdrawals
{
	return $coordinator->safe_psql('postgres',
		"SELECT withdrawals FROM accounts WHERE tenant = $tenant");
}

# How often fn ran for the key (committed runs, as Citus sees table runs).
sub runs_for
{
	my ($key) = @_;
	return $coordinator->safe_psql('postgres',
		"SELECT count(*) FROM runs WHERE tenant = $tenant AND key = '$key'");
}

# How many rows the key has in the tenant's keys, as Citus sees the table.
sub stored
{
	my ($key) = @_;
	return $coordinator->safe_psql('postgres',
		"SELECT count(*) FROM idempotency.tenant_keys WHERE tenant = $tenant AND key = '$key'");
}

# A session of the superuser on a worker that goes on across the test.
sub session_on
{
	my ($node) = @_;
	my $session = $node->background_psql('postgres', on_error_stop => 0);
	$session->query_safe('\set VERBOSITY verbose');
	return $session;
}

# The SQLSTATE of the statement's error in the session, or 'no error'.
sub session_sqlstate
{
	my ($session, $sql) = @_;
	my ($output, $failed) = $session->query($sql);
	my $stderr = $session->{stderr};
	$session->{stderr} = '';
	return 'no error' unless $failed;
	return $stderr =~ /ERROR:\s+([0-9A-Z]{5}):/ ? $1 : "unknown: $stderr";
}

my $on_source = session_on($source);
my $on_target = session_on($target);

# --- a DBA's constraint and trigger --------------------------------------------
like($on_source->query_safe(call_sql('first')), qr/"balance"/, 'a new key runs on the worker');
is(stored('first'), '1', 'and is stored');
my $ran = withdrawals();

$coordinator->safe_psql('postgres', q{
ALTER TABLE idempotency.tenant_keys ADD CONSTRAINT no_rejected CHECK (key <> 'rejected')});
is(session_sqlstate($on_source, call_sql('rejected')), '23514',
	"a CHECK constraint a DBA added refuses the key's row");
is(stored('rejected') . '|' . withdrawals(), "0|$ran", 'and the request left nothing');
$coordinator->safe_psql('postgres', q{
ALTER TABLE idempotency.tenant_keys DROP CONSTRAINT no_rejected});

$coordinator->safe_psql('postgres', q{
SET citus.enable_unsafe_triggers = on;
CREATE FUNCTION skip_some() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.key = 'skipped' THEN
    RETURN NULL;
  END IF;
  IF NEW.key = 'renamed' THEN
    NEW.key := 'renamed-by-trigger';
  END IF;
  NEW.response := NEW.response || '{"seen": true}';
  RETURN NEW;
END $$;
CREATE TRIGGER skip_some BEFORE INSERT ON idempotency.tenant_keys
  FOR EACH ROW EXECUTE FUNCTION skip_some()});
is(session_sqlstate($on_source, call_sql('skipped')), '09000',
	'a BEFORE INSERT trigger that skips the row makes the request fail');
is(stored('skipped') . '|' . withdrawals(), "0|$ran", 'and the request left nothing');
is(session_sqlstate($on_source, call_sql('renamed')), '09000',
	"a BEFORE INSERT trigger that moves the row to another key makes the request fail");
is( stored('renamed') . '|' . stored('renamed-by-trigger') . '|' . withdrawals(),
	"0|0|$ran", 'and the request left nothing');
like($on_source->query_safe(call_sql('changed')), qr/"balance"/,
	'a key the trigger lets through is stored');
$ran++;
is( $coordinator->safe_psql('postgres', q{
SELECT response->>'seen' FROM idempotency.tenant_keys WHERE key = 'changed'}),
	'true', "as the trigger changed it");
$coordinator->safe_psql('postgres', q{
SET citus.enable_unsafe_triggers = on;
DROP TRIGGER skip_some ON idempotency.tenant_keys;
DROP FUNCTION skip_some()});

# A column a DBA added gets its default in the key's row.
$coordinator->safe_psql('postgres', q{
ALTER TABLE idempotency.tenant_keys ADD COLUMN note text DEFAULT 'added by the DBA'});
my $with_note = $on_source->query_safe(call_sql('with-note'));
like($with_note, qr/"balance"/, 'a key is stored after a DBA added a column');
$ran++;
is( $coordinator->safe_psql('postgres', q{
SELECT note FROM idempotency.tenant_keys WHERE key = 'with-note'}),
	'added by the DBA', "and its row has the column's default");
$coordinator->safe_psql('postgres', q{
ALTER TABLE idempotency.tenant_keys DROP COLUMN note});
is($on_source->query_safe(call_sql('with-note')), $with_note,
	'after the column is dropped again, the key replays its first answer byte for byte');
is(runs_for('with-note') . '|' . withdrawals(), "1|$ran", 'without running again');

# A key stored earlier in the same statement is seen by the next call:
# the second call replays.
my $twice = call_sql('twice-in-one');
my ($first_of_two, $second_of_two) =
  split /\|/, $on_source->query_safe("SELECT ($twice)::text, ($twice)::text");
like($first_of_two, qr/"balance"/, 'a key called twice in one statement runs the first time');
is($second_of_two, $first_of_two, 'and the second call answers the same, byte for byte');
$ran++;
is(stored('twice-in-one') . '|' . runs_for('twice-in-one') . '|' . withdrawals(), "1|1|$ran",
	'it is stored once, and its request ran once');

# The statement that writes keys keeps no plan that grows with the calls a
# backend makes (a kept generic plan would: Citus 13.2.2 and 14.0.1 add the
# shard's local plan to it at every call).
$on_source->query_safe(
	"SELECT count(*) FROM generate_series(1, 300) AS i, LATERAL (SELECT "
	  . "idempotency.tenant_call(${tenant}::bigint, 'many-' || i, NULL, "
	  . "'SELECT withdraw_as(\$1, \$2, \$3)', ${tenant}::bigint, 1::bigint, "
	  . "('many-' || i)::text)) AS c");
$ran += 300;
is( $on_source->query_safe(q{
SELECT coalesce(sum(total_bytes), 0) < 1048576 FROM pg_backend_memory_contexts
 WHERE name = 'CachedPlan' AND ident LIKE 'INSERT INTO idempotency.tenant_keys%'}),
	't', 'after 300 keys, a backend holds less than 1 MB of plans for their INSERT');
is(withdrawals(), $ran, 'each of them ran once');

# --- Citus's rules for the transaction -----------------------------------------
# Statements that reached this node's shards through a connection: Citus
# keeps the transaction on it, and so does the key.
$on_source->query_safe('BEGIN');
$on_source->query_safe('SET LOCAL citus.enable_local_execution TO off');
$on_source->query_safe("SELECT count(*) FROM accounts WHERE tenant = $tenant");
$on_source->query_safe('SET LOCAL citus.enable_local_execution TO on');
my $over_connection = $on_source->query_safe(call_sql('over-connection'));
like($over_connection, qr/"balance"/,
	'a transaction that reached the shard through a connection stores a key');
is( $on_source->query_safe(
		"SELECT count(*) FROM idempotency.tenant_keys WHERE tenant = $tenant AND key = 'over-connection'"),
	'1', 'which a later statement over that connection sees');
$on_source->query_safe('COMMIT');
$ran++;
is(stored('over-connection') . '|' . withdrawals(), "1|$ran", 'it is stored once, and ran once');
is($on_source->query_safe(call_sql('over-connection')), $over_connection,
	'and replays its first answer byte for byte');
is(runs_for('over-connection') . '|' . withdrawals(), "1|$ran", 'without running again');

# A multi-shard statement after the key, in one statement outside a
# transaction block: Citus would use connections to this node's shards too,
# unless told the transaction wrote one here.
$on_source->query_safe('SET citus.function_opens_transaction_block TO off');
is($on_source->query_safe(q{SELECT call_then_count('seen-later')}), '1',
	'a later multi-shard statement of the transaction sees the key');
$on_source->query_safe('RESET citus.function_opens_transaction_block');
is(stored('seen-later'), '1', 'which is stored once');

# --- a shard move --------------------------------------------------------------
my $before_move = $on_source->query_safe(call_sql('before-move'));
like($before_move, qr/"balance"/, "a session on the shard's worker stores a key before the move");
$ran++;
is(session_sqlstate($on_target, call_sql('not-here')), '0A000',
	'a session on the other worker is refused the tenant');

my $gate = $source->background_psql('postgres');
$gate->query_safe('SELECT pg_advisory_lock(4242)');
sub start_psql
{
	my ($node, $sql) = @_;
	my %run = (out => '', err => '');
	$run{handle} = IPC::Run::start(
		[ 'psql', '-X', '-A', '-t', '-v', 'ON_ERROR_STOP=1', '-v', 'VERBOSITY=verbose',
		  '-h', $node->host, '-p', $node->port, '-d', 'postgres', '-c', $sql ],
		'>', \$run{out}, '2>', \$run{err});
	return \%run;
}
my $in_flight = start_psql($source, call_sql('in-flight', 'withdraw_gated'));
ok( $source->poll_query_until('postgres', q{
SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = 4242 AND objsubid = 1 AND NOT granted},
		'1'),
	'a request is in flight: past the placement check, held in fn');
# A transaction whose snapshot is taken before the move.
my $old_snapshot = session_on($source);
$old_snapshot->query_safe('BEGIN ISOLATION LEVEL REPEATABLE READ');
$old_snapshot->query_safe('SELECT count(*) FROM pg_catalog.pg_class');
my $move = start_psql($coordinator,
	"SELECT citus_move_shard_placement($shard, '127.0.0.1', ${\ $source->port }, "
	  . "'127.0.0.1', ${\ $target->port }, 'force_logical')");
# Citus's lock on the placement of the group of co-located shards (advisory,
# class 8).
my $placement_waiters = q{
SELECT count(*) FROM pg_locks
 WHERE locktype = 'advisory' AND objsubid = 8 AND mode = '%s' AND NOT granted};
ok($source->poll_query_until('postgres', sprintf($placement_waiters, 'ExclusiveLock'), '1'),
	'the move waits for the request before it switches the placement');
my $during = start_psql($source, call_sql('during-move'));
ok($source->poll_query_until('postgres', sprintf($placement_waiters, 'ShareLock'), '1'),
	'a request that arrives meanwhile waits for the move');
$gate->query_safe('SELECT pg_advisory_unlock(4242)');
$gate->quit;
$in_flight->{handle}->finish;
$move->{handle}->finish;
$during->{handle}->finish;
is($move->{err}, '', 'the move succeeded');
chomp(my $in_flight_answer = $in_flight->{out});
like($in_flight_answer, qr/"balance"/, 'the request in flight was answered');
$ran++;
like($during->{err}, qr/ERROR:\s+40001:/, 'the request that arrived during the move got 40001');
is( $coordinator->safe_psql('postgres', "SELECT nodeport FROM citus_shards WHERE shardid = $shard"),
	$target->port, 'the shard moved');

is(session_sqlstate($on_source, call_sql('after-move')), '40001',
	'a session that stored keys on the old node gets 40001 for a new key');
is(session_sqlstate($on_source, call_sql('before-move')), '40001', 'and for a stored one');
is(session_sqlstate($old_snapshot, call_sql('old-snapshot')), '40001',
	'so does a transaction whose snapshot predates the move: the placement is read as of now');
$old_snapshot->query_safe('ROLLBACK');
$old_snapshot->quit;

# The old placement is still there: nothing was written into it after the
# request in flight.
my $old_shard = "idempotency.tenant_keys_$shard";
is( $source->safe_psql('postgres', qq{
SELECT string_agg(key, ',' ORDER BY key) FROM $old_shard
 WHERE key IN ('in-flight', 'during-move', 'after-move')}),
	'in-flight', 'the old placement holds the key written before the switch-over, and no later one');

like($on_target->query_safe(call_sql('after-move')), qr/"balance"/,
	'on the new node, a session refused before runs the request');
$ran++;
is($on_target->query_safe(call_sql('in-flight', 'withdraw_gated')), $in_flight_answer,
	'the key written in flight during the move replays there its first answer, byte for byte');
is($on_target->query_safe(call_sql('before-move')), $before_move,
	'and so does the one before');
is( join('|', map { runs_for($_) } qw(in-flight before-move after-move during-move old-snapshot)),
	'1|1|1|0|0', 'each request ran once, per key; the refused ones not at all');
is(withdrawals(), $ran, 'each request ran once');
is( $coordinator->safe_psql('postgres', q{
SELECT string_agg(key || '=' || n, ',' ORDER BY key)
  FROM (SELECT key, count(*) AS n FROM idempotency.tenant_keys
         WHERE key IN ('before-move', 'in-flight', 'during-move', 'after-move') GROUP BY key) AS k}),
	'after-move=1,before-move=1,in-flight=1', 'every key is stored once; the refused one not at all');
is( $target->safe_psql('postgres',
		"SELECT count(*) FROM $old_shard WHERE key IN ('before-move', 'in-flight', 'after-move')"),
	'3', "and on the tenant's new node");

# Moved back, into a new relation of the shard on the first node.
$coordinator->safe_psql('postgres', 'CALL citus_cleanup_orphaned_resources()');
is($source->safe_psql('postgres', "SELECT to_regclass('$old_shard') IS NULL"),
	't', 'the old placement is dropped');
$coordinator->safe_psql('postgres',
	"SELECT citus_move_shard_placement($shard, '127.0.0.1', ${\ $target->port }, "
	  . "'127.0.0.1', ${\ $source->port }, 'force_logical')");
like($on_source->query_safe(call_sql('moved-back')), qr/"balance"/,
	'moved back, the session that stored keys in the old relation stores one in the new');
$ran++;
is($on_source->query_safe(call_sql('in-flight', 'withdraw_gated')), $in_flight_answer,
	'and replays a key its first answer, byte for byte');
is(runs_for('in-flight') . '|' . runs_for('moved-back') . '|' . withdrawals(), "1|1|$ran",
	'each request ran once');
is($source->safe_psql('postgres', "SELECT count(*) FROM $old_shard WHERE key = 'moved-back'"),
	'1', "the key is in the shard's new relation");
is(session_sqlstate($on_target, call_sql('moved-back')), '40001',
	'and the session on the node it left gets 40001');

$on_source->quit;
$on_target->quit;
done_testing();
