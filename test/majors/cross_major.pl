# Keys survive a move to a newer PostgreSQL major: a PostgreSQL 15 cluster
# (the installation IDEMPOTENCY_OLD_INSTALL names, with the extension built
# for it) stores keys of two roles with the same key text, a key with its
# own TTL, a handler key (claim/complete), a stored error, an expired key
# and a tombstone (a key whose response expired); then
# - pg_dump of it restored with pg_restore into the major under test, and
# - pg_upgrade of it into the major under test
# each keep every key byte for byte for its role (response, created_at,
# expires_at), replay it without running fn, leave another role's key of
# the same text alone, refuse a late retry of the tombstone's request (IK410),
# expire only the expired key, and refuse DROP ROLE for a role that has keys. test/run-majors runs it in each Debian root.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../tap";

use IdempotencyTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $old_install = $ENV{IDEMPOTENCY_OLD_INSTALL}
  or BAIL_OUT('IDEMPOTENCY_OLD_INSTALL names no PostgreSQL installation');
# Libraries the old installation's binaries need that this system has only
# in newer versions (other sonames): the new binaries never load them.
$ENV{LD_LIBRARY_PATH} = join(':', grep { defined && length }
	  ($ENV{IDEMPOTENCY_OLD_LIBS}, $ENV{LD_LIBRARY_PATH}));

my $conf = "shared_preload_libraries = 'idempotency'\nidempotency.expire_interval = 0\n";
my $old = PostgreSQL::Test::Cluster->new('old_major', install_path => $old_install);
$old->init;
$old->append_conf('postgresql.conf', $conf);
$old->start;
my $old_major = int($old->safe_psql('postgres', 'SHOW server_version_num') / 10000);
my $restored = PostgreSQL::Test::Cluster->new('restored');
my $new_major = $restored->pg_version->major;
cmp_ok($old_major, '<', $new_major,
	"the old cluster runs PostgreSQL $old_major, older than $new_major");

my $roles = 'CREATE ROLE regress_alice; CREATE ROLE regress_bob;';
$old->safe_psql('postgres', "$roles CREATE DATABASE app;");
$old->safe_psql('app', q{
CREATE EXTENSION idempotency;
CREATE TABLE runs (n int);
GRANT SELECT, INSERT ON runs TO PUBLIC;
});

# [role, key, fn argument]: the same key text for two roles.
my @calls = (
	[ 'regress_alice', 'order-1', 1 ],
	[ 'regress_bob', 'order-1', 2 ],
	[ 'regress_alice', 'order-7d', 3 ],
	[ 'regress_bob', 'üñí-cödé', 4 ],);

sub call_sql
{
	my ($role, $key, $n) = @_;
	return "SET client_encoding = 'UTF8'; SET ROLE $role;
SELECT idempotency.idempotent_call('$key', NULL, 'INSERT INTO runs VALUES (\$1) RETURNING n', $n),
       idempotency.last_call_replayed()";
}

for my $call (@calls)
{
	my ($role, $key, $n) = @$call;
	my $ttl = $key eq 'order-7d' ? "SET idempotency.ttl = '7 days';" : '';
	is($old->safe_psql('app', $ttl . call_sql(@$call)), "$n|f", "PostgreSQL $old_major: $role '$key' runs");
}
$old->safe_psql('app', q{
SET ROLE regress_alice;
BEGIN;
SELECT replayed FROM idempotency.claim('handler-1', 'body-digest');
SELECT idempotency.complete('handler-1', '{"charge": 300, "currency": "EUR"}');
COMMIT;
SET idempotency.store_errors = 'P0001';
SELECT idempotency.idempotent_call('declined', NULL,
  $fn$DO $do$ BEGIN RAISE EXCEPTION 'card declined' USING HINT = 'try another card'; END $do$$fn$);
SELECT idempotency.idempotent_call('late', NULL, 'SELECT 41');
});
# 'late' ran two days ago and its response expired an hour ago: expiry
# leaves its tombstone, remembered for idempotency.remember (7 days).
$old->safe_psql('app', q{UPDATE idempotency.keys
   SET created_at = created_at - interval '2 days', expires_at = now() - interval '1 hour'
 WHERE key = 'late'});
is($old->safe_psql('app', 'SELECT idempotency.expire()'), '1', "PostgreSQL $old_major: 'late' expires");
$old->safe_psql('app', q{SET ROLE regress_alice;
SELECT idempotency.idempotent_call('stale', NULL, 'SELECT 42');
});
# 'stale' expired an hour ago.
$old->safe_psql('app', q{UPDATE idempotency.keys
   SET created_at = created_at - interval '2 days', expires_at = now() - interval '1 hour'
 WHERE key = 'stale'});

my $keys_query = q{SET client_encoding = 'UTF8';
SELECT key, scope::text, request_hash, response, created_at, expires_at, expired_at,
       key_digest = idempotency.key_digest(key)
  FROM idempotency.keys ORDER BY key, scope::text, key_digest};
my $before = $old->safe_psql('app', $keys_query);
is(scalar(split /\n/, $before), 8, 'seven keys and a tombstone stored before the move');

# Minor releases of PostgreSQL's older branches (Debian's 15.20, 17.12)
# keep a version of each column in its attribute options (pg_attver); a
# newer major built before that change (Debian's 18.6, 19rc1) refuses the
# option, which its pg_dump copies and pg_upgrade replays for every table,
# the extension's or not.
my $old_keeps_attver = $old->safe_psql('app', q{SELECT count(*) > 0 FROM pg_attribute
 WHERE array_to_string(attoptions, ',') LIKE '%pg_attver=%'}) eq 't';
