# Tenant keys on Citus keep tombstones by the local keys' rules: a key whose
# response expired answers a retry of its request IK410 and another request
# IK422, lookup says gone, forget deletes it; by the row's times, before and
# after expiry (through the coordinator) turns the row into a tombstone; at
# the window's end the key runs again; expiry deletes tombstones past their
# window. The window is the one fixed when the key was claimed
# (remember_for, docs/expiry.md#when-a-keys-windows-are-fixed): a caller's
# or expiry's own idempotency.remember changes nothing for an existing key;
# a key claimed under remember = 0 runs again past its TTL, and expiry
# deletes it without a tombstone. distribute_keys creates the columns
# expired_at and remember_for.
#
# Then a handler replaces a key whose window has passed while the
# coordinator's expiry turns the same row into a tombstone (or deletes it)
# and commits first; what the handler's complete finds decides, by the
# local keys' rules (test/isolation/specs/tombstone_replace.spec):
# - a key claimed with a 7-day window, the handler and expiry setting 30
#   minutes: the handler cannot take the key (a retry gets IK410, its
#   claim IK422), expiry writes a 7-day tombstone, nothing runs twice;
# - expiry's cutoff is an older transaction's start: it writes a tombstone
#   whose window the handler, which claimed later, sees passed: complete
#   deletes it and stores the new row;
# - a key claimed with a 1-hour window, the handler and expiry setting 7
#   days: the window has passed for both, expiry deletes the row, the
#   handler stores its own.
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
is( $coordinator->safe_psql('postgres', q{
SELECT format_type(atttypid, atttypmod) || ' ' || NOT attnotnull FROM pg_attribute
 WHERE attrelid = 'idempotency.tenant_keys'::regclass AND attname = 'remember_for'}),
	'interval true', '... and the nullable column remember_for');

my $tenant = 1;
my $shard = $coordinator->safe_psql('postgres',
	"SELECT get_shard_id_for_distribution_column('idempotency.tenant_keys', $tenant)");
my $home_port = $coordinator->safe_psql('postgres',
	"SELECT nodeport FROM citus_shards WHERE shardid = $shard");
my ($home) = grep { $_->port == $home_port } @workers;

