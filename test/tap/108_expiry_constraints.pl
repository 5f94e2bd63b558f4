# Expiry against what a DBA adds to idempotency.keys, and against a
# database's lock_timeout. A unique index on (scope, key), NOT NULL on
# response (both made where the extension's check does not run), a
# BEFORE trigger that skips a tombstone and a deferred constraint trigger
# each refuse some tombstones: the
# worker keeps those expired rows as they are and cleans
# the others in the same round, expiry_status and the log name the cause
# (never a key's text), a retry of a kept key is still refused with IK410,
# and once the DBA drops the object the next round expires the row. With
# lock_timeout set for a database whose key table a DBA holds locked, the
# worker reports skipped rounds, not a process that exits with an error.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib $FindBin::RealBin;
use IdempotencyTest;

my $node = preloaded_node('expiry_constraints',
	conf => "idempotency.expire_interval = '1s'\n");
$node->safe_psql('postgres', 'CREATE ROLE bob; CREATE EXTENSION idempotency');

sub new_database
{
	my ($db) = @_;
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	$node->safe_psql(
		$db, q{
CREATE EXTENSION idempotency;
CREATE TABLE runs (key text NOT NULL);
GRANT ALL ON runs TO PUBLIC;
CREATE FUNCTION work(op_key text) RETURNS jsonb LANGUAGE sql AS $$
  INSERT INTO runs VALUES (op_key) RETURNING jsonb_build_object('key', key)
$$;
});
}

sub call_sql
{
	my ($key) = @_;
	return "SELECT idempotency.idempotent_call('$key', NULL, "
	  . "'SELECT work(\$1)', '$key'::text);";
}

# Keys made in one transaction and expired together, each as `role`
# (undef: the superuser). `age` puts their expiry that far in the past.
sub expired_keys
{
	my ($db, $role, $age, @keys) = @_;
	my $as = defined $role ? "SET ROLE $role;" : '';
	$node->safe_psql($db,
		"BEGIN; $as"
		  . join('', map { call_sql($_) } @keys)
		  . 'RESET ROLE;'
		  . "UPDATE idempotency.keys SET expires_at = now() - interval '$age', "
		  . "created_at = now() - interval '$age' - interval '1 day' "
		  . "WHERE key IN ('"
		  . join("', '", @keys) . "');"
		  . 'COMMIT;');
}

sub status_of
{
	my ($db, $columns) = @_;
	return $node->safe_psql('postgres',
		"SELECT $columns FROM idempotency.expiry_status WHERE datname = '$db'");
}

# Waits for a round of `db` that started after this call.
sub next_round
{
	my ($db) = @_;
	my $now = $node->safe_psql('postgres', 'SELECT clock_timestamp()');
	$node->poll_query_until('postgres',
		"SELECT count(*) = 1 FROM idempotency.expiry_status "
		  . "WHERE datname = '$db' AND last_started > '$now'")
	  or die "no round in $db";
}

sub row_state
{
	my ($db, $key) = @_;
	return $node->safe_psql($db,
		"SELECT CASE WHEN expired_at IS NULL THEN 'live' ELSE 'tombstone' END "
		  . "FROM idempotency.keys WHERE key_digest = idempotency.key_digest('$key')"
	) || 'absent';
}

sub runs_in
{
	my ($db, $key) = @_;
	return $node->safe_psql($db, "SELECT count(*) FROM runs WHERE key = '$key'");
}

sub retry_sqlstate
{
	my ($db, $role, $key) = @_;
	my $as = defined $role ? "SET ROLE $role;" : '';
	my ($rc, $stdout, $stderr) = $node->psql(
		$db, $as . call_sql($key),
		on_error_stop => 0,
		extra_params => [ '-v', 'VERBOSITY=verbose' ]);
	return $stderr =~ /ERROR:\s+([0-9A-Z]{5}):/ ? $1 : 'no error';
}

# The WARNING about kept keys since log offset `from`, with its DETAIL and
# HINT lines.
sub kept_warning
{
	my ($from) = @_;
	my $log = slurp_file($node->logfile, $from);
	return $log =~ /(WARNING:[^\n]*idempotency expiry kept[^\n]*\n(?:[^\n]*(?:DETAIL|HINT):[^\n]*\n)*)/
	  ? $1
	  : '';
}

