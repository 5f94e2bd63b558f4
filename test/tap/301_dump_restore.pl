# pg_dump keeps the keys: after a dump and restore into another database,
# a retry replays instead of running fn again. Restored into another
# cluster whose roles have other OIDs, or copied there with binary COPY,
# every key stays with the role of the same name, and the key of a role
# dropped before the dump belongs to no role there. A tombstone (a key whose
# response expired) stays one: a retry of its request gets IK410.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use FindBin;
use lib $FindBin::RealBin;
use IdempotencyTest;

my $node = preloaded_node('dump_restore');

$node->safe_psql(
	'postgres', q{
CREATE ROLE regress_ghost;
CREATE ROLE regress_app;
CREATE DATABASE source;
});
$node->safe_psql(
	'source', q{
CREATE EXTENSION idempotency;
CREATE TABLE runs (n int);
GRANT SELECT, INSERT ON runs TO regress_app;
SET ROLE regress_app;
SELECT idempotency.idempotent_call('kept-1', NULL, 'INSERT INTO runs VALUES ($1) RETURNING n', 1);
BEGIN;
SET LOCAL idempotency.ttl = '7 days';
SELECT idempotency.idempotent_call('kept-7d', NULL, 'INSERT INTO runs VALUES ($1) RETURNING n', 7);
COMMIT;
RESET ROLE;
-- A window other than the default, kept by the dump.
SET idempotency.remember = '2 hours';
SET ROLE regress_app;
SELECT idempotency.idempotent_call('kept-2h', NULL, 'INSERT INTO runs VALUES ($1) RETURNING n', 2);
RESET ROLE;
RESET idempotency.remember;
SET ROLE regress_app;
SELECT idempotency.idempotent_call('gone-1', NULL, 'INSERT INTO runs VALUES ($1) RETURNING n', 3);
RESET ROLE;
-- gone-1's response expired an hour ago: expiry keeps its tombstone.
UPDATE idempotency.keys SET created_at = now() - interval '2 hours',
       expires_at = now() - interval '1 hour' WHERE key = 'gone-1';
SELECT idempotency.expire();
SET ROLE regress_ghost;
SELECT idempotency.idempotent_call('ghost-key', NULL, 'SELECT 1');
});
my $ghost_oid = $node->safe_psql('postgres', q{SELECT 'regress_ghost'::regrole::oid});
my $app_oid = $node->safe_psql('postgres', q{SELECT 'regress_app'::regrole::oid});
# DROP ROLE refuses a role that has keys; a key of a dropped role is left
# only where nothing held its role (dropped before 0.7, or this record
# removed by hand, as here).
$node->safe_psql('source', q{DELETE FROM pg_shdepend
  WHERE refobjid = 'regress_ghost'::regrole AND objid = 'idempotency.keys'::regclass});
$node->safe_psql('postgres', 'DROP ROLE regress_ghost');

my $keys_query = q{SELECT scope, key, key_digest, request_hash, response,
  expires_at - created_at, expired_at, remember_for FROM idempotency.keys ORDER BY key};
is($node->safe_psql('source',
	q{SELECT count(*) FROM idempotency.keys WHERE key = '' AND expired_at IS NOT NULL}),
	'1', 'the source holds a tombstone');
my $before = $node->safe_psql('source', $keys_query);

my $dump = $node->basedir . '/source.dump';
command_ok([ 'pg_dump', '-Fc', '-d', $node->connstr('source'), '-f', $dump ],
	'pg_dump of a database with keys');
$node->safe_psql('postgres', 'CREATE DATABASE target');
command_ok([ 'pg_restore', '-d', $node->connstr('target'), $dump ],
	'pg_restore into another database');

is($node->safe_psql('target', $keys_query), $before,
	'the restored keys are the dumped keys, scope and TTL included');

is( $node->safe_psql(
		'target', q{SELECT key, remember_for FROM idempotency.keys
		  WHERE key IN ('kept-1', 'kept-2h') ORDER BY key}),
	"kept-1|\nkept-2h|02:00:00",
	'the window a key was claimed with comes with it (NULL: the default)');

my $retry = q{SET ROLE regress_app;
SELECT idempotency.idempotent_call('kept-1', NULL, 'INSERT INTO runs VALUES ($1) RETURNING n', 1),
       idempotency.last_call_replayed()};
is($node->safe_psql('target', $retry), '1|t', 'a retry after restore replays');
is($node->safe_psql('target', 'SELECT count(*) FROM runs'),
	'4', 'fn did not run again (four rows came with the dump)');