$restored->init;
$restored->append_conf('postgresql.conf', $conf);
$restored->start;
my ($probe_rc) = $restored->psql('postgres',
	'CREATE TEMP TABLE probe (n int); ALTER TABLE probe ALTER COLUMN n SET (pg_attver = 1)');
my $attver_refused = $old_keeps_attver && $probe_rc != 0;
note("PostgreSQL $old_major keeps pg_attver options and PostgreSQL $new_major refuses them")
  if $attver_refused;

# The dump is made with the new major's pg_dump, as PostgreSQL advises, or
# with the old one's, which leaves its own attribute versions out, where the
# new server refuses them.
my $dump = PostgreSQL::Test::Utils::tempdir . '/app.dump';
my $pg_dump = $attver_refused ? "$old_install/bin/pg_dump" : 'pg_dump';
command_ok([ $pg_dump, '-Fc', '-h', $old->host, '-p', $old->port, '-f', $dump, 'app' ],
	"pg_dump ($pg_dump) of the PostgreSQL $old_major database");
$old->stop;

# What every new cluster must show: the same keys, replays for their own
# role only, expiry of the stale key only, DROP ROLE refused.
sub check_moved
{
	my ($node, $how) = @_;
	is($node->safe_psql('app', $keys_query), $before,
		"$how: every key kept byte for byte with its role, response, created_at and expires_at");
	for my $call (@calls)
	{
		my ($role, $key, $n) = @$call;
		is($node->safe_psql('app', call_sql(@$call)), "$n|t", "$how: $role '$key' replays");
	}
	is( $node->safe_psql(
			'app', q{SET ROLE regress_alice;
SELECT replayed, response FROM idempotency.claim('handler-1', 'body-digest')}),
		't|{"charge": 300, "currency": "EUR"}',
		"$how: the handler key replays its response");
	is( $node->safe_psql(
			'app', q{SET ROLE regress_alice; SET idempotency.store_errors = 'P0001';
SELECT idempotency.idempotent_call('declined', NULL,
  $fn$DO $do$ BEGIN RAISE EXCEPTION 'card declined' USING HINT = 'try another card'; END $do$$fn$)->'error'->>'hint'}),
		'try another card',
		"$how: the stored error replays");
	my ($late_rc, $late_out, $late_err) = $node->psql('app',
		q{SET ROLE regress_alice; SELECT idempotency.idempotent_call('late', NULL, 'SELECT 41')});
	like($late_err, qr/idempotency key "late" already ran at .*; its response is no longer kept/,
		"$how: a late retry of the tombstone's request is refused (IK410)");
	($late_rc, $late_out, $late_err) = $node->psql('app',
		q{SET ROLE regress_alice; SELECT idempotency.idempotent_call('late', NULL, 'SELECT 43')});
	like($late_err, qr/idempotency key "late" was already used with a different request/,
		"$how: another request with the tombstone's key is refused (IK422)");
	is($node->safe_psql('app', 'SELECT count(*) FROM runs'),
		scalar @calls, "$how: fn ran again for no key");
	is($node->safe_psql('app', 'SELECT idempotency.expire()'),
		'1', "$how: expire() deletes the expired key, and only it");
	is( $node->safe_psql(
			'app', q{SELECT string_agg(key, ',' ORDER BY key) FROM idempotency.keys WHERE key = 'stale'}),
		'', "$how: the expired key is gone");
	$node->safe_psql('app', 'SELECT idempotency.mark_key_roles()');
	my ($rc, $out, $err) = $node->psql('postgres', 'DROP ROLE regress_bob');
	like($err, qr/role "regress_bob" cannot be dropped because some objects depend on it/,
		"$how: DROP ROLE refuses a role that has keys");
}

$restored->safe_psql('postgres', "$roles CREATE DATABASE app;");
command_ok([ 'pg_restore', '-h', $restored->host, '-p', $restored->port, '-d', 'app', $dump ],
	"pg_restore into PostgreSQL $new_major");
check_moved($restored, "restored into $new_major");
$restored->stop;

SKIP:
{
	skip "pg_upgrade from PostgreSQL $old_major to $new_major: the old server's pg_attver options, which the new one refuses, stop it for every table (not the extension's doing)", 14
	  if $attver_refused;
	my $upgraded = PostgreSQL::Test::Cluster->new('upgraded');
	# From PostgreSQL 18 on initdb turns data checksums on; pg_upgrade needs the
	# old cluster's setting.
	$upgraded->init(extra => $new_major >= 18 ? ['--no-data-checksums'] : []);
	$upgraded->append_conf('postgresql.conf', $conf);
	# pg_upgrade writes its scripts and logs into the working directory.
	chdir PostgreSQL::Test::Utils::tempdir;
	command_ok(
		[
			'pg_upgrade', '--no-sync',
			'-d', $old->data_dir, '-D', $upgraded->data_dir,
			'-b', "$old_install/bin", '-B', $upgraded->config_data('--bindir'),
			'-s', $upgraded->host,
			'-p', $old->port, '-P', $upgraded->port
		],
		"pg_upgrade from PostgreSQL $old_major to $new_major");
	$upgraded->start;
	check_moved($upgraded, "pg_upgrade to $new_major");
	$upgraded->stop;
}

done_testing();