# One DBA object that refuses the tombstone of key `stuck`: the round
# converts `free` (as `free_role`), deletes `old` (past its whole window),
# keeps `stuck`; `drop_sql` removes the object.
sub check_kept_key
{
	my (%case) = @_;
	my ($db, $stuck, $free, $old) = @case{qw(db stuck free old)};
	my $log_from = -s $node->logfile;
	expired_keys($db, undef, '10 seconds', $stuck);
	expired_keys($db, $case{free_role}, '10 seconds', $free) if defined $free;
	expired_keys($db, undef, '8 days', $old);
	next_round($db);
	is(row_state($db, $stuck), 'live',
		"$case{name}: the key whose tombstone is refused keeps its row");
	is(row_state($db, $free), 'tombstone',
		"$case{name}: another expired key of the database became its tombstone in that round"
	) if defined $free;
	is(row_state($db, $old), 'absent',
		"$case{name}: a key past its whole window was deleted in that round");
	my ($kept, $reason, $error) =
	  split /\|/, status_of($db, 'last_kept, last_kept_reason, last_error'), -1;
	is($kept, 1, "$case{name}: expiry_status counts the kept key");
	like($reason, qr/^$case{reason}/,
		"$case{name}: expiry_status names the cause");
	unlike($reason, qr/\Q$stuck\E/,
		"$case{name}: ... without the key's text");
	is($error, '', "$case{name}: the round itself did not fail");
	my $warning = kept_warning($log_from);
	like($warning, $case{reason}, "$case{name}: the log names the cause");
	unlike($warning, qr/\Q$stuck\E|""/,
		"$case{name}: ... without the key's text, nor an empty one");

	is(retry_sqlstate($db, undef, $stuck), 'IK410',
		"$case{name}: a retry of the kept key is refused");
	is(runs_in($db, $stuck), 1, "$case{name}: ... its request ran once");

	$node->safe_psql($db, $case{drop_sql});
	next_round($db);
	is(row_state($db, $stuck), 'tombstone',
		"$case{name}: once the DBA drops it, the next round writes the tombstone"
	);
	is(status_of($db, "last_kept || '/' || coalesce(last_kept_reason, 'none')"),
		'0/none', "$case{name}: ... and expiry_status clears the cause");
	is(retry_sqlstate($db, undef, $stuck), 'IK410',
		"$case{name}: the tombstone still refuses the retry");
	is(runs_in($db, $stuck), 1, "$case{name}: ... its request ran once");
}

# --- a unique index on (scope, key): a role's second tombstone ------------
new_database('uniq');
expired_keys('uniq', undef, '10 seconds', 'u-first');
$node->poll_query_until('uniq',
	"SELECT count(*) = 1 FROM idempotency.keys WHERE expired_at IS NOT NULL")
  or die 'the first tombstone was not written';
# The extension refuses the index when it is made (sql/store_dba.sql); a
# database may have it from before 1.1, or from a session whose event
# triggers did not fire, as here.
$node->safe_psql('uniq',
	'SET session_replication_role = replica; '
	  . 'CREATE UNIQUE INDEX keys_scope_key ON idempotency.keys (scope, key)');
check_kept_key(
	name => 'unique index on (scope, key)',
	db => 'uniq',
	stuck => 'u-stuck',
	free => 'u-bob',
	free_role => 'bob',
	old => 'u-old',
	reason => qr/23505: .*"keys_scope_key"/,
	drop_sql => 'DROP INDEX idempotency.keys_scope_key');

# The form that holds for tombstones: a partial index over live keys.
$node->safe_psql('uniq',
	'CREATE UNIQUE INDEX keys_scope_key_live ON idempotency.keys (scope, key) '
	  . 'WHERE expired_at IS NULL');
expired_keys('uniq', undef, '10 seconds', 'u-partial');
next_round('uniq');
is(row_state('uniq', 'u-partial'), 'tombstone',
	'a unique index on (scope, key) WHERE expired_at IS NULL holds for tombstones');
is(status_of('uniq', 'last_kept'), '0', '... and keeps no key');

# --- NOT NULL on response: every tombstone -----------------------------
new_database('not_null');
$node->safe_psql('not_null',
	'SET session_replication_role = replica; '
	  . 'ALTER TABLE idempotency.keys ALTER COLUMN response SET NOT NULL');
check_kept_key(
	name => 'NOT NULL on response',
	db => 'not_null',
	stuck => 'n-stuck',
	old => 'n-old',
	reason => qr/23502: .*"response"/,
	drop_sql =>
	  'ALTER TABLE idempotency.keys ALTER COLUMN response DROP NOT NULL');

