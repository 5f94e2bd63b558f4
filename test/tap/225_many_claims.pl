# Many claims in one transaction against a small lock table
# (max_locks_per_transaction = 10). Each claim holds a lock until the
# transaction ends when it is taken or completed inside a subtransaction,
# or not completed at all, and the shared lock table runs out:
#
# - a batch below the limit, each key claimed and completed in a PL/pgSQL
#   exception block, commits: every key is stored and replays;
# - the same batch far past the limit, and many open claims, end in
#   53200 "out of shared memory" with PostgreSQL's hint to raise
#   max_locks_per_transaction; none of the transaction's keys is stored;
# - once that transaction has aborted (its session still in the failed
#   transaction block), another session claims and completes a key of its
#   own, and the failed session can call again after ROLLBACK.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use FindBin;
use lib $FindBin::RealBin;
use IdempotencyTest;

my $node = preloaded_node('many_claims',
	conf => "max_locks_per_transaction = 10\nmax_connections = 10\n");
$node->safe_psql(
	'postgres', q{
CREATE EXTENSION idempotency;
-- Claims and completes keys prefix1 .. prefixN, each in an exception
-- block (a subtransaction) whose handler never matches the lock table's
-- error.
CREATE PROCEDURE claim_completed(prefix text, n int) LANGUAGE plpgsql AS $$
BEGIN
  FOR i IN 1 .. n LOOP
    BEGIN
      IF NOT (SELECT replayed FROM idempotency.claim(prefix || i, NULL)) THEN
        PERFORM idempotency.complete(prefix || i, to_jsonb(i));
      END IF;
    EXCEPTION WHEN unique_violation THEN
      RAISE;
    END;
  END LOOP;
END $$;
-- Claims keys prefix1 .. prefixN and leaves them open, counting the
-- claims taken in a sequence (which a rollback does not undo).
CREATE SEQUENCE claims_taken;
CREATE PROCEDURE claim_open(prefix text, n int) LANGUAGE plpgsql AS $$
BEGIN
  FOR i IN 1 .. n LOOP
    PERFORM idempotency.claim(prefix || i, NULL);
    PERFORM nextval('claims_taken');
  END LOOP;
END $$;
});

my $lock_slots = $node->safe_psql('postgres',
	q{SELECT current_setting('max_locks_per_transaction')::int
	  * (current_setting('max_connections')::int
	     + current_setting('max_prepared_transactions')::int)});
note "the lock table's nominal size: $lock_slots locks";

sub stored_keys
{
	my ($prefix) = @_;
	return $node->safe_psql('postgres',
		"SELECT count(*) FROM idempotency.keys WHERE key LIKE '$prefix%'");
}

# A batch the lock table holds: 40 keys (two locks each: the claim and the
# subtransaction's id), within 10 x 10 slots.
$node->safe_psql('postgres', 'BEGIN; CALL claim_completed(\'small-\', 40); COMMIT;');
is(stored_keys('small-'), '40', 'a batch below the limit stores every key');
is( $node->safe_psql(
		'postgres', q{
SELECT count(*) FROM generate_series(1, 40) i,
  LATERAL idempotency.claim('small-' || i, NULL) c
 WHERE c.replayed AND c.response = to_jsonb(i)}),
	'40',
	'each key of that batch replays its own response');

# Far past the limit: the error of a full lock table, nothing stored.
sub check_out_of_locks
{
	my ($what, $sql, $prefix) = @_;
	my ($rc, $stdout, $stderr) = $node->psql(
		'postgres', $sql,
		on_error_stop => 1,
		extra_params => [ '-v', 'VERBOSITY=verbose' ]);
	like($stderr, qr/ERROR:\s+53200: out of shared memory/,
		"$what: 53200 out of shared memory");
	like(
		$stderr,
		qr/HINT:\s+You might need to increase max_locks_per_transaction\./,
		"$what: the hint names max_locks_per_transaction");
	is(stored_keys($prefix), '0', "$what: none of its keys is stored");
}
check_out_of_locks('claim and complete in subtransactions',
	"BEGIN; CALL claim_completed('sub-', 100000); COMMIT;", 'sub-');
check_out_of_locks('open claims',
	"BEGIN; CALL claim_open('open-', 100000); COMMIT;", 'open-');
# The table is shared: one transaction holds more than
# max_locks_per_transaction locks while there is room.
my $taken = $node->safe_psql('postgres',
	'SELECT last_value FROM claims_taken');
note "open claims taken before the lock table was full: $taken";
cmp_ok($taken, '>', $lock_slots,
	'one transaction took more claims than max_locks_per_transaction '
	  . 'x (max_connections + max_prepared_transactions)');
check_out_of_locks(
	'open claims outside a transaction block',
	"CALL claim_open('single-', 100000);", 'single-');

# The failed transaction's locks go when it aborts, although its session
# stays in the failed transaction block until ROLLBACK.
my $failed = $node->background_psql(
	'postgres',
	on_error_stop => 0,
	extra_params => [ '-v', 'VERBOSITY=verbose' ]);
$failed->query_safe('BEGIN');
my ($output, $error) = $failed->query("CALL claim_open('held-', 100000)");
is($error, 1, 'the batch fails in a session that stays in its transaction');
like($failed->{stderr}, qr/53200: out of shared memory/,
	'... with 53200');
$failed->{stderr} = '';
is( $failed->query('SELECT 1'),
	'',
	'... which is still the failed transaction block');
like($failed->{stderr}, qr/25P02/, '... (25P02 until ROLLBACK)');
$failed->{stderr} = '';

is( $node->safe_psql(
		'postgres', q{
BEGIN;
SELECT replayed FROM idempotency.claim('other-1', NULL);
SELECT idempotency.complete('other-1', '"other"');
COMMIT;
SELECT idempotency.idempotent_call('other-2', NULL, 'SELECT 2');}),
	"f\n\n2",
	'another session claims and completes its own keys meanwhile');
is(stored_keys('other-'), '2', 'its keys are stored');

$failed->query_safe('ROLLBACK');
is( $failed->query_safe(
		q{BEGIN;
SELECT replayed FROM idempotency.claim('after-1', NULL);
SELECT idempotency.complete('after-1', '"after"');
COMMIT;
SELECT idempotency.idempotent_call('other-2', NULL, 'SELECT 2'),
  idempotency.last_call_replayed();}),
	"f\n\n2|t",
	'after ROLLBACK the failed session claims, completes and replays');
$failed->quit;
is(stored_keys('held-'), '0', 'none of the failed batch\'s keys is stored');
is(stored_keys('after-'), '1', 'the key claimed after it is stored');

$node->stop;
done_testing();
