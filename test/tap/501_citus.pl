# Citus: a coordinator and two workers on localhost, each its own data
# directory, with shared_preload_libraries = 'citus,idempotency'. Keys live
# in the coordinator's local idempotency.keys; fn changes one tenant's row of
# a distributed table.
#
# - Retries replay, and conflicts answer as on a single node (IK409, IK422);
#   an error in fn stores nothing.
# - The key and the remote write commit together: a transaction that wrote a
#   key commits its workers through two-phase commit (PREPARE TRANSACTION,
#   then COMMIT PREPARED; a record in pg_dist_transaction). A crash of the
#   coordinator after its commit, before the workers' COMMIT PREPARED, keeps
#   both once Citus's recovery has run; a crash after the workers prepared,
#   before the coordinator's commit, loses both. Either way a retry does not
#   withdraw twice.
# - idempotency.keys made a Citus table (distributed or reference) is
#   refused (0A000) on every node and skipped by the expiry worker; made a
#   local table again (docs/scale-out.md), calls work again and the keys are
#   still there.
#
# With PostgreSQL 16 or later (Citus exports only its SQL API there), only
# the refusal of a key with remote writes is checked.
#
# Needs Citus installed in the PostgreSQL under test; without it the file
# says so and is skipped. CITUS_TEST_PORT, when set, is the first of three
# TCP ports for the nodes; otherwise free ports are picked.
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

# The coordinator can be made to wait right after its commit record is
# flushed, before the transaction's commit callbacks (where Citus sends
# COMMIT PREPARED): a session with synchronous_commit = on waits for a
# synchronous standby that never connects. Every other session commits with
# synchronous_commit = local and does not wait.
my ($coordinator, @workers) = citus_cluster(
	slot => 0,
	coordinator_conf => q{
wal_level = replica
max_wal_senders = 2
synchronous_standby_names = 'never_connects'
synchronous_commit = local
restart_after_crash = on
});

# fn is plpgsql: with Citus 13.2.2 on PostgreSQL 15, a LANGUAGE sql function
# whose UPDATE takes Citus's fast path crashes the backend, with or without
# this extension.
$coordinator->safe_psql(
	'postgres', q{
CREATE EXTENSION idempotency;
CREATE TABLE accounts (tenant int PRIMARY KEY, balance bigint NOT NULL CHECK (balance >= 0));
SELECT create_distributed_table('accounts', 'tenant');
INSERT INTO accounts SELECT g, 1000 FROM generate_series(1, 20) g;
CREATE FUNCTION withdraw(account int, amount bigint) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
  left_over bigint;
BEGIN
  UPDATE accounts SET balance = balance - amount WHERE tenant = account
    RETURNING balance INTO left_over;
  RETURN jsonb_build_object('tenant', account, 'balance', left_over);
END $$;
});
my $extversion = q{SELECT extversion FROM pg_extension WHERE extname = 'idempotency'};
is( $workers[0]->safe_psql('postgres', $extversion),
	$coordinator->safe_psql('postgres', $extversion),
	'CREATE EXTENSION idempotency on the coordinator reached the workers');

sub call_sql
{
	my ($key, $tenant, $amount) = @_;
	return "SELECT idempotency.idempotent_call('$key', NULL, "
	  . "'SELECT withdraw(\$1, \$2)', $tenant, ${amount}::bigint), "
	  . 'idempotency.last_call_replayed()';
}

sub call
{
	my ($key, $tenant, $amount) = @_;
	return $coordinator->safe_psql('postgres', call_sql($key, $tenant, $amount));
}

sub balance
{
	my ($tenant) = @_;
	return $coordinator->safe_psql('postgres',
		"SELECT balance FROM accounts WHERE tenant = $tenant");
}

sub key_state
{
	my ($key) = @_;
	return $coordinator->safe_psql('postgres',
		"SELECT state FROM idempotency.lookup('$key')");
}

sub prepared_on_workers
{
	my $count = 0;
	$count += $_->safe_psql('postgres', 'SELECT count(*) FROM pg_prepared_xacts')
	  for @workers;
	return $count;
}

sub commit_records
{
	return $coordinator->safe_psql('postgres',
		'SELECT count(*) FROM pg_dist_transaction');
}

# The statements Citus sent to the workers while running `sql`.
sub remote_commands
{
	my ($sql) = @_;
	my ($rc, $stdout, $stderr) = $coordinator->psql('postgres',
		"SET citus.log_remote_commands = on; $sql");
	die "failed: $sql\n$stderr" if $rc != 0;
	return $stderr;
}

