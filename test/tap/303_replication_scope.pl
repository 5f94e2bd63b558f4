# Keys keep their role through logical replication, in text and in binary
# mode. The nodes create their roles in different orders, so the OID of
# alice on the publisher is bob's on the subscribers, and the OID of a role
# dropped on the publisher is mallory's there: a key carried by OID would
# change owner. Each subscriber, once its subscription is dropped, serves
# as the new primary: every role replays its own keys and nobody else's.
# A rename keeps a role's keys; a role missing on a subscriber holds the
# subscription up (42704) until it is created there.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);

use FindBin;
use lib $FindBin::RealBin;
use IdempotencyTest;

# Expiry runs only when this test calls it, and deletes expired keys
# (no tombstones: remember = 0).
my $conf = "idempotency.expire_interval = 0\nidempotency.remember = 0\n";
my $schema = q{
CREATE EXTENSION idempotency;
CREATE TABLE runs (key text NOT NULL);
GRANT INSERT, SELECT ON runs TO PUBLIC;
CREATE FUNCTION work(op_key text) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO runs (key) VALUES (op_key);
  RETURN jsonb_build_object('key', op_key, 'by', current_user,
                            'port', current_setting('port'));
END $$;
};

sub call_as
{
	my ($node, $role, $key) = @_;
	return $node->safe_psql('postgres',
		"SET ROLE $role; " . work_call_sql($key));
}

sub role_oid
{
	my ($node, $role) = @_;
	return $node->safe_psql('postgres', "SELECT '$role'::regrole::oid");
}

my $keys_by_name = q{SELECT key, scope FROM idempotency.keys ORDER BY key};

# --- publisher --------------------------------------------------------------

my $publisher = preloaded_node(
	'publisher',
	init => { allows_streaming => 'logical' },
	conf => $conf);
$publisher->safe_psql('postgres',
	    'CREATE ROLE regress_ghost; CREATE ROLE regress_alice; '
	  . 'CREATE ROLE regress_bob;'
	  . $schema
	  . 'CREATE PUBLICATION keys_pub FOR TABLE idempotency.keys;');

# Keys of a role that is then dropped: one live, one about to expire. They
# reach the subscribers by the initial copy, the expiring one's delete by
# the replication stream.
my $ghost_live = call_as($publisher, 'regress_ghost', 'ghost-live');
$publisher->safe_psql('postgres',
	"SET ROLE regress_ghost; " . work_call_sql('ghost-expiring') . "; RESET ROLE; "
	  . expire_keys_sql("key = 'ghost-expiring'"));
my $ghost_oid = role_oid($publisher, 'regress_ghost');
# DROP ROLE refuses a role that has keys; a key of a dropped role is left
# only where nothing held its role (dropped before 0.7, or this record
# removed by hand, as here).
$publisher->safe_psql('postgres', q{DELETE FROM pg_shdepend
  WHERE refobjid = 'regress_ghost'::regrole AND objid = 'idempotency.keys'::regclass});
$publisher->safe_psql('postgres', 'DROP ROLE regress_ghost');

# --- subscribers, one per mode ----------------------------------------------

my %subscribers;
for my $mode ('text', 'binary')
{
	my $node = preloaded_node("subscriber_$mode",
		conf => "$conf wal_retrieve_retry_interval = '100ms'\n");
	$node->safe_psql('postgres',
		    'CREATE ROLE regress_mallory; CREATE ROLE regress_bob; '
		  . 'CREATE ROLE regress_alice;'
		  . $schema);
	die "roles must have crossed OIDs for this test to mean anything"
	  unless role_oid($publisher, 'regress_alice') eq
	  role_oid($node, 'regress_bob')
	  && role_oid($node, 'regress_mallory') eq $ghost_oid;
	my $binary = $mode eq 'binary' ? 'true' : 'false';
	$node->safe_psql('postgres',
		    "CREATE SUBSCRIPTION keys_$mode CONNECTION '"
		  . $publisher->connstr . ' dbname=postgres'
		  . "' PUBLICATION keys_pub WITH (binary = $binary)");
	$node->wait_for_subscription_sync($publisher, "keys_$mode");
	$subscribers{$mode} = $node;
}

# --- calls on the publisher, streamed to both subscribers -------------------

