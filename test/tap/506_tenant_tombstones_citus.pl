# Tenant keys on Citus keep tombstones by the local keys' rules: a key whose
# response expired answers a retry of its request IK410 and another request
# IK422, lookup says gone, forget deletes it; by the row's times, before and
# after expiry (through the coordinator) turns the row into a tombstone; at
# the window's end the key runs again; expiry deletes tombstones past their
# window, and with idempotency.remember = 0 deletes expired keys as before.
# distribute_keys creates the column expired_at.
#
# Then a handler replaces a key whose response expired while the
# coordinator's expiry, with its own idempotency.remember, turns the same
# row into a tombstone (or deletes it) and commits first; the handler's
# claim found the key free by its own, shorter window, and what its
# complete finds decides, by the local keys' rules
# (test/isolation/specs/tombstone_replace.spec):
# - a tombstone still within its window (expiry remembers longer): complete
#   fails with 40001, nothing of the handler's transaction stays, and a
#   retry gets IK410, never a second run;
# - a tombstone whose window has passed by the time of complete: it is
#   deleted and the new row stored;
# - a row expiry deleted without a tombstone (remember = 0): the key is
#   free, the new row is stored.
#
# Needs Citus; without it the file says so and is skipped.
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

my ($coordinator, @workers) = citus_cluster(
	slot => 5,
	conf => "idempotency.expire_interval = 0\n");

$coordinator->safe_psql('postgres',
	tenant_accounts_sql(shard_count => 4, balance => 1000)
	  . q{SELECT idempotency.distribute_keys('accounts');});

is( $coordinator->safe_psql('postgres', q{
SELECT format_type(atttypid, atttypmod) || ' ' || NOT attnotnull FROM pg_attribute
 WHERE attrelid = 'idempotency.tenant_keys'::regclass AND attname = 'expired_at'}),
	'timestamp with time zone true', 'distribute_keys creates the nullable column expired_at');

my $tenant = 1;
my $shard = $coordinator->safe_psql('postgres',
	"SELECT get_shard_id_for_distribution_column('idempotency.tenant_keys', $tenant)");
my $home_port = $coordinator->safe_psql('postgres',
	"SELECT nodeport FROM citus_shards WHERE shardid = $shard");
my ($home) = grep { $_->port == $home_port } @workers;

# The request: withdraw `amount` from the tenant under `key`, on the worker
# that holds the tenant.
sub call_sql
{
	my ($key, $amount) = @_;
	return "SELECT idempotency.tenant_call(${tenant}::bigint, '$key', NULL, "
	  . "'SELECT withdraw(\$1, \$2)', ${tenant}::bigint, ${amount}::bigint)";
}

sub withdrawals
{
	return $coordinator->safe_psql('postgres',
		"SELECT withdrawals FROM accounts WHERE tenant = $tenant");
}

sub lookup
{
	my ($key) = @_;
	return $home->safe_psql('postgres',
		"SELECT state, response IS NULL FROM idempotency.tenant_lookup(${tenant}::bigint, '$key')");
}

# The key's row as Citus sees it: key text, response kept, expired_at set.
sub row_of
{
	my ($where) = @_;
	return $coordinator->safe_psql('postgres',
		"SELECT key, response IS NOT NULL, expired_at IS NOT NULL FROM idempotency.tenant_keys"
		  . " WHERE tenant = $tenant AND $where");
}

# The key's response expired at `expired_at` (SQL; by default an hour ago).
sub age
{
	my ($key, $expired_at) = @_;
	$expired_at //= q{now() - interval '1 hour'};
	$coordinator->safe_psql('postgres', qq{
UPDATE idempotency.tenant_keys SET created_at = ($expired_at) - interval '1 hour',
       expires_at = $expired_at WHERE tenant = $tenant AND key = '$key'});
}

# --- a key whose response expired, before expiry comes by -------------------------
like($home->safe_psql('postgres', call_sql('late', 1)), qr/"balance"/, 'a new key runs');
my $ran = withdrawals();
age('late');
is(sqlstate_of($home, call_sql('late', 1)), 'IK410',
	'past its TTL, a retry of the same request gets IK410 (before expiry)');
is(sqlstate_of($home, call_sql('late', 2)), 'IK422', '... and another request IK422');
is(lookup('late'), 'gone|t', '... lookup says gone, with no response');
is( $home->safe_psql('postgres', qq{
SELECT l.expires_at = k.expires_at + interval '7 days'
  FROM idempotency.tenant_lookup(${tenant}::bigint, 'late') AS l,
       idempotency.tenant_keys AS k WHERE k.tenant = $tenant AND k.key = 'late'}),
	't', '... remembered until expires_at + idempotency.remember');
is(withdrawals(), $ran, 'nothing ran again');