# A retry of the tombstone's request: IK410, nothing runs.
sub gone_retry
{
	my ($cluster, $db) = @_;
	my ($rc, $out, $err) = $cluster->psql($db,
		q{SET ROLE regress_app;
SELECT idempotency.idempotent_call('gone-1', NULL, 'INSERT INTO runs VALUES ($1) RETURNING n', 3)},
		extra_params => [ '-v', 'VERBOSITY=verbose' ]);
	return $err =~ /ERROR:\s+([0-9A-Z]{5}):/ ? $1 : 'no error';
}
is(gone_retry($node, 'target'), 'IK410', 'a retry of the restored tombstone\'s request gets IK410');
is($node->safe_psql('target', 'SELECT count(*) FROM runs'), '4', 'and does not run');

my ($rc, $out, $err) = $node->psql('target',
	q{SET ROLE regress_app; INSERT INTO idempotency.keys (scope, key, request_hash, created_at, expires_at)
	  VALUES ('regress_app', 'x', 'h', now(), now())});
like($err, qr/permission denied/, 'the restored key table is still closed to callers');

# --- another cluster, whose roles have other OIDs ----------------------------

my $binary_copy = $node->basedir . '/keys.copy';
$node->safe_psql('source',
	"COPY idempotency.keys TO '$binary_copy' (FORMAT binary)");
my $by_role = q{SELECT key, scope FROM idempotency.keys ORDER BY key};
is( $node->safe_psql('source', $by_role),
	"|regress_app\nghost-key|-\nkept-1|regress_app\nkept-2h|regress_app\nkept-7d|regress_app",
	'a dropped role\'s key shows as no role ("-")');

# mallory gets the dropped role's OID there, and a bystander regress_app's.
my $other = preloaded_node('other_cluster');
$other->safe_psql(
	'postgres', q{
CREATE ROLE regress_mallory;
CREATE ROLE regress_bystander;
CREATE ROLE regress_app;
CREATE DATABASE copied;
});
die 'roles must have crossed OIDs for this test to mean anything'
  unless $other->safe_psql('postgres', q{SELECT 'regress_mallory'::regrole::oid})
  eq $ghost_oid
  && $other->safe_psql('postgres', q{SELECT 'regress_bystander'::regrole::oid})
  eq $app_oid;

$other->safe_psql('postgres', 'CREATE DATABASE restored');
command_ok([ 'pg_restore', '-d', $other->connstr('restored'), $dump ],
	'pg_restore into another cluster');
$other->safe_psql('restored', 'GRANT SELECT, INSERT ON runs TO PUBLIC');
$other->safe_psql(
	'copied', qq{
CREATE EXTENSION idempotency;
CREATE TABLE runs (n int);
GRANT SELECT, INSERT ON runs TO PUBLIC;
COPY idempotency.keys FROM '$binary_copy' (FORMAT binary);
});

for my $db ('restored', 'copied')
{
	is($other->safe_psql($db, $by_role),
		"|regress_app\nghost-key|-\nkept-1|regress_app\nkept-2h|regress_app\nkept-7d|regress_app",
		"$db: each key belongs to the role of the same name");
	is( $other->safe_psql(
			$db,
			q{SET ROLE regress_app;
SELECT idempotency.idempotent_call('kept-1', NULL, 'INSERT INTO runs VALUES ($1) RETURNING n', 1),
       idempotency.last_call_replayed()}),
		'1|t',
		"$db: regress_app's retry replays");
	is(gone_retry($other, $db), 'IK410', "$db: regress_app's tombstone refuses its retry (IK410)");
	for my $role ('regress_bystander', 'regress_mallory')
	{
		is( $other->safe_psql(
				$db,
				"SET ROLE $role; SELECT count(*) FROM idempotency.keys"),
			'0',
			"$db: $role, with a source role's OID, sees no key");
	}
	is( $other->safe_psql(
			$db,
			q{SET ROLE regress_bystander;
SELECT idempotency.idempotent_call('kept-1', NULL, 'INSERT INTO runs VALUES ($1) RETURNING n', 1),
       idempotency.last_call_replayed()}),
		'1|f',
		"$db: the bystander's call with regress_app's key runs fn");
	is( $other->safe_psql(
			$db,
			q{SET ROLE regress_mallory;
SELECT idempotency.idempotent_call('ghost-key', NULL, 'SELECT 1'),
       idempotency.last_call_replayed()}),
		'1|f',
		"$db: mallory's call with the dropped role's key runs fn");
}

$other->stop;
$node->stop;
done_testing();