# --- a BEFORE trigger that skips one key's tombstone ---------------------
new_database('trig');
$node->safe_psql(
	'trig', q{
CREATE TABLE held (digest bytea);
INSERT INTO held VALUES (idempotency.key_digest('t-stuck'));
CREATE FUNCTION hold_tombstone() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.expired_at IS NOT NULL
     AND NEW.key_digest IN (SELECT digest FROM public.held) THEN
    RETURN NULL;
  END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER hold_tombstone BEFORE INSERT ON idempotency.keys
  FOR EACH ROW EXECUTE FUNCTION hold_tombstone();
});
check_kept_key(
	name => 'BEFORE trigger skipping a tombstone',
	db => 'trig',
	stuck => 't-stuck',
	free => 't-free',
	old => 't-old',
	reason =>
	  qr/09000: a BEFORE INSERT trigger on idempotency\.keys skipped the tombstone of an expired idempotency key/,
	drop_sql => 'DROP TRIGGER hold_tombstone ON idempotency.keys');

# --- a deferred constraint trigger that refuses one key's tombstone -------
# The worker checks deferred constraints as each row is written, not at
# the batch's commit, which would undo the whole batch every round.
new_database('deferred');
$node->safe_psql(
	'deferred', q{
CREATE TABLE held (digest bytea);
INSERT INTO held VALUES (idempotency.key_digest('d-stuck'));
CREATE FUNCTION refuse_held() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.expired_at IS NOT NULL
     AND NEW.key_digest IN (SELECT digest FROM public.held) THEN
    RAISE EXCEPTION 'tombstone held back' USING ERRCODE = '23514';
  END IF;
  RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER refuse_held AFTER INSERT ON idempotency.keys
  DEFERRABLE INITIALLY DEFERRED
  FOR EACH ROW EXECUTE FUNCTION refuse_held();
});
check_kept_key(
	name => 'deferred constraint trigger',
	db => 'deferred',
	stuck => 'd-stuck',
	free => 'd-free',
	old => 'd-old',
	reason => qr/23514: tombstone held back/,
	drop_sql => 'DROP TRIGGER refuse_held ON idempotency.keys');

# expire() keeps the row too, and warns its caller. The keys are made,
# expired and expired again in one transaction, out of the worker's sight.
$node->safe_psql(
	'trig', q{
CREATE TRIGGER hold_tombstone BEFORE INSERT ON idempotency.keys
  FOR EACH ROW EXECUTE FUNCTION hold_tombstone();
UPDATE held SET digest = idempotency.key_digest('t-manual');
});
my ($rc, $stdout, $stderr) = $node->psql(
	'trig',
	'BEGIN;'
	  . call_sql('t-manual')
	  . call_sql('t-manual-free')
	  . "UPDATE idempotency.keys SET expires_at = now() - interval '1 second' "
	  . "WHERE key IN ('t-manual', 't-manual-free');"
	  . 'SELECT idempotency.expire(); COMMIT;',
	on_error_stop => 1);
is($rc, 0, 'expire() with a refused tombstone succeeds');
is(row_state('trig', 't-manual'), 'live', '... keeps that key');
is(row_state('trig', 't-manual-free'), 'tombstone', '... expires the other');
like(
	$stderr,
	qr/WARNING:  idempotency expiry kept 1 expired keys of database "trig"/,
	'... and warns');
unlike($stderr, qr/t-manual|""/, '... naming no key');

# --- lock_timeout for a database whose key table is locked ---------------
new_database('locked');
$node->safe_psql('postgres', "ALTER DATABASE locked SET lock_timeout = '50ms'");
expired_keys('locked', undef, '10 seconds', 'l-1');
my $log_from = -s $node->logfile;
my $skipped = status_of('locked', 'coalesce(skipped_rounds, 0)') || 0;
my $holder = $node->background_psql('locked');
$holder->query_safe(
	'BEGIN; LOCK TABLE idempotency.keys IN ACCESS EXCLUSIVE MODE');
$node->poll_query_until('postgres',
	"SELECT skipped_rounds >= $skipped + 3 FROM idempotency.expiry_status WHERE datname = 'locked'"
) or die 'no skipped rounds while the table was locked';
like(status_of('locked', 'last_error'),
	qr/^round skipped: .*lock timeout \(SQLSTATE 55P03\)$/,
	'a round that meets the lock timeout is recorded as skipped');
is(status_of('locked', 'failed_rounds'), '0', '... not as failed');
$holder->query_safe('COMMIT');
$holder->quit;
next_round('locked');
is(row_state('locked', 'l-1'), 'tombstone',
	'once the lock is gone, the next round expires the key');
is(status_of('locked', "coalesce(last_error, 'none')"), 'none',
	'... and succeeds');
my $log = slurp_file($node->logfile, $log_from);
unlike($log, qr/exited with exit code 1/,
	'no expiry worker exited with an error while the table was locked');
like($log,
	qr/LOG:  idempotency expiry skipped the rest of its round in database "locked": canceling statement due to lock timeout/,
	'the log says the round was skipped');

done_testing();