# The request: withdraw `amount` from the tenant under `key`, on the worker
# that holds the tenant; with `remember`, under that idempotency.remember.
sub call_sql
{
	my ($key, $amount, $remember) = @_;
	my $set = defined $remember ? "SET idempotency.remember = '$remember';\n" : '';
	return $set
	  . "SELECT idempotency.tenant_call(${tenant}::bigint, '$key', NULL, "
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

# --- the window is fixed when the key is claimed --------------------------------
# The key's remember_for, and the tombstone's window: its expires_at less
# expired_at.
sub window_of
{
	my ($where) = @_;
	return $coordinator->safe_psql('postgres',
		"SELECT coalesce(remember_for::text, 'null'), expires_at - expired_at"
		  . " FROM idempotency.tenant_keys WHERE tenant = $tenant AND $where");
}

like($home->safe_psql('postgres', call_sql('plain', 1)), qr/"balance"/, 'a fifth key runs');
is(window_of(q{key = 'plain'}), 'null|', '... under the default window: remember_for NULL (7 days)');
age('plain');
$ran = withdrawals();
is(sqlstate_of($home, call_sql('plain', 1, '0')), 'IK410',
	'a retry past the TTL with remember = 0 still gets IK410: the window is the key\'s');
is(withdrawals(), $ran, 'nothing ran again');
$digest = $coordinator->safe_psql('postgres',
	"SELECT key_digest FROM idempotency.tenant_keys WHERE key = 'plain'");
is( $coordinator->safe_psql('postgres', "SET idempotency.remember = 0;\nSELECT idempotency.expire()"),
	'1', 'expiry with remember = 0 turns the key into a tombstone');
is(window_of("key_digest = '$digest'"), 'null|7 days', '... remembered 7 days, the window fixed at claim');
is($home->safe_psql('postgres', "SELECT idempotency.tenant_forget(${tenant}::bigint, 'plain')"),
	't', 'forget deletes it');

like($home->safe_psql('postgres', call_sql('zero', 1, '0')), qr/"balance"/,
	'a key claimed under remember = 0 runs');
is(window_of(q{key = 'zero'}), '00:00:00|', '... its window is stored: none');
age('zero');
$ran = withdrawals();
like($home->safe_psql('postgres', call_sql('zero', 1, '7 days')), qr/"balance"/,
	'past its TTL, a retry runs again, though the caller remembers 7 days');
is(withdrawals(), $ran + 1, 'once');
is(window_of(q{key = 'zero'}), 'null|', '... and its new row has the retry\'s window');

like($home->safe_psql('postgres', call_sql('none', 1, '0')), qr/"balance"/,
	'another key claimed under remember = 0 runs');
age('none');
$digest = $coordinator->safe_psql('postgres',
	"SELECT key_digest FROM idempotency.tenant_keys WHERE key = 'none'");
is( $coordinator->safe_psql('postgres', "SET idempotency.remember = '7 days';\nSELECT idempotency.expire()"),
	'1', 'expiry, though it remembers 7 days, deletes it');
is(row_of("key_digest = '$digest'"), '', '... and writes no tombstone');
is($coordinator->safe_psql('postgres', "SELECT count(*) FROM idempotency.tenant_keys WHERE expired_at IS NULL AND expires_at <= now()"),
	'0', 'no expired key is left');
is($coordinator->safe_psql('postgres', "SELECT count(*) FROM idempotency.tenant_keys WHERE expired_at IS NOT NULL"),
	'0', 'no tombstone is left');

# --- a handler replacing a key while expiry converts it ---------------------------

# A key that ran (claimed under `remember`, the default without), its
# response expired at `expired_at` (SQL).
sub ran_and_expired
{
	my ($key, $expired_at, $remember) = @_;
	like($home->safe_psql('postgres', call_sql($key, 1, $remember)), qr/"balance"/, "$key runs");
	age($key, $expired_at);
	return $coordinator->safe_psql('postgres',
		"SELECT key_digest FROM idempotency.tenant_keys WHERE tenant = $tenant AND key = '$key'");
}

# A handler's claim, on the tenant's worker.
sub claim_sql
{
	my ($key) = @_;
	return "SELECT replayed FROM idempotency.tenant_claim(${tenant}::bigint, '$key', NULL)";
}

# A handler that claims the key (past its window, so new), withdraws, and
# waits to complete.
sub claiming_handler
{
	my ($key, $remember) = @_;
	my $handler = $home->background_psql('postgres', on_error_stop => 0);
	$handler->query_safe("\\set VERBOSITY verbose");
	$handler->query_safe("SET idempotency.remember = '$remember'");
	$handler->query_safe('BEGIN');
	is($handler->query_safe(claim_sql($key)),
		'f', "$key: past the key's window, the claim takes the key as new");
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

# The key was claimed with the default 7-day window; the handler and expiry
# set 30 minutes: the handler cannot take the key, and expiry writes a
# 7-day tombstone.
$digest = ran_and_expired('kept', q{now() - interval '2 hours'});
$ran = withdrawals();
is(sqlstate_of($home, call_sql('kept', 1, '30 minutes')),
	'IK410', 'kept: a retry remembering 30 minutes gets IK410 by the key\'s 7-day window');
is( sqlstate_of($home,
		"SET idempotency.remember = '30 minutes';\nBEGIN;\n" . claim_sql('kept') . ";\nROLLBACK"),
	'IK422', '... a handler\'s claim (another request) IK422: it cannot take the key');
is(expire_with_remember('30 minutes'), '1',
	'kept: expiry, remembering 30 minutes, turns the row into a tombstone');
is(window_of("key_digest = '$digest'"), 'null|7 days', '... kept 7 days, the window fixed at claim');
is(row_of("key_digest = '$digest'"), '|f|t', '... and the tombstone is the only row');
is(sqlstate_of($home, call_sql('kept', 1, '30 minutes')),
	'IK410', '... a retry gets IK410 by the tombstone\'s own window');
is(withdrawals(), $ran, '... and runs nothing');

# Expiry's cutoff is the start of an older transaction on the coordinator:
# it writes a tombstone whose window the handler, which claimed later, sees
# passed. The key was claimed with a 1-hour window, which ends 5 seconds
# after the older transaction began.
my $older = $coordinator->background_psql('postgres');
$older->query_safe('BEGIN');
$older->query_safe('SELECT now()');
$digest = ran_and_expired('passed', q{now() - interval '1 hour' + interval '5 seconds'}, '1 hour');
$ran = withdrawals();
$home->poll_query_until('postgres',
	"SELECT state = 'expired' FROM idempotency.tenant_lookup(${tenant}::bigint, 'passed')")
  or die 'the key\'s window did not end';
my $handler = claiming_handler('passed', '7 days');
is(expire_with_remember('7 days'), '1',
	'passed: expiry, its cutoff the older transaction\'s start, turns the row into a tombstone and commits');
is(row_of("key_digest = '$digest'"), '|f|t', '... a tombstone');
$older->query_safe('COMMIT');
$older->quit;
is(complete_and_commit($handler, 'passed'), '',
	'passed: its window has passed, the handler\'s complete replaces the tombstone');
is(withdrawals(), $ran + 1, '... the handler\'s withdrawal committed, once');
is(row_of("key_digest = '$digest'"), 'passed|t|f', '... and its row is the only one');
is( $home->safe_psql('postgres',
		"SELECT replayed, response FROM idempotency.tenant_claim(${tenant}::bigint, 'passed', NULL)"),
	't|"new"', '... which a retry replays');

# The key was claimed with a 1-hour window; the handler and expiry set 7
# days: the window has passed for both, expiry deletes the row, the handler
# stores its own.
$digest = ran_and_expired('freed', q{now() - interval '2 hours'}, '1 hour');
$ran = withdrawals();
$handler = claiming_handler('freed', '7 days');
is(expire_with_remember('7 days'), '1',
	'freed: expiry, though it remembers 7 days, deletes the row (its 1-hour window has passed) and commits');
is(row_of("key_digest = '$digest'"), '', '... no row is left');
is(complete_and_commit($handler, 'freed'), '', 'freed: the handler stores its own row');
is(withdrawals(), $ran + 1, '... its withdrawal committed, once');
is(row_of("key_digest = '$digest'"), 'freed|t|f', '... and its row is the only one');

done_testing();
