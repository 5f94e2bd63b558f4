# A key's identity does not depend on the database encoding: keys stored
# with characters beyond ASCII in a LATIN1 database, dumped (custom and
# plain format) and restored into a UTF8 database, replay there, fn does
# not run again and each key keeps one row. A key's limit counts its UTF-8
# form in every encoding: a key of 255 bytes of UTF-8 (128 bytes in LATIN1)
# is accepted in LATIN1 and replays in UTF8; one of 256 (128 in LATIN1) is
# refused in both. A MULE_INTERNAL database, which has no conversion to
# UTF-8, is refused at CREATE EXTENSION. Keys the library of 0.7 wrote
# in a UTF8, a LATIN1 and a WIN1252 database replay with the current
# library on the same data directory, before and after ALTER EXTENSION
# UPDATE. A database still at 0.6 is refused (55000) until it is updated
# to 0.7 with the library of 0.7, after which its keys replay too.
#
# This file is UTF-8; its SQL sets client_encoding accordingly, so that the
# server converts the keys into LATIN1.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use FindBin;
use lib $FindBin::RealBin;
use IdempotencyTest;

my $node = preloaded_node('encoding_restore',
	conf => "idempotency.expire_interval = 0\n");

# The last key is at the limit: 127 characters of two bytes in UTF-8 and
# one ASCII character, 255 bytes of UTF-8.
my $at_limit = ('é' x 127) . 'x';
my @keys = ('café-1', 'Zürich ÿ', 'naïve ½ «key»', 'plain-ascii', $at_limit);

# One byte over the limit in UTF-8, though 128 bytes in LATIN1.
my $over_limit = 'é' x 128;

# A call of the key over the limit in `db` fails with 22023, and stores nothing.
sub check_over_limit_refused
{
	my ($db, $what) = @_;
	my ($rc, $stdout, $stderr) = $node->psql(
		$db,
		"SET client_encoding = 'UTF8';
SELECT idempotency.idempotent_call('$over_limit', 'over', 'INSERT INTO runs VALUES (0) RETURNING n')",
		extra_params => [ '-v', 'VERBOSITY=verbose' ]);
	like($stderr, qr/ERROR:\s+22023: idempotency key is 256 bytes long, the limit is 255/,
		"$what: a key of 256 bytes of UTF-8 is refused (22023)");
	is($node->safe_psql($db, 'SELECT count(*) FROM runs WHERE n = 0'),
		'0', "$what: ... and fn did not run");
}

# Calls every key once in `db`; the keys' fn records a run per call.
sub store_keys
{
	my ($db) = @_;
	my $sql = "SET client_encoding = 'UTF8';\n";
	my $n = 0;
	for my $key (@keys)
	{
		$n++;
		$sql .= "SELECT idempotency.idempotent_call('$key', 'h$n', "
		  . "'INSERT INTO runs VALUES (\$1) RETURNING n', $n);\n";
	}
	# A request fingerprinted by the extension, with text beyond ASCII: its
	# fingerprint hashes the text as UTF-8, so it survives the move too.
	$sql .= "SELECT idempotency.idempotent_call('text-argument', NULL, 'SELECT \$1::text', 'grüße');\n";
	$node->safe_psql($db, $sql);
}