# --- Citus without its transaction manager's functions -------------------------
#
# Citus built for PostgreSQL 16 and later exports only the functions of its
# SQL API, not those through which the extension asks it for two-phase
# commit: a call whose fn writes on a worker is refused (0A000) and keeps
# nothing; a call that stays on the coordinator works.
if ($coordinator->safe_psql('postgres', 'SHOW server_version_num') >= 160000)
{
	my ($rc, $stdout, $stderr) = $coordinator->psql(
		'postgres', call_sql('pay-1', 1, 100),
		extra_params => [ '-v', 'VERBOSITY=verbose' ]);
	like(
		$stderr,
		qr/ERROR:\s+0A000: idempotency.keys cannot commit together with Citus's remote writes/,
		'a key on the coordinator with a remote write is refused where Citus cannot be asked for two-phase commit');
	like($stderr, qr/HINT:.*tenant keys/, '... naming tenant keys instead');
	is(key_state('pay-1'), 'absent', '... stores no key');
	is(balance(1), '1000', '... and withdraws nothing');
	my $local = q{SELECT idempotency.idempotent_call('local-1', NULL, 'SELECT 1'),
		idempotency.last_call_replayed()};
	is($coordinator->safe_psql('postgres', $local),
		'1|f', 'a call that stays on the coordinator runs');
	is($coordinator->safe_psql('postgres', $local),
		'1|t', '... and replays');
	done_testing();
	exit;
}

# --- the retry scenario on a distributed table ----------------------------------

is(call('pay-1', 1, 100), '{"tenant": 1, "balance": 900}|f',
	'the first call withdraws on the worker');
is(call('pay-1', 1, 100), '{"tenant": 1, "balance": 900}|t',
	'the retry replays the stored response');
is(balance(1), '900', '... and withdraws nothing');
is(sqlstate_of($coordinator, call_sql('pay-1', 1, 999)),
	'IK422', 'the same key with another request answers IK422');
is(balance(1), '900', '... and withdraws nothing');

my $holder = $coordinator->background_psql('postgres');
$holder->query_safe('BEGIN');
my $held = $holder->query_safe(call_sql('pay-2', 2, 100));
is(sqlstate_of($coordinator, call_sql('pay-2', 2, 100)),
	'IK409', 'a key held by an open transaction answers IK409 at once');
$holder->query_safe('COMMIT');
$holder->quit;
is(call('pay-2', 2, 100), $held =~ s/\|f$/|t/r,
	"once the holder commits, the retry replays the holder's response");
is(balance(2), '900', '... withdrawn once');

is(sqlstate_of($coordinator, call_sql('pay-3', 3, 5000)),
	'23514', "an error in fn (the worker's CHECK) reaches the caller unchanged");
is(key_state('pay-3'), 'absent', '... stores no key');
is(balance(3), '1000', '... and withdraws nothing');

$coordinator->safe_psql('postgres',
	'BEGIN; ' . call_sql('pay-4', 4, 100) . '; ROLLBACK');
is(key_state('pay-4'), 'absent', 'a call rolled back leaves no key');
is(balance(4), '1000', '... and no withdrawal');
is(call('pay-4', 4, 100), '{"tenant": 4, "balance": 900}|f',
	'... so the retry runs');

# --- two-phase commit -------------------------------------------------------------

my $records = commit_records();
my $log = remote_commands(call_sql('pay-5', 5, 100));
like($log, qr/issuing PREPARE TRANSACTION/,
	"a single-shard call prepares the worker's transaction");
like($log, qr/issuing COMMIT PREPARED/, '... and commits it after the coordinator');
unlike($log, qr/issuing COMMIT\n/, '... never with a plain COMMIT');
is(commit_records() - $records,
	1, '... with the commit record in pg_dist_transaction');

$records = commit_records();
$log = remote_commands(call_sql('pay-5', 5, 100));
unlike($log, qr/issuing/, 'a replay sends nothing to the workers');
is(commit_records() - $records, 0, '... and records no commit');

# What Citus does on its own, for comparison: a single-shard write without
# a key commits with a plain COMMIT before the coordinator does.
$records = commit_records();
$log = remote_commands(
	'BEGIN; UPDATE accounts SET balance = balance WHERE tenant = 11; COMMIT');
like($log, qr/issuing COMMIT\n/,
	'without a key, Citus commits a single-shard write with a plain COMMIT');
is(commit_records() - $records, 0, '... and records nothing');

# citus.function_opens_transaction_block = off would let Citus commit fn's
# remote write on its own, at once, outside any transaction: idempotent_call
# turns it on while fn runs.
my ($rc, $setting, $stderr) = $coordinator->psql(
	'postgres',
	'SET citus.log_remote_commands = on; '
	  . 'SET citus.function_opens_transaction_block = off; '
	  . call_sql('pay-6', 6, 100)
	  . '; SHOW citus.function_opens_transaction_block');
