# A dropped role's keys are out of every role's reach for ever, including a
# role that later gets the same OID.
#
# - DROP ROLE refuses (2BP01) a role that has keys in any database, also
#   after REASSIGN OWNED, and names the databases; a restored dump's keys
#   hold their role too. DROP OWNED BY, in each database, deletes the role's
#   keys there (a key being stored meanwhile is waited for and deleted too;
#   a session of the role that stores a key afterwards holds its role
#   again), and only a role with the rights of DROP OWNED may run it.
#   GRANT and REVOKE on the key table keep the refusal, DROP EXTENSION ends
#   it.
# - The cluster's OID counter is then set back to the dropped role's OID
#   (pg_resetwal -o) and a new role gets that OID: in every database it
#   sees none of the old keys (row-level security and key_usage), its calls
#   with the old keys and request hashes run fn (no replay, no IK422).
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use FindBin;
use lib $FindBin::RealBin;
use IdempotencyTest;

my $node = preloaded_node('role_lifecycle',
	conf => "idempotency.expire_interval = 0\nmax_prepared_transactions = 2\n");
my @databases = ('app', 'other');
$node->safe_psql('postgres', 'CREATE ROLE regress_a; CREATE ROLE regress_helper');
$node->safe_psql('postgres', "CREATE DATABASE $_") for @databases;
for my $db (@databases)
{
	$node->safe_psql(
		$db, qq{
CREATE EXTENSION idempotency;
CREATE TABLE runs (n int);
GRANT SELECT, INSERT ON runs TO PUBLIC;
});
}

sub call_sql
{
	my ($role, $key, $hash, $n) = @_;
	return "SET ROLE $role; SELECT idempotency.idempotent_call('$key', '$hash', "
	  . "'INSERT INTO runs VALUES (\$1) RETURNING n', $n), "
	  . "idempotency.last_call_replayed(); RESET ROLE;";
}

# The SQLSTATE and message of a statement run in `db`.
sub error_of
{
	my ($db, $sql) = @_;
	my ($rc, $stdout, $stderr) = $node->psql(
		$db, $sql,
		on_error_stop => 0,
		extra_params => [ '-v', 'VERBOSITY=verbose' ]);
	return $stderr =~ /ERROR:\s+([0-9A-Z]{5}):/ ? ($1, $stderr) : ('no error', $stderr);
}

sub keys_of
{
	my ($db, $role) = @_;
	return $node->safe_psql($db,
		"SELECT count(*) FROM idempotency.keys WHERE scope::text = '$role'");
}

for my $db (@databases)
{
	is($node->safe_psql($db, call_sql('regress_a', 'same', 'h', 1)),
		'1|f', "$db: regress_a stores key 'same'");
	is($node->safe_psql($db, call_sql('regress_a', 'other-hash', 'h', 2)),
		'2|f', "$db: regress_a stores key 'other-hash'");
}
my $oid_a = $node->safe_psql('postgres', q{SELECT 'regress_a'::regrole::oid});

# A restored dump's keys hold their role as well.
my $dump = $node->basedir . '/app.dump';
command_ok([ 'pg_dump', '-Fc', '-d', $node->connstr('app'), '-f', $dump ],
	'pg_dump of app');
$node->safe_psql('postgres', 'CREATE DATABASE restored');
command_ok([ 'pg_restore', '-d', $node->connstr('restored'), $dump ],
	'pg_restore into restored');
is(keys_of('restored', 'regress_a'), '2', 'restored: the keys are loaded');

# DROP ROLE refuses while keys exist, REASSIGN OWNED changes nothing.
my ($state, $stderr) = error_of('app', 'DROP ROLE regress_a');
is($state, '2BP01', 'DROP ROLE of a role that has keys: 2BP01');
like(
	$stderr,
	qr/role "regress_a" cannot be dropped because some objects depend on it/,
	'... with PostgreSQL\'s own message');
like($stderr, qr/privileges for column scope of table idempotency\.keys/,
	'... naming the key table in this database');
like($stderr, qr/object in database other/, '... and the other databases');
$node->safe_psql($_, 'REASSIGN OWNED BY regress_a TO regress_helper')
  for ('app', 'other', 'restored');
is((error_of('app', 'DROP ROLE regress_a'))[0],
	'2BP01', 'after REASSIGN OWNED in every database: still 2BP01');
is(keys_of('app', 'regress_a'), '2', '... and the keys stay with their role');

# Only a role with DROP OWNED's rights runs it.
is( (error_of('app', 'SET ROLE regress_helper; DROP OWNED BY regress_a'))[0],
	'42501', 'DROP OWNED BY another role without its rights: 42501');
is(keys_of('app', 'regress_a'), '2', '... and no key is deleted');

# DROP OWNED waits for a key being stored, and deletes it too.
my $storer = $node->background_psql('app');
$storer->query_safe('SET ROLE regress_a');
$storer->query_safe('BEGIN');
$storer->query_safe(
	q{SELECT idempotency.idempotent_call('late', 'h', 'INSERT INTO runs VALUES (3) RETURNING n')});
my $dropper = $node->background_psql('app');
$dropper->query_until(qr/sent/, "\\echo sent\nDROP OWNED BY regress_a;\n");
ok( $node->poll_query_until(
		'app', q{SELECT EXISTS (SELECT FROM pg_stat_activity
  WHERE query LIKE 'DROP OWNED%' AND wait_event_type = 'Lock')}),
	'DROP OWNED waits for the transaction storing a key');
