# A key belongs to the role that claims it (current_user), and complete()
# finds the claim by the role it runs as: after SET ROLE, or inside a
# SECURITY DEFINER function, complete() of the caller's claim is 55000
# (nothing is stored under either role, the claim stays the caller's); the
# same key text claimed by two roles in one transaction is two keys, each
# completed with its own response; a SECURITY DEFINER handler's key is its
# owner's.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use FindBin;
use lib $FindBin::RealBin;
use IdempotencyTest;

my $node = preloaded_node('role_changes');
$node->safe_psql(
	'postgres', q{
CREATE EXTENSION idempotency;
CREATE ROLE alice LOGIN;
CREATE ROLE bob;
CREATE ROLE carol;
GRANT bob TO alice;
-- What a step saw: its SQLSTATE, or 'ok'.
CREATE TABLE seen (step text, state text);
GRANT ALL ON seen TO PUBLIC;
-- carol's functions, run as carol.
CREATE FUNCTION complete_as_owner(k text, r jsonb) RETURNS void
  LANGUAGE sql SECURITY DEFINER AS $$ SELECT idempotency.complete(k, r) $$;
ALTER FUNCTION complete_as_owner(text, jsonb) OWNER TO carol;
CREATE FUNCTION handle_as_owner(k text) RETURNS jsonb LANGUAGE plpgsql
  SECURITY DEFINER AS $$
DECLARE claimed record;
BEGIN
  SELECT * INTO claimed FROM idempotency.claim(k, NULL);
  IF claimed.replayed THEN RETURN claimed.response; END IF;
  PERFORM idempotency.complete(k, to_jsonb('carol handled ' || k));
  RETURN to_jsonb('carol handled ' || k);
END $$;
ALTER FUNCTION handle_as_owner(text) OWNER TO carol;
});

# Runs `sql` as alice; answers its SQLSTATE or its output.
sub as_alice
{
	my ($sql) = @_;
	my ($rc, $stdout, $stderr) = $node->psql(
		'postgres', $sql,
		on_error_stop => 0,
		extra_params => [ '-U', 'alice', '-v', 'VERBOSITY=verbose' ]);
	return $stderr =~ /ERROR:\s+([0-9A-Z]{5}):/ ? "error $1" : $stdout;
}

# Every row of `key`: its role and response.
sub rows_of
{
	my ($key) = @_;
	return $node->safe_psql('postgres',
		"SELECT string_agg(scope::text || '=' || (response #>> '{}'), ',' ORDER BY scope::text) FROM idempotency.keys WHERE key = '$key'"
	);
}

sub seen_at
{
	my ($step) = @_;
	return $node->safe_psql('postgres', "SELECT state FROM seen WHERE step = '$step'");
}

# Runs `statement` in an exception block, recording its SQLSTATE as `step`.
sub attempt
{
	my ($step, $statement) = @_;
	return qq{
  BEGIN
    $statement;
    INSERT INTO seen VALUES ('$step', 'ok');
  EXCEPTION WHEN OTHERS THEN
    INSERT INTO seen VALUES ('$step', SQLSTATE);
  END;};
}

# --- SET ROLE between claim() and complete() -------------------------------
is( as_alice(
		q{DO $$ BEGIN
  PERFORM idempotency.claim('set-role', NULL);
  SET ROLE bob;}
		  . attempt('bob completes', q{PERFORM idempotency.complete('set-role', '"bob"')})
		  . attempt('bob claims', q{PERFORM idempotency.claim('set-role', NULL)})
		  . q{
  PERFORM idempotency.release('set-role');
  RESET ROLE;
  PERFORM idempotency.complete('set-role', '"alice"');
END $$;}),
	'',
	'alice claims, sets role bob, and completes after RESET ROLE (bob releases his own claim)');
is(seen_at('bob completes'), '55000',
	"complete() as bob of alice's claim is 55000: bob holds no claim of the key");