like(
	$stderr,
	qr/issuing BEGIN.*issuing UPDATE.*issuing PREPARE TRANSACTION/s,
	'with function_opens_transaction_block off, fn still runs in a prepared transaction');
like($setting, qr/\|f\noff$/, '... and the setting is off again after the call');

# Remote work after the key is written: claim() and complete(), then the
# handler's own UPDATE.
$log = remote_commands(q{BEGIN;
SELECT replayed FROM idempotency.claim('app-1', 'request-1');
SELECT idempotency.complete('app-1', '{"ok": true}');
UPDATE accounts SET balance = balance - 10 WHERE tenant = 7;
COMMIT});
like($log, qr/issuing PREPARE TRANSACTION/,
	'a remote write after complete() is prepared too');
is(key_state('app-1'), 'done', '... and the key committed with it');
is(balance(7), '990', '... as did the write');
$coordinator->safe_psql('postgres', 'SELECT recover_prepared_transactions()');

# --- a crash after the coordinator's commit, before COMMIT PREPARED ---------------

my $victim = $coordinator->background_psql('postgres', on_error_stop => 0);
my $victim_pid = $victim->query_safe('SELECT pg_backend_pid()');
$victim->query_safe('SET synchronous_commit = on');
$victim->query_until(qr/calling/,
	"\\echo calling\n" . call_sql('crash-after', 8, 100) . ";\n");
$coordinator->poll_query_until('postgres',
	"SELECT wait_event = 'SyncRep' FROM pg_stat_activity WHERE pid = $victim_pid")
  or die 'the call never reached its commit';
is(prepared_on_workers(), 1,
	"the coordinator has committed; the worker's part is prepared, not committed");

kill 'KILL', $victim_pid;
wait_until_serving($coordinator);
eval { $victim->quit };

is(key_state('crash-after'), 'done',
	"after the crash the coordinator's commit holds the key");
is(prepared_on_workers(), 1, "... and the worker's part still waits");
is(call('crash-after', 8, 100), '{"tenant": 8, "balance": 900}|t',
	'... a retry replays at once, even before recovery');
is($coordinator->safe_psql('postgres', 'SELECT recover_prepared_transactions()'),
	'1', "Citus's recovery commits the prepared part");
is(prepared_on_workers(), 0, '... leaving nothing prepared');
is(balance(8), '900', '... and the withdrawal happened once');
is(call('crash-after', 8, 100), '{"tenant": 8, "balance": 900}|t',
	'... and the retry still replays');
is(balance(8), '900', '... without withdrawing again');

# --- a crash after the workers prepared, before the coordinator's commit ----------
#
# The call's transaction wrote a temporary table created ON COMMIT DELETE
# ROWS; emptying it at commit takes an exclusive lock on it, after Citus's
# PRE_COMMIT callback (which prepares the workers) and before the commit
# record. Another session holds a lock on that table, so the commit waits
# right there.

$victim = $coordinator->background_psql('postgres', on_error_stop => 0);
$victim_pid = $victim->query_safe('SELECT pg_backend_pid()');
$victim->query_safe('CREATE TEMP TABLE pause (x int) ON COMMIT DELETE ROWS');
my $pause = $victim->query_safe(
	q{SELECT quote_ident(nspname) || '.pause' FROM pg_namespace WHERE oid = pg_my_temp_schema()});
my $blocker = $coordinator->background_psql('postgres', on_error_stop => 0);
$blocker->query_safe("BEGIN; LOCK TABLE $pause IN ACCESS SHARE MODE");
$victim->query_until(qr/committing/,
	    "BEGIN;\n"
	  . call_sql('crash-before', 9, 100) . ";\n"
	  . "INSERT INTO pause VALUES (1);\n"
	  . "\\echo committing\n"
	  . "COMMIT;\n");
$coordinator->poll_query_until('postgres',
	"SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $victim_pid")
  or die 'the commit never waited';
is(prepared_on_workers(), 1,
	"before the coordinator's commit, the worker's part is prepared, not committed");

kill 'KILL', $victim_pid;
wait_until_serving($coordinator);
eval { $victim->quit };
eval { $blocker->quit };

is(key_state('crash-before'), 'absent',
	'after the crash the key is absent: the coordinator never committed');
is($coordinator->safe_psql('postgres', 'SELECT recover_prepared_transactions()'),
	'1', "Citus's recovery rolls the prepared part back");
is(prepared_on_workers(), 0, '... leaving nothing prepared');
is(balance(9), '1000', '... so the withdrawal is gone with the key');
is(call('crash-before', 9, 100), '{"tenant": 9, "balance": 900}|f',
	'the retry runs the withdrawal');
is(call('crash-before', 9, 100), '{"tenant": 9, "balance": 900}|t',
	'... once: the next retry replays');
