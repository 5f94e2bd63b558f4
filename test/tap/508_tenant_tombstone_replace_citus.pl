# A handler replaces a tenant key whose response expired while expiry,
# through the coordinator and with its own idempotency.remember, turns the
# same row into a tombstone (or deletes it) and commits first. The handler's
# claim found the key free by its own, shorter window; what its complete
# finds decides:
# - a tombstone still within its window (expiry remembers longer): complete
#   fails with 40001, nothing of the handler's transaction stays, and a
#   retry gets IK410, never a second run;
# - a tombstone whose window has passed by the time of complete: it is
#   deleted and the new row stored;
# - a row expiry deleted without a tombstone (remember = 0): the key is
#   free, the new row is stored.
# The local keys' rules for the same race: test/isolation/specs/tombstone_replace.spec.
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
	slot => 7,
	conf => "idempotency.expire_interval = 0\n");

$coordinator->safe_psql('postgres',
	tenant_accounts_sql(shard_count => 4, balance => 1000)
	  . q{SELECT idempotency.distribute_keys('accounts');});

my $tenant = 1;
my $shard = $coordinator->safe_psql('postgres',
	"SELECT get_shard_id_for_distribution_column('idempotency.tenant_keys', $tenant)");
my $home_port = $coordinator->safe_psql('postgres',
	"SELECT nodeport FROM citus_shards WHERE shardid = $shard");
my ($home) = grep { $_->port == $home_port } @workers;

sub call_sql
{
	my ($key) = @_;
	return "SELECT idempotency.tenant_call(${tenant}::bigint, '$key', NULL, "
	  . "'SELECT withdraw(\$1, \$2)', ${tenant}::bigint, 1::bigint)";
}

sub withdrawals
{
	return $coordinator->safe_psql('postgres',
		"SELECT withdrawals FROM accounts WHERE tenant = $tenant");
}

# The key's rows as Citus sees them: key text, response, expired_at set.
sub rows_of
{
	my ($digest) = @_;
	return $coordinator->safe_psql('postgres',
		"SELECT key, response, expired_at IS NOT NULL FROM idempotency.tenant_keys"
		  . " WHERE tenant = $tenant AND key_digest = '$digest' ORDER BY created_at");
}

# A key that ran, its response expired at `expired_at` (SQL).
sub ran_and_expired
{
	my ($key, $expired_at) = @_;
	like($home->safe_psql('postgres', call_sql($key)), qr/"balance"/, "$key runs");
	$coordinator->safe_psql('postgres', qq{
UPDATE idempotency.tenant_keys SET created_at = ($expired_at) - interval '1 hour',
       expires_at = $expired_at WHERE tenant = $tenant AND key = '$key'});
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

# --- expiry remembers longer: the tombstone stands --------------------------------
my $digest = ran_and_expired('kept', q{now() - interval '2 hours'});
my $ran = withdrawals();
my $handler = claiming_handler('kept');
is(expire_with_remember('7 days'), '1',
	'kept: meanwhile expiry, remembering 7 days, turns the row into a tombstone and commits');
is(complete_and_commit($handler, 'kept'), '40001',
	'kept: the handler cannot store its row over the tombstone: complete fails with 40001');
is(withdrawals(), $ran, '... its withdrawal is rolled back with it');
is(rows_of($digest), '||t', '... and the tombstone is the only row');
is( sqlstate_of($home, "SET idempotency.remember = '30 minutes';\n" . call_sql('kept')),
	'IK410', '... a retry gets IK410 by the tombstone\'s own window');
is(withdrawals(), $ran, '... and runs nothing');

# --- the tombstone's window ends before the handler completes ---------------------
# Expiry remembers an hour; the response expired an hour less 5 seconds ago:
# expiry keeps a tombstone whose window ends 5 seconds later.
$digest = ran_and_expired('ended', q{now() - interval '1 hour' + interval '5 seconds'});
$ran = withdrawals();
$handler = claiming_handler('ended');
is(expire_with_remember('1 hour'), '1', 'ended: expiry turns the row into a tombstone and commits');
is(rows_of($digest), '||t', '... a tombstone');
$coordinator->poll_query_until('postgres',
	"SELECT bool_and(expires_at < now()) FROM idempotency.tenant_keys WHERE key_digest = '$digest'")
  or die 'the tombstone\'s window did not end';
is(complete_and_commit($handler, 'ended'), '',
	'ended: once its window has passed, the handler\'s complete replaces the tombstone');
is(withdrawals(), $ran + 1, '... the handler\'s withdrawal committed, once');
is(rows_of($digest), 'ended|"new"|f', '... and its row is the only one');
is( $home->safe_psql('postgres',
		"SELECT replayed, response FROM idempotency.tenant_claim(${tenant}::bigint, 'ended', NULL)"),
	't|"new"', '... which a retry replays');

# --- expiry deletes the row (remember = 0) ----------------------------------------
$digest = ran_and_expired('freed', q{now() - interval '2 hours'});
$ran = withdrawals();
$handler = claiming_handler('freed');
is(expire_with_remember('0'), '1', 'freed: expiry, remembering nothing, deletes the row and commits');
is(rows_of($digest), '', '... no row is left');
is(complete_and_commit($handler, 'freed'), '', 'freed: the handler stores its row');
is(withdrawals(), $ran + 1, '... its withdrawal committed, once');
is(rows_of($digest), 'freed|"new"|f', '... and its row is the only one');

done_testing();