# --- expiry turns it into a tombstone ---------------------------------------------
my $digest = $coordinator->safe_psql('postgres',
	"SELECT key_digest FROM idempotency.tenant_keys WHERE tenant = $tenant AND key = 'late'");
is($workers[0]->safe_psql('postgres', 'SELECT idempotency.expire()'), '0',
	'a worker leaves tenant keys to the coordinator');
is($coordinator->safe_psql('postgres', 'SELECT idempotency.expire()'), '1',
	'the coordinator turns the expired tenant key into a tombstone');
is(row_of("key_digest = '$digest'"), '|f|t',
	'the tombstone: no key text, no response, expired_at set');
is( $coordinator->safe_psql('postgres', qq{
SELECT expires_at - expired_at FROM idempotency.tenant_keys WHERE key_digest = '$digest'}),
	'7 days', 'it goes idempotency.remember after the response expired');
is(sqlstate_of($home, call_sql('late', 1)), 'IK410',
	'a retry of the same request gets IK410 (after expiry)');
is(sqlstate_of($home, call_sql('late', 2)), 'IK422', '... and another request IK422');
is(lookup('late'), 'gone|t', '... lookup says gone');
is(withdrawals(), $ran, 'nothing ran again');
is($home->safe_psql('postgres', "SELECT idempotency.tenant_forget(${tenant}::bigint, 'late')"),
	't', 'forget deletes the tombstone');
is(lookup('late'), 'absent|t', '... and the key is absent');
like($home->safe_psql('postgres', call_sql('late', 1)), qr/"balance"/, '... and runs again');
is(withdrawals(), $ran + 1, 'once');

# --- the window's end ------------------------------------------------------------
like($home->safe_psql('postgres', call_sql('old', 1)), qr/"balance"/, 'another key runs');
$coordinator->safe_psql('postgres', q{
UPDATE idempotency.tenant_keys SET created_at = now() - interval '9 days',
       expires_at = now() - interval '8 days' WHERE key = 'old'});
$ran = withdrawals();
like($home->safe_psql('postgres', call_sql('old', 1)), qr/"balance"/,
	'a key past its whole window (not yet expired) runs again');
is(withdrawals(), $ran + 1, 'once');

like($home->safe_psql('postgres', call_sql('ended', 1)), qr/"balance"/, 'a third key runs');
age('ended');
$digest = $coordinator->safe_psql('postgres',
	"SELECT key_digest FROM idempotency.tenant_keys WHERE key = 'ended'");
is($coordinator->safe_psql('postgres', 'SELECT idempotency.expire()'), '1', 'expiry turns it into a tombstone');
$coordinator->safe_psql('postgres',
	"UPDATE idempotency.tenant_keys SET expires_at = now() - interval '1 minute' WHERE key_digest = '$digest'");
is(lookup('ended'), 'expired|t', 'lookup says expired for a tombstone past its window, as for any key past it');
$ran = withdrawals();
like($home->safe_psql('postgres', call_sql('ended', 1)), qr/"balance"/, '... and its key runs again');
is(withdrawals(), $ran + 1, 'once');
is(row_of("key_digest = '$digest'"), 'ended|t|f', 'the new row replaced the tombstone');

like($home->safe_psql('postgres', call_sql('swept', 1)), qr/"balance"/, 'a fourth key runs');
age('swept');
$digest = $coordinator->safe_psql('postgres',
	"SELECT key_digest FROM idempotency.tenant_keys WHERE key = 'swept'");
is($coordinator->safe_psql('postgres', 'SELECT idempotency.expire()'), '1', 'expiry turns it into a tombstone');
$coordinator->safe_psql('postgres',
	"UPDATE idempotency.tenant_keys SET expires_at = now() - interval '1 minute' WHERE key_digest = '$digest'");
is($coordinator->safe_psql('postgres', 'SELECT idempotency.expire()'), '1',
	'expiry deletes a tombstone past its window');
is(row_of("key_digest = '$digest'"), '', '... it is gone');

# --- remember = 0 ------------------------------------------------------------------
like($home->safe_psql('postgres', call_sql('plain', 1)), qr/"balance"/, 'a fifth key runs');
age('plain');
$ran = withdrawals();
like( $home->safe_psql('postgres', "SET idempotency.remember = 0;\n" . call_sql('plain', 1)),
	qr/"balance"/, 'with remember = 0, a retry past the TTL runs again');
is(withdrawals(), $ran + 1, 'once');
age('plain');
is( $coordinator->safe_psql('postgres', "SET idempotency.remember = 0;\nSELECT idempotency.expire()"),
	'1', 'with remember = 0, expiry deletes the expired key');
is($coordinator->safe_psql('postgres', "SELECT count(*) FROM idempotency.tenant_keys WHERE expired_at IS NULL AND expires_at <= now()"),
	'0', '... and writes no tombstone');
is($coordinator->safe_psql('postgres', "SELECT count(*) FROM idempotency.tenant_keys WHERE expired_at IS NOT NULL"),
	'0', 'no tombstone is left');

