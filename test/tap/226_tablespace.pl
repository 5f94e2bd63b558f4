# The key table and its indexes moved to another tablespace while keys
# exist (ALTER TABLE / ALTER INDEX ... SET TABLESPACE give them new files):
# every key replays for its own role, new keys are stored, a held claim
# answers IK409, expire() and the expiry worker delete expired keys; all
# of it again after a restart.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use FindBin;
use lib $FindBin::RealBin;
use IdempotencyTest;

# The expiry worker is off but while its own check runs, so that expire()
# finds the keys it is to delete.
my $node =
  preloaded_node('tablespace', conf => "idempotency.expire_interval = 0\nidempotency.remember = 0\n");
my $location = $node->basedir . '/key_space';
mkdir $location or die "mkdir $location: $!";

$node->safe_psql(
	'postgres', q{
CREATE EXTENSION idempotency;
CREATE ROLE alice LOGIN;
CREATE ROLE bob LOGIN;
CREATE SEQUENCE runs;
GRANT USAGE ON SEQUENCE runs TO alice, bob;
});

# A call as `role`: fn answers the role and its run number, so a replay
# shows whose run it was.
sub call
{
	my ($role, $key) = @_;
	return $node->safe_psql(
		'postgres', qq{
SET ROLE $role;
SELECT idempotency.idempotent_call('$key', NULL,
  'SELECT current_user || '' run '' || nextval(''runs'')') #>> '{}',
  idempotency.last_call_replayed();});
}

# Stores the same key texts for both roles, and answers what each got.
my %first;
for my $key ('k1', 'k2', 'k3')
{
	for my $role ('alice', 'bob')
	{
		$first{"$role/$key"} = call($role, $key);
		like($first{"$role/$key"}, qr/^$role run \d+\|f$/,
			"${role}'s $key runs before the move");
	}
}

# Every stored key replays its first response for its own role.
sub check_replays
{
	my ($when) = @_;
	for my $id (sort keys %first)
	{
		my ($role, $key) = split m{/}, $id;
		(my $replay = $first{$id}) =~ s/\|f$/|t/;
		is(call($role, $key), $replay, "$when: ${role}'s $key replays");
	}
}

# Checks new keys, a held claim and expiry in the key table as it now is.
sub check_key_table
{
	my ($when, $tag) = @_;
	like(call('alice', "new-$tag"), qr/^alice run \d+\|f$/,
		"$when: a new key runs");
	like(call('alice', "new-$tag"), qr/^alice run \d+\|t$/,
		"$when: the new key replays");

	my $holder = $node->background_psql('postgres');
	$holder->query_safe(
		"BEGIN; SELECT replayed FROM idempotency.claim('held-$tag', NULL)");
	is( sqlstate_of(
			$node,
			"SELECT idempotency.idempotent_call('held-$tag', NULL, 'SELECT 1')"
		),
		'IK409',
		"$when: a key claimed in another transaction is IK409");
	$holder->query_safe(
		"SELECT idempotency.complete('held-$tag', '\"held\"'); COMMIT");
	$holder->quit;
	is( $node->safe_psql(
			'postgres',
			"SELECT replayed, response #>> '{}' FROM idempotency.claim('held-$tag', NULL)"
		),
		't|held',
		"$when: the completed claim replays");

	# expire() deletes exactly the expired key; the worker too.
	$node->safe_psql('postgres',
		    "SELECT idempotency.idempotent_call('gone-$tag', NULL, 'SELECT 1');"
		  . "SELECT idempotency.idempotent_call('worker-$tag', NULL, 'SELECT 1');"
	);
	$node->safe_psql('postgres', expire_keys_sql("key = 'gone-$tag'"));
	is($node->safe_psql('postgres', 'SELECT idempotency.expire()'),
		'1', "$when: expire() deletes the one expired key");
	is( $node->safe_psql(
			'postgres',
			"SELECT count(*) FROM idempotency.keys WHERE key IN ('gone-$tag', 'new-$tag')"
		),
		'1',
		"$when: the expired key is gone, the live one kept");
	$node->safe_psql('postgres',
		    expire_keys_sql("key = 'worker-$tag'")
		  . "ALTER SYSTEM SET idempotency.expire_interval = 1; SELECT pg_reload_conf();"
	);
	ok( $node->poll_query_until(
			'postgres',
			"SELECT count(*) = 0 FROM idempotency.keys WHERE key = 'worker-$tag'"
		),
		"$when: the expiry worker deletes an expired key");
	$node->safe_psql('postgres',
		"ALTER SYSTEM RESET idempotency.expire_interval; SELECT pg_reload_conf();"
	);
}

$node->safe_psql(
	'postgres', qq{
CREATE TABLESPACE key_space LOCATION '$location';
ALTER TABLE idempotency.keys SET TABLESPACE key_space;
ALTER INDEX idempotency.keys_pkey SET TABLESPACE key_space;
ALTER INDEX idempotency.keys_expires_at_idx SET TABLESPACE key_space;
});
is( $node->safe_psql(
		'postgres', q{
SELECT string_agg(c.relname || ':' || coalesce(t.spcname, '-'), ' ' ORDER BY c.relname)
  FROM pg_class c LEFT JOIN pg_tablespace t ON t.oid = c.reltablespace
 WHERE c.relname IN ('keys', 'keys_pkey', 'keys_expires_at_idx')
   AND c.relnamespace = 'idempotency'::regnamespace}),
	'keys:key_space keys_expires_at_idx:key_space keys_pkey:key_space',
	'the key table and its indexes are in the other tablespace');

check_replays('after the move');
check_key_table('after the move', 'moved');

$node->restart;
check_replays('after a restart');
check_key_table('after a restart', 'restarted');

$node->stop;
done_testing();