is(balance(9), '900', '... and the account was charged once in all');

# --- idempotency.keys as a Citus table is refused ---------------------------------

# The expiry worker runs every second from here on.
$coordinator->append_conf('postgresql.conf', "idempotency.expire_interval = '1s'\n");
$coordinator->reload;

# Makes idempotency.keys a local table again, keeping its keys: the steps of
# docs/scale-out.md (undistribute_table refuses a table that belongs to an
# extension).
my $make_local = q{
BEGIN;
SET LOCAL citus.multi_shard_modify_mode TO 'sequential';
CREATE TABLE idempotency_keys_saved AS
  SELECT scope::text AS role, key, key_digest, request_hash, response, created_at, expires_at
  FROM idempotency.keys;
ALTER EXTENSION idempotency DROP VIEW idempotency.stats;
ALTER EXTENSION idempotency DROP VIEW idempotency.key_usage;
ALTER EXTENSION idempotency DROP TABLE idempotency.keys;
DROP TABLE idempotency.keys CASCADE;
DROP EXTENSION idempotency;
CREATE EXTENSION idempotency;
INSERT INTO idempotency.keys (scope, key, key_digest, request_hash, response, created_at, expires_at)
  SELECT role::idempotency.role_scope, key, key_digest, request_hash, response, created_at, expires_at
  FROM idempotency_keys_saved;
DROP TABLE idempotency_keys_saved;
COMMIT;
};

for my $case (
	[ 'distributed', q{SELECT create_distributed_table('idempotency.keys', 'scope')} ],
	[ 'reference', q{SELECT create_reference_table('idempotency.keys')} ])
{
	my ($kind, $convert) = @$case;
	my $offset = -s $coordinator->logfile;
	my $before = balance(10);
	# Citus itself refuses a table with triggers, and the key table has one
	# (keys_loaded, for rows loaded from dumps); a DBA who drops it first gets
	# the table converted, and the extension's own refusal below.
	my (undef, undef, $refused) = $coordinator->psql('postgres', $convert);
	like($refused, qr/because it has triggers/,
		"$kind: Citus refuses the key table while keys_loaded is on it");
	$coordinator->safe_psql('postgres',
		"DROP TRIGGER keys_loaded ON idempotency.keys; $convert");

	my ($rc, $stdout, $stderr) = $coordinator->psql('postgres', call_sql("new-$kind", 10, 1));
	like(
		$stderr,
		qr/ERROR:  idempotency.keys is a Citus $kind table/,
		"$kind: idempotent_call refuses the table");
	like($stderr, qr/HINT:  Make idempotency.keys a local table again/,
		'... with a hint to make it local again');
	is(sqlstate_of($coordinator, call_sql('pay-1', 1, 100)),
		'0A000', '... a retry of a stored key too (0A000)');
	is( sqlstate_of(
			$coordinator,
			"BEGIN; SELECT * FROM idempotency.claim('app-$kind', 'r'); COMMIT"),
		'0A000',
		'... and claim()');
	is(sqlstate_of($coordinator, q{SELECT * FROM idempotency.lookup('pay-1')}),
		'0A000', '... and lookup()');
	is(sqlstate_of($coordinator, q{SELECT idempotency.forget('pay-1')}),
		'0A000', '... and forget()');
	is(sqlstate_of($coordinator, 'SELECT idempotency.expire()'),
		'0A000', '... and expire()');
	is(sqlstate_of($workers[0], call_sql("on-worker-$kind", 10, 1)),
		'0A000', '... and so does a worker, which has the metadata too');
	is(balance(10), $before, '... and nothing ran');

	$coordinator->wait_for_log(
		qr/WARNING:  idempotency expiry skipped database "postgres": idempotency.keys is a Citus $kind table/,
		$offset);
	ok( $coordinator->poll_query_until(
			'postgres',
			"SELECT last_error = 'idempotency.keys is a Citus $kind table' "
			  . 'FROM idempotency.expiry_status WHERE datname = current_database()'),
		'... the expiry worker skips the database and says why in expiry_status');

	$coordinator->safe_psql('postgres', $make_local);
	is($coordinator->safe_psql('postgres',
		q{SELECT count(*) FROM pg_dist_partition WHERE logicalrelid::text LIKE 'idempotency.%'}),
		'0', "$kind: made local again");
	is(call('pay-1', 1, 100), '{"tenant": 1, "balance": 900}|t',
		'... a stored key replays its response');
	is( call("new-$kind", 10, 1),
		'{"tenant": 10, "balance": ' . ($before - 1) . '}|f',
		'... and a new key runs');
}

is(prepared_on_workers(), 0, 'no prepared transaction is left on the workers');
$_->stop for ($coordinator, @workers);
done_testing();