# --- a handler replacing a key while expiry converts it ---------------------------

# A key that ran, its response expired at `expired_at` (SQL).
sub ran_and_expired
{
	my ($key, $expired_at) = @_;
	like($home->safe_psql('postgres', call_sql($key, 1)), qr/"balance"/, "$key runs");
	age($key, $expired_at);
	return $coordinator->safe_psql('postgres',
		"SELECT key_digest FROM idempotency.tenant_keys WHERE tenant = $tenant AND key = '$key'");
}

# A handler on the tenant's worker that remembers expired keys 30 minutes:
# it claims the key (new for it), withdraws, and waits to complete.
sub claiming_handler
{
	my ($key) = @_;
	my $handler = $home->background_psql('postgres', on_error_stop => 0);
	$handler->query_safe("\\set VERBOSITY verbose");
	$handler->query_safe("SET idempotency.remember = '30 minutes'");
	$handler->query_safe('BEGIN');
	is($handler->query_safe("SELECT replayed FROM idempotency.tenant_claim(${tenant}::bigint, '$key', NULL)"),
		'f', "$key: past the handler's window, the claim takes the key as new");
	$handler->query_safe("SELECT withdraw(${tenant}::bigint, 1::bigint)");
	return $handler;
}

# Completes and commits; returns the SQLSTATE of the first error, or ''.
sub complete_and_commit
{
	my ($handler, $key) = @_;
	$handler->{stderr} = '';
	$handler->query(
		"SELECT idempotency.tenant_complete(${tenant}::bigint, '$key', '\"new\"'::jsonb)");
	$handler->query('COMMIT');
	my ($sqlstate) = $handler->{stderr} =~ /ERROR:\s+([0-9A-Z]{5}):/;
	$handler->quit;
	return $sqlstate // '';
}

sub expire_with_remember
{
	my ($remember) = @_;
	return $coordinator->safe_psql('postgres',
		"SET idempotency.remember = '$remember';\nSELECT idempotency.expire()");
}

# Expiry remembers longer: the tombstone stands.
$digest = ran_and_expired('kept', q{now() - interval '2 hours'});
$ran = withdrawals();
my $handler = claiming_handler('kept');
is(expire_with_remember('7 days'), '1',
	'kept: meanwhile expiry, remembering 7 days, turns the row into a tombstone and commits');
is(complete_and_commit($handler, 'kept'), '40001',
	'kept: the handler cannot store its row over the tombstone: complete fails with 40001');
is(withdrawals(), $ran, '... its withdrawal is rolled back with it');
is(row_of("key_digest = '$digest'"), '|f|t', '... and the tombstone is the only row');
is( sqlstate_of($home, "SET idempotency.remember = '30 minutes';\n" . call_sql('kept', 1)),
	'IK410', '... a retry gets IK410 by the tombstone\'s own window');
is(withdrawals(), $ran, '... and runs nothing');

# The tombstone's window ends before the handler completes: expiry
# remembers an hour and the response expired an hour less 5 seconds ago, so
# expiry keeps a tombstone whose window ends 5 seconds later.
$digest = ran_and_expired('passed', q{now() - interval '1 hour' + interval '5 seconds'});
$ran = withdrawals();
$handler = claiming_handler('passed');
is(expire_with_remember('1 hour'), '1', 'passed: expiry turns the row into a tombstone and commits');
is(row_of("key_digest = '$digest'"), '|f|t', '... a tombstone');
$coordinator->poll_query_until('postgres',
	"SELECT bool_and(expires_at < now()) FROM idempotency.tenant_keys WHERE key_digest = '$digest'")
  or die 'the tombstone\'s window did not end';
is(complete_and_commit($handler, 'passed'), '',
	'passed: once its window has passed, the handler\'s complete replaces the tombstone');
is(withdrawals(), $ran + 1, '... the handler\'s withdrawal committed, once');
is(row_of("key_digest = '$digest'"), 'passed|t|f', '... and its row is the only one');
is( $home->safe_psql('postgres',
		"SELECT replayed, response FROM idempotency.tenant_claim(${tenant}::bigint, 'passed', NULL)"),
	't|"new"', '... which a retry replays');

# Expiry deletes the row (remember = 0).
$digest = ran_and_expired('freed', q{now() - interval '2 hours'});
$ran = withdrawals();
$handler = claiming_handler('freed');
is(expire_with_remember('0'), '1', 'freed: expiry, remembering nothing, deletes the row and commits');
is(row_of("key_digest = '$digest'"), '', '... no row is left');
is(complete_and_commit($handler, 'freed'), '', 'freed: the handler stores its row');
is(withdrawals(), $ran + 1, '... its withdrawal committed, once');
is(row_of("key_digest = '$digest'"), 'freed|t|f', '... and its row is the only one');

done_testing();