is(seen_at('bob claims'), 'ok',
	"bob's claim of the same key text is bob's own key, not alice's second claim");
is(rows_of('set-role'), 'alice=alice',
	"only alice's response is stored, under alice");
is(as_alice(q{SELECT replayed, response #>> '{}' FROM idempotency.claim('set-role', NULL)}),
	't|alice', "alice's retry replays her response");
is(as_alice(q{SET ROLE bob; SELECT state FROM idempotency.lookup('set-role')}),
	'absent', 'bob has no key of that text');

# Committing as bob while alice's claim is open fails: the claim is alice's.
is( as_alice(
		q{BEGIN; SELECT FROM idempotency.claim('set-role-commit', NULL);
		  SET ROLE bob; COMMIT;}),
	'error 25000',
	"COMMIT as bob with alice's claim unfinished fails with 25000");
is(rows_of('set-role-commit'), '', 'and stores nothing');

# Both roles claim one key text in one transaction: two keys, two responses.
unlike( as_alice(
		q{BEGIN;
SELECT FROM idempotency.claim('two-roles', NULL);
SET ROLE bob;
SELECT FROM idempotency.claim('two-roles', NULL);
SELECT idempotency.complete('two-roles', '"bob"');
RESET ROLE;
SELECT idempotency.complete('two-roles', '"alice"');
COMMIT;}),
	qr/^error/,
	'alice and bob each claim and complete the key text in one transaction');
is(rows_of('two-roles'), 'alice=alice,bob=bob',
	'each role stored its own response');
is(as_alice(q{SET ROLE bob; SELECT response #>> '{}' FROM idempotency.claim('two-roles', NULL)}),
	'bob', 'bob replays his own response');

# --- SECURITY DEFINER ---------------------------------------------------------
is( as_alice(
		q{DO $$ BEGIN
  PERFORM idempotency.claim('definer', NULL);}
		  . attempt('owner completes', q{PERFORM complete_as_owner('definer', '"carol"')})
		  . q{
  PERFORM idempotency.complete('definer', '"alice"');
END $$;}),
	'',
	'alice claims and completes around a SECURITY DEFINER complete()');
is(seen_at('owner completes'), '55000',
	"complete() inside carol's SECURITY DEFINER function of alice's claim is 55000");
is(rows_of('definer'), 'alice=alice', "only alice's response is stored, under alice");

is(as_alice(q{SELECT handle_as_owner('definer-handled') #>> '{}'}),
	'carol handled definer-handled', "carol's SECURITY DEFINER handler runs");
is(rows_of('definer-handled'), 'carol=carol handled definer-handled',
	"its key is carol's, the function owner's");
is(as_alice(q{SELECT state FROM idempotency.lookup('definer-handled')}),
	'absent', 'alice has no key of that text');
is(as_alice(q{SELECT handle_as_owner('definer-handled') #>> '{}'}),
	'carol handled definer-handled', "the handler's retry replays carol's key");

# A claim taken inside the definer function cannot be completed by its caller.
$node->safe_psql(
	'postgres', q{
CREATE FUNCTION claim_as_owner(k text) RETURNS void LANGUAGE sql
  SECURITY DEFINER AS $$ SELECT FROM idempotency.claim(k, NULL) $$;
ALTER FUNCTION claim_as_owner(text) OWNER TO carol;
});
is( as_alice(
		q{DO $$ BEGIN
  PERFORM claim_as_owner('definer-claim');}
		  . attempt('caller completes', q{PERFORM idempotency.complete('definer-claim', '"alice"')})
		  . q{
  PERFORM complete_as_owner('definer-claim', '"carol"');
END $$;}),
	'',
	"carol's claim is completed inside carol's function");
is(seen_at('caller completes'), '55000',
	"alice's complete() of carol's claim is 55000");
is(rows_of('definer-claim'), 'carol=carol', "only carol's response is stored, under carol");

done_testing();