$storer->query_safe('COMMIT');
$dropper->query_safe('SELECT 1');
is(keys_of('app', 'regress_a'), '0',
	'DROP OWNED BY deletes the role\'s keys, the one stored meanwhile too');
is(keys_of('other', 'regress_a'), '2', '... in its own database only');

# The role's session, which had its mark, stores a key afterwards.
is( $storer->query_safe(
		q{SELECT idempotency.idempotent_call('after', 'h', 'INSERT INTO runs VALUES (4) RETURNING n')}),
	'4',
	'a session of the role stores a key after DROP OWNED');
$storer->quit;
$dropper->quit;
($state, $stderr) = error_of('other', 'DROP ROLE regress_a');
like($stderr, qr/object in database app/,
	'... and DROP ROLE counts it again');

$node->safe_psql($_, 'DROP OWNED BY regress_a') for ('app', 'other');
# The event trigger fires with session_replication_role = replica too.
$node->safe_psql('restored',
	'SET session_replication_role = replica; DROP OWNED BY regress_a');
is(keys_of('restored', 'regress_a'), '0',
	'DROP OWNED deletes the keys with session_replication_role = replica');
is((error_of('postgres', 'DROP ROLE regress_a'))[0],
	'no error', 'after DROP OWNED in every database DROP ROLE succeeds');

# GRANT and REVOKE on the key table leave the record; DROP EXTENSION
# removes it with the keys.
$node->safe_psql('postgres', 'CREATE ROLE regress_c; CREATE DATABASE dropext');
$node->safe_psql('dropext', q{
CREATE EXTENSION idempotency;
SET ROLE regress_c;
SELECT idempotency.idempotent_call('c', NULL, 'SELECT 1');
RESET ROLE;
GRANT SELECT ON idempotency.keys TO regress_c;
REVOKE SELECT ON idempotency.keys FROM regress_c;
});
is((error_of('postgres', 'DROP ROLE regress_c'))[0],
	'2BP01', 'after GRANT and REVOKE on the key table DROP ROLE still refuses');
$node->safe_psql('dropext', 'DROP EXTENSION idempotency');
is((error_of('postgres', 'DROP ROLE regress_c'))[0],
	'no error', 'DROP EXTENSION takes the keys and the record with it');

# A mark recorded by a transaction, a savepoint or a prepared transaction
# that rolls back goes with it: the session forgets it, and its next key
# records it again.
my %rolled_back = (
	regress_d => q{BEGIN; SELECT idempotency.idempotent_call('d-gone', NULL, 'SELECT 1'); ROLLBACK;},
	regress_e => q{BEGIN; SAVEPOINT s; SELECT idempotency.idempotent_call('e-gone', NULL, 'SELECT 1');
		ROLLBACK TO SAVEPOINT s; COMMIT;},
	regress_f => q{BEGIN; SELECT idempotency.idempotent_call('f-gone', NULL, 'SELECT 1');
		PREPARE TRANSACTION 'f'; ROLLBACK PREPARED 'f';});
for my $role (sort keys %rolled_back)
{
	$node->safe_psql('postgres', "CREATE ROLE $role");
	$node->safe_psql('app', "SET ROLE $role;"
		  . $rolled_back{$role}
		  . "SELECT idempotency.idempotent_call('kept', NULL, 'SELECT 1');");
	is((error_of('postgres', "DROP ROLE $role"))[0],
		'2BP01', "$role: its key holds its role after a rolled-back mark");
	$node->safe_psql('app', "DROP OWNED BY $role");
	$node->safe_psql('postgres', "DROP ROLE $role");
}

# A new role gets the dropped role's OID. A new OID is checked against
# every row version of pg_authid, dead ones too: the dropped role's row is
# vacuumed away first.
$node->safe_psql('postgres', 'VACUUM pg_catalog.pg_authid');
$node->stop;
command_ok([ 'pg_resetwal', '-o', $oid_a, $node->data_dir ],
	'pg_resetwal -o sets the next OID to the dropped role\'s');
$node->start;
$node->safe_psql('postgres', 'CREATE ROLE regress_b');
is($node->safe_psql('postgres', q{SELECT 'regress_b'::regrole::oid}),
	$oid_a, 'the new role regress_b has the dropped role\'s OID');

for my $db (@databases)
{
	is( $node->safe_psql($db,
			'SET ROLE regress_b; SELECT count(*) FROM idempotency.keys'),
		'0',
		"$db: regress_b sees no key");
	is( $node->safe_psql($db,
			q{SELECT count(*) FROM idempotency.key_usage WHERE role = 'regress_b'::regrole}),
		'0',
		"$db: key_usage counts no key for regress_b");
	is( $node->safe_psql($db,
			"SET ROLE regress_b; SELECT state FROM idempotency.lookup('same')"),
		'absent', "$db: lookup finds no key 'same'");
	is($node->safe_psql($db, call_sql('regress_b', 'same', 'h', 11)),
		'11|f', "$db: regress_b's call with the same key and hash runs fn");
	is($node->safe_psql($db, call_sql('regress_b', 'other-hash', 'x', 12)),
		'12|f', "$db: regress_b's call with another hash runs fn (no IK422)");
}

$node->stop;

done_testing();
