# pg_upgrade into a new cluster of the same major version keeps every key:
# its role (role OIDs and the key table's files are carried over), its
# response, created_at and expires_at, and its replay; a dropped role's key
# is deleted with DROP OWNED; a LATIN1 database's keys beyond ASCII
# replay. A cluster whose keys the library of 0.7 wrote, upgraded into one
# with the current library, replays them before and after ALTER EXTENSION
# UPDATE; one with a database at 0.6 upgrades too (every C function its
# schema names exists), and its calls are then refused (55000).
use strict;
use warnings;

use File::Path qw(rmtree);
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use FindBin;
use lib $FindBin::RealBin;
use IdempotencyTest;

my $conf = "idempotency.expire_interval = 0\n";
my $old = preloaded_node('old_cluster', conf => $conf);

$old->safe_psql('postgres', q{
CREATE ROLE regress_alice;
CREATE ROLE regress_bob;
CREATE ROLE regress_gone;
CREATE DATABASE app;
});
command_ok(
	[
		'createdb', '-h', $old->host, '-p', $old->port, '-E', 'LATIN1',
		'-T', 'template0', '--locale=C', 'latin'
	],
	'a LATIN1 database');

my @databases = ('app', 'latin');
# [database, role, key, fn argument]
my @calls = (
	[ 'app', 'regress_alice', 'order-1', 1 ],
	[ 'app', 'regress_bob', 'order-1', 2 ],
	[ 'app', 'regress_alice', 'order-7d', 3 ],
	[ 'latin', 'regress_bob', 'Zürich-ÿ', 5 ],);

sub call_sql
{
	my ($role, $key, $n) = @_;
	return "SET client_encoding = 'UTF8'; SET ROLE $role;
SELECT idempotency.idempotent_call('$key', NULL, 'INSERT INTO runs VALUES (\$1) RETURNING n', $n),
       idempotency.last_call_replayed()";
}

for my $db (@databases)
{
	$old->safe_psql(
		$db, qq{
CREATE EXTENSION idempotency;
CREATE TABLE runs (n int);
GRANT SELECT, INSERT ON runs TO PUBLIC;
SET ROLE regress_gone;
SELECT idempotency.idempotent_call('gone', NULL, 'SELECT 1');
});
}
for my $call (@calls)
{
	my ($db, $role, $key, $n) = @$call;
	my $ttl = $key eq 'order-7d' ? "SET idempotency.ttl = '7 days';" : '';
	is($old->safe_psql($db, $ttl . call_sql($role, $key, $n)),
		"$n|f", "before: $db, $role, '$key' runs");
}
# regress_gone's keys hold it: DROP OWNED deletes them.
$old->safe_psql($_, 'DROP OWNED BY regress_gone') for @databases;
$old->safe_psql('postgres', 'DROP ROLE regress_gone');

my $keys_query = q{SET client_encoding = 'UTF8';
SELECT key, scope::text, scope::regrole::oid, request_hash, response, created_at, expires_at,
       key_digest = idempotency.key_digest(key)
  FROM idempotency.keys ORDER BY key, scope::text};
my %before = map { $_ => $old->safe_psql($_, $keys_query) } @databases;
$old->stop;

my $new = PostgreSQL::Test::Cluster->new('new_cluster');
$new->init;
$new->append_conf('postgresql.conf',
	"shared_preload_libraries = 'idempotency'\n$conf");

# pg_upgrade writes its scripts into the working directory.
my $workdir = PostgreSQL::Test::Utils::tempdir;
chdir $workdir;
my $bindir = $old->config_data('--bindir');
command_ok(
	[
		'pg_upgrade', '--no-sync',
		'-d', $old->data_dir, '-D', $new->data_dir,
		'-b', $bindir, '-B', $bindir,
		'-s', $new->host,
		'-p', $old->port, '-P', $new->port
	],
	'pg_upgrade into a new cluster');
$new->start;
my $default_version = $new->safe_psql('postgres',
	q{SELECT default_version FROM pg_available_extensions WHERE name = 'idempotency'});

for my $db (@databases)
{
	is($new->safe_psql($db, $keys_query),
		$before{$db},
		"$db: every key kept with its role's OID, response, created_at and expires_at");
	is( $new->safe_psql(
			$db, q{SELECT extversion FROM pg_extension WHERE extname = 'idempotency'}),
		$default_version,
		"$db: the extension keeps its version");
	is( $new->safe_psql($db, q{SELECT count(*) FROM idempotency.keys WHERE key = 'gone'}),
		'0', "$db: the dropped role's key is gone with DROP OWNED");
}
for my $call (@calls)
{
	my ($db, $role, $key, $n) = @$call;
	is($new->safe_psql($db, call_sql($role, $key, $n)),
		"$n|t", "after pg_upgrade: $db, $role, '$key' replays");
}
is( $new->safe_psql(
		'app', "SET ROLE regress_bob; SELECT count(*) FROM idempotency.keys"),
	'1',
	'app: bob still sees his own key only');