my %response;
for my $call ([ 'regress_alice', 'k-alice' ], [ 'regress_bob', 'k-bob' ])
{
	my ($role, $key) = @$call;
	($response{$key}) = split /\|/, call_as($publisher, $role, $key);
}
is($publisher->safe_psql('postgres', 'SELECT idempotency.expire()'),
	'1', 'the dropped role\'s expiring key is deleted on the publisher');
$publisher->wait_for_catchup("keys_$_") for keys %subscribers;

# A rename, on every node: the renamed role's keys stay its own.
for my $node (values %subscribers, $publisher)
{
	$node->safe_psql('postgres',
		'ALTER ROLE regress_bob RENAME TO regress_robert');
}
is(call_as($publisher, 'regress_robert', 'k-bob'),
	"$response{'k-bob'}|t",
	'publisher: after a rename the role\'s retry still replays');
($response{'k-robert'}) = split /\|/,
  call_as($publisher, 'regress_robert', 'k-robert');

# A role the subscribers do not have yet holds their subscriptions up.
my %log_offset = map { $_ => -s $subscribers{$_}->logfile } keys %subscribers;
$publisher->safe_psql('postgres', 'CREATE ROLE regress_carol');
($response{'k-carol'}) = split /\|/,
  call_as($publisher, 'regress_carol', 'k-carol');

for my $mode (sort keys %subscribers)
{
	my $node = $subscribers{$mode};
	# Until then the subscription stops at that key, and never stores it
	# under another role.
	my $carol_error = qr/role "regress_carol" does not exist/;
	my $carol_keys = q{SELECT count(*) FROM idempotency.keys WHERE key = 'k-carol'};
	my $deadline = time() + $PostgreSQL::Test::Utils::timeout_default;
	sleep 0.1
	  until $node->log_contains($carol_error, $log_offset{$mode})
	  || $node->safe_psql('postgres', $carol_keys) ne '0'
	  || time() > $deadline;
	ok($node->log_contains($carol_error, $log_offset{$mode}),
		"$mode: a key of a role missing here stops the subscription (42704)");
	is($node->safe_psql('postgres', $carol_keys),
		'0', "$mode: ... and is not stored under another role");
	$node->safe_psql('postgres', 'CREATE ROLE regress_carol');
	$publisher->wait_for_catchup("keys_$mode");

	is( $node->safe_psql('postgres', $keys_by_name),
		join("\n",
			'ghost-live|-',         'k-alice|regress_alice',
			'k-bob|regress_robert', 'k-carol|regress_carol',
			'k-robert|regress_robert'),
		"$mode: each key belongs to the role of the same name; the dropped "
		  . 'role\'s key to none, its expired key deleted');

	# --- the subscriber as the new primary ---------------------------------
	$node->safe_psql('postgres', "DROP SUBSCRIPTION keys_$mode");

	for my $call (
		[ 'regress_alice',  'k-alice' ],
		[ 'regress_robert', 'k-bob' ],
		[ 'regress_robert', 'k-robert' ],
		[ 'regress_carol',  'k-carol' ])
	{
		my ($role, $key) = @$call;
		is(call_as($node, $role, $key), "$response{$key}|t",
			"$mode: $role\'s retry of $key replays the publisher's response");
	}
	is($node->safe_psql('postgres', 'SELECT count(*) FROM runs'),
		'0', "$mode: fn ran for none of them");

	is( $node->safe_psql(
			'postgres',
			'SET ROLE regress_robert; SELECT key FROM idempotency.keys ORDER BY key'
		),
		"k-bob\nk-robert",
		"$mode: bob (renamed robert) sees only his own keys");
	like(call_as($node, 'regress_robert', 'k-alice'),
		qr/"by": "regress_robert".*\|f$/,
		"$mode: bob's call with alice's key runs fn instead of replaying hers"
	);
	is( $node->safe_psql(
			'postgres',
			'SET ROLE regress_mallory; SELECT count(*) FROM idempotency.keys'),
		'0',
		"$mode: mallory, with the dropped role's OID, sees no key");
	like(call_as($node, 'regress_mallory', 'ghost-live'),
		qr/"by": "regress_mallory".*\|f$/,
		"$mode: mallory's call with the dropped role's key runs fn");
	$node->stop;
}

$publisher->stop;
done_testing();