# Every key, called again in `db`, replays its response; fn ran once per
# key; one row per key; every digest is idempotency.key_digest(key).
sub check_replays
{
	my ($db, $what) = @_;
	my $n = 0;
	for my $key (@keys)
	{
		$n++;
		is( $node->safe_psql(
				$db,
				"SET client_encoding = 'UTF8';
SELECT idempotency.idempotent_call('$key', 'h$n',
  'INSERT INTO runs VALUES (\$1) RETURNING n', $n), idempotency.last_call_replayed()"
			),
			"$n|t",
			"$what: key '" . substr($key, 0, 20) . "' replays");
	}
	is( $node->safe_psql(
			$db,
			"SET client_encoding = 'UTF8';
SELECT idempotency.idempotent_call('text-argument', NULL, 'SELECT \$1::text', 'grüße'),
  idempotency.last_call_replayed()"),
		'"grüße"|t',
		"$what: a computed fingerprint over text beyond ASCII replays");
	is( $node->safe_psql($db, 'SELECT count(*), count(DISTINCT n) FROM runs'),
		scalar(@keys) . '|' . scalar(@keys),
		"$what: fn ran once per key, none again");
	is( $node->safe_psql(
			$db, q{SELECT count(*), count(DISTINCT key),
  count(*) FILTER (WHERE key_digest = idempotency.key_digest(key))
  FROM idempotency.keys}),
		join('|', scalar(@keys) + 1, scalar(@keys) + 1, scalar(@keys) + 1),
		"$what: one row per key, its digest that of its UTF-8 form");
}

# Dumps `source` in both formats and restores each into a new UTF8
# database, where every key must replay.
sub dump_and_restore
{
	my ($source, $label) = @_;
	my $custom = $node->basedir . "/$source.dump";
	my $plain = $node->basedir . "/$source.sql";
	command_ok([ 'pg_dump', '-Fc', '-d', $node->connstr($source), '-f', $custom ],
		"$label: pg_dump -Fc");
	command_ok([ 'pg_dump', '-Fp', '-d', $node->connstr($source), '-f', $plain ],
		"$label: pg_dump -Fp");

	my $target = "${source}_custom_utf8";
	$node->safe_psql('postgres',
		"CREATE DATABASE $target ENCODING 'UTF8' TEMPLATE template0 LOCALE 'C'");
	command_ok([ 'pg_restore', '-d', $node->connstr($target), $custom ],
		"$label: pg_restore into UTF8");
	check_replays($target, "$label, custom dump restored into UTF8");
	check_over_limit_refused($target, "$label, custom dump restored into UTF8");

	$target = "${source}_plain_utf8";
	$node->safe_psql('postgres',
		"CREATE DATABASE $target ENCODING 'UTF8' TEMPLATE template0 LOCALE 'C'");
	command_ok(
		[
			'psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1',
			'-d', $node->connstr($target), '-f', $plain
		],
		"$label: plain dump restored into UTF8");
	check_replays($target, "$label, plain dump restored into UTF8");
	check_over_limit_refused($target, "$label, plain dump restored into UTF8");
}

# --- stored under the current version ---------------------------------------
command_ok(
	[
		'createdb', '-h', $node->host, '-p', $node->port, '-E', 'LATIN1',
		'-T', 'template0', '--locale=C', 'latin'
	],
	'a LATIN1 database');
$node->safe_psql('latin', q{
CREATE EXTENSION idempotency;
CREATE TABLE runs (n int);
});
is($node->safe_psql('latin', 'SHOW server_encoding'), 'LATIN1', 'server encoding');
store_keys('latin');
check_replays('latin', 'LATIN1 database');
is($node->safe_psql('latin', "SELECT octet_length(key) FROM idempotency.keys WHERE key LIKE '%x'"),
	'128', 'the key at the limit is 128 bytes in LATIN1');
check_over_limit_refused('latin', 'LATIN1 database');
is( $node->safe_psql(
		'latin', q{SET client_encoding = 'UTF8';
SELECT idempotency.key_digest('Zürich ÿ') = '\x'::bytea || substr(sha256(convert_to('Zürich ÿ', 'UTF8')), 1, 11)}
	),
	't',
	'key_digest is over the key\'s UTF-8 bytes in a LATIN1 database');
dump_and_restore('latin', 'current version');

# --- an encoding with no conversion to UTF-8 ---------------------------------
# Keys and fingerprints are taken over UTF-8: CREATE EXTENSION refuses a
# MULE_INTERNAL database (0A000) and leaves nothing behind.
$node->safe_psql('postgres',
	"CREATE DATABASE mule ENCODING 'MULE_INTERNAL' TEMPLATE template0 LC_COLLATE 'C' LC_CTYPE 'C'");
{
	my ($rc, $stdout, $stderr) = $node->psql('mule', 'CREATE EXTENSION idempotency',
		extra_params => [ '-v', 'VERBOSITY=verbose' ]);
	like($stderr,
		qr/ERROR:\s+0A000: idempotency cannot be installed in a database encoded in MULE_INTERNAL/,
		'MULE_INTERNAL: CREATE EXTENSION is refused (0A000)');
	like($stderr, qr/no conversion from MULE_INTERNAL to UTF8/, '... saying why');
}
is($node->safe_psql('mule',
		q{SELECT count(*) FROM pg_namespace WHERE nspname = 'idempotency'}),
	'0', '... and leaves no schema behind');

$node->stop;

# --- written by the library of 0.7 -----------------------------------------
# Keys the old library itself wrote (its fingerprints and digests) in a
# UTF8, a LATIN1 and a WIN1252 database, read by the current library on the
# same data directory, then after ALTER EXTENSION UPDATE.
my $old = old_release_node('old07', '0.7', conf => "idempotency.expire_interval = 0\n");
my @dbs = map { [ 'v07_' . lc($_), $_ ] } ('UTF8', 'LATIN1', 'WIN1252');
for my $db (@dbs)
{
	store_old_release_keys($old, @$db);
	is( $old->safe_psql($db->[0],
			q{SELECT extversion FROM pg_extension WHERE extname = 'idempotency'}),
		'0.7', "$db->[1]: the keys are stored by the 0.7 library");
	check_old_release_keys($old, $db->[0], "0.7 library, $db->[1]");
}
my $current = reopen_with_current_library($old, 'current07');
check_old_release_keys_through_update($current, '0.7', 'current library', @dbs);
for my $db (@dbs)
{
	is( $current->safe_psql($db->[0],
			q{SELECT extversion FROM pg_extension WHERE extname = 'idempotency'}),
		$current->safe_psql($db->[0],
			q{SELECT default_version FROM pg_available_extensions WHERE name = 'idempotency'}),
		"$db->[1]: updated to the current version");
}
$current->stop;

# --- a database still at 0.6 -----------------------------------------------
# The current library serves the schemas of 0.7 and later: a database at
# 0.6 is refused until a DBA updates it to 0.7 with the library of 0.7, as
# the refusal's hint says; then this library and ALTER EXTENSION UPDATE.
$old = old_release_node('old06', '0.6', conf => "idempotency.expire_interval = 0\n");
store_old_release_keys($old, 'v06', 'UTF8');
check_old_release_keys($old, 'v06', '0.6 library, UTF8');
my $version_query = q{SELECT extversion FROM pg_extension WHERE extname = 'idempotency'};
my $keys_query = q{SELECT scope::text, key, key_digest, request_hash, response, created_at, expires_at
  FROM idempotency.keys ORDER BY scope::text, key};
my $keys_at_06 = $old->safe_psql('v06', $keys_query);

$current = reopen_with_current_library($old, 'current06');
check_refuses_schema_before_0_7($current, 'v06', '0.6 database, current library');
my ($rc, $stdout, $stderr) = $current->psql('v06', 'ALTER EXTENSION idempotency UPDATE');
isnt($rc, 0, '0.6 database, current library: ALTER EXTENSION UPDATE fails');
like($stderr, qr/extension "idempotency" has no update path from version "0\.6" to version "/,
	'... with PostgreSQL\'s "no update path" error');
is($current->safe_psql('v06', $version_query), '0.6', '... and the extension stays at 0.6');
is($current->safe_psql('v06', $keys_query), $keys_at_06, '... with every row as 0.6 stored it');

# The way out: the library of 0.7 updates the database to 0.7 (its update
# script recomputes the digests), then the current one updates it.
my $at07 = reopen_with_release($current, 'release07', '0.7');
$at07->safe_psql('v06', q{ALTER EXTENSION idempotency UPDATE TO '0.7'});
is($at07->safe_psql('v06', $version_query), '0.7', 'the 0.7 library updates the database to 0.7');
check_old_release_keys($at07, 'v06', '0.6 keys updated to 0.7 by the 0.7 library');
$current = reopen_with_current_library($at07, 'current06to07');
check_old_release_keys_through_update($current, '0.6', 'updated through 0.7', [ 'v06', 'UTF8' ]);
isnt($current->safe_psql('v06', $version_query), '0.7',
	'the current library updates it on from 0.7');
$current->stop;

done_testing();