for my $db (@databases)
{
	is($new->safe_psql($db, 'SELECT count(*) FROM runs'),
		scalar(grep { $_->[0] eq $db } @calls),
		"$db: fn ran again for no key");
}

is( $new->safe_psql(
		'app', q{SELECT count(*) FROM pg_trigger
  WHERE tgrelid = 'idempotency.keys'::regclass AND tgname = 'keys_loaded'}),
	'1',
	'app: the table keeps its trigger keys_loaded');
is($new->safe_psql('app', call_sql('regress_bob', 'order-new', 6)),
	'6|f', 'app: a new key runs and is stored');

# pg_upgrade does not carry the records that keep a role with keys from
# being dropped; the expiry worker's round makes them again, and so does
# idempotency.mark_key_roles().
my $alice_record = q{SELECT count(*) FROM pg_shdepend
 WHERE refobjid = 'regress_alice'::regrole AND objid = 'idempotency.keys'::regclass
   AND dbid = (SELECT oid FROM pg_database WHERE datname = current_database())};
is($new->safe_psql('app', $alice_record),
	'0', 'app: pg_upgrade does not carry the record of regress_alice\'s keys');
$new->safe_psql('postgres', "ALTER SYSTEM SET idempotency.expire_interval = '1s'");
$new->safe_psql('postgres', 'SELECT pg_reload_conf()');
ok($new->poll_query_until('app', $alice_record, '1'),
	'app: the expiry worker\'s round records it again');
is( $new->safe_psql('app',
		q{SELECT evtenabled FROM pg_event_trigger WHERE evtname = 'idempotency_drop_owned_keys'}),
	'A', 'app: the event trigger of DROP OWNED is kept, enabled always');
$new->safe_psql($_, 'SELECT idempotency.mark_key_roles()') for @databases;
my ($rc, $out, $err) = $new->psql('postgres', 'DROP ROLE regress_alice');
like($err, qr/role "regress_alice" cannot be dropped because some objects depend on it/,
	'after mark_key_roles, DROP ROLE refuses a role that has keys');

$new->stop;

# A cluster whose keys the library of 0.7 wrote, in a UTF8, a LATIN1 and a
# WIN1252 database, upgraded by pg_upgrade from the old library's
# installation into one with the current library: the keys read the same
# before and after ALTER EXTENSION UPDATE. A cluster with a database at 0.6
# upgrades as well (pg_upgrade restores its schema, whose C functions the
# current library still exports: they refuse), and its calls are refused
# until the database is updated through 0.7.
sub upgrade_old_release
{
	my ($old_release, $name) = @_;
	$old_release->stop;
	my $upgraded = PostgreSQL::Test::Cluster->new($name);
	$upgraded->init;
	$upgraded->append_conf('postgresql.conf',
		"shared_preload_libraries = 'idempotency'\n$conf");
	command_ok(
		[
			'pg_upgrade', '--no-sync',
			'-d', $old_release->data_dir, '-D', $upgraded->data_dir,
			'-b', $old_release->config_data('--bindir'), '-B', $bindir,
			'-s', $upgraded->host,
			'-p', $old_release->port, '-P', $upgraded->port
		],
		"pg_upgrade from the installation of the library of $name");
	$upgraded->start;
	return $upgraded;
}

my $old07 = old_release_node('old07', '0.7', conf => $conf);
my @dbs = map { [ 'v07_' . lc($_), $_ ] } ('UTF8', 'LATIN1', 'WIN1252');
store_old_release_keys($old07, @$_) for @dbs;
my $upgraded = upgrade_old_release($old07, 'new07');
check_old_release_keys_through_update($upgraded, '0.7', 'after pg_upgrade', @dbs);
$upgraded->stop;

my $old06 = old_release_node('old06', '0.6', conf => $conf);
store_old_release_keys($old06, 'v06', 'UTF8');
my $rows06 = q{SELECT scope::text, key, key_digest, request_hash, response, created_at, expires_at
  FROM idempotency.keys ORDER BY scope::text, key};
my $keys06 = $old06->safe_psql('v06', $rows06);
$upgraded = upgrade_old_release($old06, 'new06');
is( $upgraded->safe_psql('v06', q{SELECT extversion FROM pg_extension WHERE extname = 'idempotency'}),
	'0.6', 'v06: pg_upgrade keeps the extension at 0.6');
check_refuses_schema_before_0_7($upgraded, 'v06', '0.6 database after pg_upgrade');
is($upgraded->safe_psql('v06', $rows06), $keys06, 'v06: pg_upgrade kept every row as 0.6 stored it');
$upgraded->stop;

done_testing();
