# Keys inside procedures that end transactions (COMMIT / ROLLBACK in a
# procedure called outside a transaction block):
#
# - two idempotent_call's, and two claim + complete pairs, with a COMMIT
#   between them: each key commits with its own transaction, a second CALL
#   replays both, and when the procedure fails after the first COMMIT only
#   the second key is left to run;
# - claim() then COMMIT before complete(): the COMMIT fails (25000), the
#   transaction's work rolls back, the key is free and its retry runs;
# - claim() then ROLLBACK: the claim ends with the transaction, and
#   complete() afterwards is 55000; nothing is stored, the retry runs.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use FindBin;
use lib $FindBin::RealBin;
use IdempotencyTest;

my $node = preloaded_node('procedures');
$node->safe_psql(
	'postgres', q{
CREATE EXTENSION idempotency;
CREATE TABLE runs (key text);
CREATE FUNCTION work(k text) RETURNS text LANGUAGE sql
  AS $$ INSERT INTO runs VALUES (k) RETURNING 'ran ' || k $$;

-- Two calls, each committed by the procedure; fails after the first COMMIT
-- when fail_second.
CREATE PROCEDURE two_calls(k1 text, k2 text, fail_second bool DEFAULT false)
LANGUAGE plpgsql AS $$
BEGIN
  PERFORM idempotency.idempotent_call(k1, NULL, 'SELECT work($1)', k1);
  COMMIT;
  IF fail_second THEN
    RAISE EXCEPTION 'second request failed' USING ERRCODE = 'P0001';
  END IF;
  PERFORM idempotency.idempotent_call(k2, NULL, 'SELECT work($1)', k2);
  COMMIT;
END $$;

-- A handler: claim, apply unless replayed, complete.
CREATE PROCEDURE handle(k text) LANGUAGE plpgsql AS $$
DECLARE claimed record;
BEGIN
  SELECT * INTO claimed FROM idempotency.claim(k, NULL);
  IF NOT claimed.replayed THEN
    INSERT INTO runs VALUES (k);
    PERFORM idempotency.complete(k, to_jsonb('handled ' || k));
  END IF;
END $$;

CREATE PROCEDURE two_handled(k1 text, k2 text) LANGUAGE plpgsql AS $$
BEGIN
  CALL handle(k1);
  COMMIT;
  CALL handle(k2);
  COMMIT;
END $$;

-- COMMIT between claim() and complete().
CREATE PROCEDURE claim_commit_complete(k text) LANGUAGE plpgsql AS $$
BEGIN
  PERFORM idempotency.claim(k, NULL);
  INSERT INTO runs VALUES (k);
  COMMIT;
  PERFORM idempotency.complete(k, '"too late"');
END $$;

-- ROLLBACK between claim() and complete().
CREATE PROCEDURE claim_rollback_complete(k text) LANGUAGE plpgsql AS $$
BEGIN
  PERFORM idempotency.claim(k, NULL);
  INSERT INTO runs VALUES (k);
  ROLLBACK;
  PERFORM idempotency.complete(k, '"too late"');
END $$;
});

sub stored
{
	my ($key) = @_;
	return $node->safe_psql('postgres',
		"SELECT state || coalesce(':' || (response #>> '{}'), '') FROM idempotency.lookup('$key')");
}

sub claim_locks
{
	return $node->safe_psql('postgres',
		"SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'");
}

# --- idempotent_call, COMMIT, idempotent_call -------------------------------
$node->safe_psql('postgres', "CALL two_calls('call-1', 'call-2')");
is(stored('call-1') . ' ' . stored('call-2'),
	'done:ran call-1 done:ran call-2', 'both keys committed with their responses');
$node->safe_psql('postgres', "CALL two_calls('call-1', 'call-2')");
is(runs_of($node, 'call-1') . runs_of($node, 'call-2'),
	'11', 'a second CALL replays both: each fn ran once');

is(sqlstate_of($node, "CALL two_calls('fail-1', 'fail-2', true)"),
	'P0001', 'a procedure failing after its first COMMIT fails');
is(stored('fail-1') . ' ' . stored('fail-2'),
	'done:ran fail-1 absent', 'the first key is committed, the second absent');
$node->safe_psql('postgres', "CALL two_calls('fail-1', 'fail-2')");
is(runs_of($node, 'fail-1') . runs_of($node, 'fail-2'),
	'11', 'the retry replays the first key and runs the second once');

# --- claim + complete, COMMIT, claim + complete ------------------------------
$node->safe_psql('postgres', "CALL two_handled('handled-1', 'handled-2')");
is(stored('handled-1') . ' ' . stored('handled-2'),
	'done:handled handled-1 done:handled handled-2',
	'both claimed keys committed with their responses');
$node->safe_psql('postgres', "CALL two_handled('handled-1', 'handled-2')");
is(runs_of($node, 'handled-1') . runs_of($node, 'handled-2'),
	'11', 'a second CALL replays both claims');

# --- claim, COMMIT, complete --------------------------------------------------
my ($rc, $stdout, $stderr) = $node->psql(
	'postgres', "CALL claim_commit_complete('commit-early')",
	extra_params => [ '-v', 'VERBOSITY=verbose' ]);
like($stderr,
	qr/25000: cannot commit a transaction that holds idempotency key "commit-early" without completing it/,
	'COMMIT before complete() fails with 25000, naming the key');
is(runs_of($node, 'commit-early'), '0', "the transaction's work rolled back");
is(stored('commit-early'), 'absent', 'the key is absent');
is(claim_locks(), '0', 'no claim is left behind');
$node->safe_psql('postgres', "CALL handle('commit-early')");
is(stored('commit-early') . ' ' . runs_of($node, 'commit-early'),
	'done:handled commit-early 1', 'the retry runs once and stores its response');

# --- claim, ROLLBACK, complete ------------------------------------------------
($rc, $stdout, $stderr) = $node->psql(
	'postgres', "CALL claim_rollback_complete('rolled-back')",
	extra_params => [ '-v', 'VERBOSITY=verbose' ]);
like($stderr,
	qr/55000: idempotency key "rolled-back" is not claimed by this transaction/,
	'complete() after the claiming transaction rolled back is 55000');
is(runs_of($node, 'rolled-back') . ' ' . stored('rolled-back'),
	'0 absent', 'nothing of it is stored');
is(claim_locks(), '0', 'no claim is left behind');
$node->safe_psql('postgres', "CALL handle('rolled-back')");
is(stored('rolled-back') . ' ' . runs_of($node, 'rolled-back'),
	'done:handled rolled-back 1', 'the retry runs once and stores its response');

done_testing();
