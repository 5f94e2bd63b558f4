# DROP EXTENSION and CREATE EXTENSION in another session while a session
# keeps what it learnt of the key table (its oid, its columns' positions,
# its statements, a prepared call): the session's next calls use the new
# table, whose columns sit elsewhere, with the right values; the old keys
# are gone, so a retry runs fn again. Dropped and not recreated, a call is a
# clear error. A session holding a claim keeps DROP EXTENSION waiting.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use FindBin;
use lib $FindBin::RealBin;
use IdempotencyTest;

my $node = preloaded_node('extension_recreate');
$node->safe_psql(
	'postgres', q{
CREATE EXTENSION idempotency;
CREATE TABLE runs (key text);
CREATE FUNCTION work(k text) RETURNS text LANGUAGE sql
  AS $$ INSERT INTO runs VALUES (k) RETURNING 'ran ' || k || ' ' || (SELECT count(*) + 1 FROM runs WHERE key = k) $$;
-- The first installation's table has response and expires_at at the end,
-- after a dropped column: the session learns other positions than the
-- new table's.
ALTER TABLE idempotency.keys ADD COLUMN note text DEFAULT 'old table';
ALTER TABLE idempotency.keys DROP COLUMN response, DROP COLUMN expires_at;
ALTER TABLE idempotency.keys ADD COLUMN response jsonb, ADD COLUMN expires_at timestamptz NOT NULL;
});

sub call
{
	my ($key) = @_;
	return "SELECT response #>> '{}', replayed FROM ("
	  . work_call_sql($key) . ") AS c(response, replayed)";
}

sub keys_oid { $node->safe_psql('postgres', "SELECT 'idempotency.keys'::regclass::oid") }

my $session = $node->background_psql('postgres', on_error_stop => 0);
$session->query_safe('\set VERBOSITY verbose');
is($session->query_safe(call('k1')), 'ran k1 1|f', 'the session runs a key');
is($session->query_safe(call('k1')), 'ran k1 1|t', 'and replays it');
is( $session->query_safe(
		q{BEGIN; SELECT replayed FROM idempotency.claim('h1', NULL);
		  SELECT idempotency.complete('h1', '"handled"'); COMMIT;}),
	"f\n",
	'the session claims and completes a key');
$session->query_safe(
	"PREPARE call_work(text) AS SELECT idempotency.idempotent_call(\$1, NULL, 'SELECT work(\$1)', \$1) #>> '{}'");
is($session->query_safe("EXECUTE call_work('p1')"), 'ran p1 1', 'a prepared call runs');
my $old_oid = keys_oid();

# Dropped and not recreated: a clear error, no crash.
$node->safe_psql('postgres', 'DROP EXTENSION idempotency');
$session->query(call('k1'));
like($session->{stderr}, qr/ERROR:\s+42883:/,
	'with the extension dropped, a call is 42883 (no such function)');
$session->{stderr} = '';
$session->query("EXECUTE call_work('p1')");
like($session->{stderr}, qr/ERROR:\s+42883:/, 'and so is the prepared call');
$session->{stderr} = '';

$node->safe_psql('postgres', 'CREATE EXTENSION idempotency');
isnt(keys_oid(), $old_oid, 'the new key table is another relation');
is($session->query_safe(call('k1')), 'ran k1 2|f',
	"the session's retry runs fn again: its key went with the old table");
is($session->query_safe(call('k1')), 'ran k1 2|t', 'and replays from the new table');
is($session->query_safe("EXECUTE call_work('p1')"), 'ran p1 2',
	'the prepared call runs against the new table');
is($session->query_safe("EXECUTE call_work('p1')"), 'ran p1 2', 'and replays');
is( $session->query_safe(
		q{BEGIN; SELECT replayed FROM idempotency.claim('h1', NULL);
		  SELECT idempotency.complete('h1', '"handled again"'); COMMIT;}),
	"f\n",
	'the session claims and completes its key anew');
is( $node->safe_psql(
		'postgres',
		"SELECT string_agg(key || '=' || (response #>> '{}'), ',' ORDER BY key) FROM idempotency.keys"),
	'h1=handled again,k1=ran k1 2,p1=ran p1 2',
	'the new table holds each key with its own response, in the right column');
is( $node->safe_psql(
		'postgres',
		"SELECT bool_and(expires_at - created_at = '1 day') FROM idempotency.keys"),
	't', 'and its times');

# A session holding a claim keeps DROP EXTENSION waiting.
$session->query_safe("BEGIN; SELECT FROM idempotency.claim('held', NULL)");
is( sqlstate_of(
		$node, "SET lock_timeout = '1s'; DROP EXTENSION idempotency"),
	'55P03',
	'DROP EXTENSION waits for the transaction holding a claim');
$session->query_safe("SELECT idempotency.complete('held', '\"kept\"'); COMMIT");
is( $node->safe_psql('postgres',
		"SELECT response #>> '{}' FROM idempotency.keys WHERE key = 'held'"),
	'kept', 'the claim completes and commits');

# Dropped and recreated by the session itself.
$session->query_safe('DROP EXTENSION idempotency; CREATE EXTENSION idempotency');
is($session->query_safe(call('k1')), 'ran k1 3|f',
	'after recreating the extension itself, the session runs the key again');
is($session->query_safe(call('k1')), 'ran k1 3|t', 'and replays it');
$session->quit;

ok($node->safe_psql('postgres', 'SELECT 1') eq '1', 'the server is up');
unlike(slurp_file($node->logfile), qr/PANIC|TRAP|terminated by signal/,
	'no backend crashed');

done_testing();
