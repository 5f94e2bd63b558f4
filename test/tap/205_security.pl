# Rights with roles that log in (so the session user is the caller, as in
# production): fn cannot take an identity the caller lacks; a role it may
# take does not move the key out of the caller's scope. And keys of
# different roles never touch: another role's key in progress - stored in
# an open transaction, or claimed while fn runs - neither blocks a call
# with the same key text nor tells the caller it exists.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use FindBin;
use lib $FindBin::RealBin;
use IdempotencyTest;

my $node = preloaded_node('security');

$node->safe_psql(
	'postgres', q{
CREATE EXTENSION idempotency;
CREATE ROLE alice LOGIN;
CREATE ROLE bob LOGIN;
CREATE ROLE team;
GRANT team TO alice;
-- Blocks while the test holds advisory lock 4242.
CREATE FUNCTION gate() RETURNS text LANGUAGE sql
  AS $$ SELECT pg_advisory_xact_lock_shared(4242)::text || current_user $$;
});

sub as_role
{
	my ($role, $sql) = @_;
	my ($rc, $stdout, $stderr) = $node->psql(
		'postgres', $sql,
		on_error_stop => 0,
		extra_params => [ '-U', $role, '-v', 'VERBOSITY=verbose' ]);
	return $stderr =~ /ERROR:\s+([0-9A-Z]{5}):/ ? "error $1" : $stdout;
}

sub call_sql
{
	my ($key, $fn) = @_;
	return "SELECT idempotency.idempotent_call('$key', NULL, '$fn'), "
	  . 'idempotency.last_call_replayed()';
}

# --- identities inside fn ----------------------------------------------------

is(as_role('alice', call_sql('become-bob', 'SET ROLE bob')),
	'error 42501', 'fn cannot SET ROLE to a role the caller is not a member of');
is( as_role('alice', call_sql('become-bob', 'SET SESSION AUTHORIZATION bob')),
	'error 42501', 'fn cannot SET SESSION AUTHORIZATION');
is( as_role(
		'alice',
		call_sql('become-team', 'SET ROLE team')
		  . '; SELECT current_user; RESET ROLE; '
		  . call_sql('become-team', 'SET ROLE team')),
	"|f\nteam\n|t",
	'fn may SET ROLE to a role the caller has; the role stays set after the call, '
	  . 'and the key stays the caller\'s: it replays for her');
is( $node->safe_psql(
		'postgres', "SELECT scope FROM idempotency.keys WHERE key = 'become-team'"),
	'alice',
	'... stored in the scope of the role that called');
is( $node->safe_psql(
		'postgres',
		"SELECT count(*) FROM idempotency.keys WHERE key = 'become-bob'"),
	'0',
	'the refused calls stored nothing');

# --- another role's key in progress -------------------------------------------

my $alice = $node->background_psql('postgres',
	extra_params => [ '-U', 'alice' ]);
$alice->query_safe('BEGIN');
$alice->query_safe(call_sql('shared-text', 'SELECT current_user::text'));
is( as_role(
		'bob',
		call_sql('shared-text', 'SELECT current_user::text')),
	'"bob"|f',
	'a key alice stored in an open transaction neither blocks bob nor answers him IK409'
);
$alice->query_safe('COMMIT');
is(as_role('alice', call_sql('shared-text', 'SELECT current_user::text')),
	'"alice"|t', '... and alice keeps her own response');

# Alice inside fn, holding the claim on her key.
my $gate = $node->background_psql('postgres');
$gate->query_safe('SELECT pg_advisory_lock(4242)');
my $alice_pid = $alice->query_safe('SELECT pg_backend_pid()');
$alice->query_until(qr/sent/,
	"\\echo sent\n" . call_sql('claimed-text', 'SELECT gate()') . ";\n");
$node->poll_query_until('postgres',
	"SELECT count(*) = 1 FROM pg_locks WHERE pid = $alice_pid AND locktype = 'advisory' AND NOT granted"
) or die 'alice never reached fn';
is( as_role(
		'bob',
		call_sql('claimed-text', 'SELECT current_user::text')),
	'"bob"|f',
	'a key alice holds while her fn runs neither blocks bob nor answers him IK409');
$gate->query_safe('SELECT pg_advisory_unlock(4242)');
my ($alice_out) = $alice->query('SELECT 1');
like($alice_out, qr/^"\d*alice"\|f\n1$/, '... and alice\'s call completes');
$_->quit for $alice, $gate;

is( $node->safe_psql(
		'postgres',
		"SELECT string_agg(scope::text || ' ' || response::text, ', ' ORDER BY scope::text) "
		  . "FROM idempotency.keys WHERE key IN ('shared-text', 'claimed-text')"),
	'alice "alice", alice "alice", bob "bob", bob "bob"',
	'each role holds its own response for each key text');

$node->stop;
done_testing();
