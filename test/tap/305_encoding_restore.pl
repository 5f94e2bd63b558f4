# A key's identity does not depend on the database encoding: keys stored
# with characters beyond ASCII in a LATIN1 database, dumped (custom and
# plain format) and restored into a UTF8 database, replay there, fn does
# not run again and each key keeps one row. A LATIN1 database whose keys
# were stored under 0.5 (digests over the LATIN1 bytes) keeps replaying
# them with the 0.6 library before and after ALTER EXTENSION UPDATE, which
# recomputes the digests, and then moves to UTF8 the same way.
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

my @keys = ('café-1', 'Zürich ÿ', 'naïve ½ «key»', 'plain-ascii');

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
			"$what: key '$key' replays");
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
is( $node->safe_psql(
		'latin', q{SET client_encoding = 'UTF8';
SELECT idempotency.key_digest('Zürich ÿ') = '\x'::bytea || substr(sha256(convert_to('Zürich ÿ', 'UTF8')), 1, 11)}
	),
	't',
	'key_digest is over the key\'s UTF-8 bytes in a LATIN1 database');
dump_and_restore('latin', 'current version');

# --- stored under 0.3, updated to 0.4, then to the current version ----------
command_ok(
	[
		'createdb', '-h', $node->host, '-p', $node->port, '-E', 'LATIN1',
		'-T', 'template0', '--locale=C', 'latin03'
	],
	'a LATIN1 database for 0.3');
$node->safe_psql('latin03', q{
CREATE EXTENSION idempotency VERSION '0.3';
CREATE TABLE runs (n int);
});
store_keys('latin03');
$node->safe_psql('latin03', q{ALTER EXTENSION idempotency UPDATE TO '0.4'});
is( $node->safe_psql(
		'latin03', q{SET client_encoding = 'UTF8';
SELECT idempotency.idempotent_call('café-1', 'h1', 'INSERT INTO runs VALUES ($1) RETURNING n', 1),
       idempotency.last_call_replayed()}),
	'1|t',
	'updated from 0.3 to 0.4 with this library, a key beyond ASCII replays');
$node->safe_psql('latin03', 'ALTER EXTENSION idempotency UPDATE');
check_replays('latin03', 'LATIN1 database updated from 0.3 through 0.4');

# --- stored under 0.5, then updated -----------------------------------------
command_ok(
	[
		'createdb', '-h', $node->host, '-p', $node->port, '-E', 'LATIN1',
		'-T', 'template0', '--locale=C', 'latin05'
	],
	'a LATIN1 database for 0.5');
$node->safe_psql('latin05', q{
CREATE EXTENSION idempotency VERSION '0.5';
CREATE TABLE runs (n int);
});
store_keys('latin05');
is( $node->safe_psql(
		'latin05', q{SET client_encoding = 'UTF8';
SELECT key_digest = '\x'::bytea || substr(sha256(convert_to(key, 'LATIN1')), 1, 11)
  FROM idempotency.keys WHERE key = 'café-1'}),
	't',
	'under 0.5, key_digest is over the LATIN1 bytes');
$node->safe_psql('latin05', q{
SET client_encoding = 'UTF8';
SELECT idempotency.idempotent_call('café-1', 'h1', 'INSERT INTO runs VALUES ($1) RETURNING n', 1);
SELECT idempotency.idempotent_call('Zürich ÿ', 'h2', 'INSERT INTO runs VALUES ($1) RETURNING n', 2);
});
is($node->safe_psql('latin05', 'SELECT count(*) FROM runs'),
	scalar(@keys), 'under 0.5 with this library, the keys replay');
$node->safe_psql('latin05', 'ALTER EXTENSION idempotency UPDATE');
check_replays('latin05', 'LATIN1 database updated from 0.5');
dump_and_restore('latin05', 'updated from 0.5');

$node->stop;

# --- written by the libraries of 0.6 and 0.3 --------------------------------
# Keys the old library itself wrote (its fingerprints and digests, in its
# layout) in a UTF8, a LATIN1 and a WIN1252 database, read by the current
# library on the same data directory, then after ALTER EXTENSION UPDATE.
for my $version ('0.6', '0.3')
{
	(my $v = $version) =~ s/\.//;
	my $old = old_release_node("old$v", $version,
		conf => "idempotency.expire_interval = 0\n");
	my @dbs = map { [ "v${v}_" . lc($_), $_ ] } ('UTF8', 'LATIN1', 'WIN1252');
	for my $db (@dbs)
	{
		store_old_release_keys($old, @$db);
		is( $old->safe_psql($db->[0],
				q{SELECT extversion FROM pg_extension WHERE extname = 'idempotency'}),
			$version, "$db->[1]: the keys are stored by the $version library");
		check_old_release_keys($old, $db->[0], "$version library, $db->[1]");
	}
	my $current = reopen_with_current_library($old, "current$v");
	check_old_release_keys_through_update($current, $version,
		'current library', @dbs);
	$current->stop;
}

done_testing();
