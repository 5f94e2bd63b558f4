# Every released version's dump restores into a database with the current
# library: pg_restore creates the current version (CREATE EXTENSION without
# VERSION) and copies the dumped version's columns into idempotency.keys.
# Keys stored at 0.1, 0.2, 0.3, 0.4, 0.5 and 0.6 by two roles (a fingerprint
# computed by the extension, a client's hash, a client's hash that spells
# a hex digest, a key beyond ASCII, a TTL of 7 days), a row as versions
# before 0.4 stored a client's hash (its text, inserted by the superuser as
# the library of those versions wrote it), and the key of a role dropped
# before the dump (0.1 and 0.2 dump its scope as the OID), are dumped in custom and plain format and
# restored into a fresh database: every key replays for its role, fn never
# runs again, the dropped role's key belongs to no role, and the restored
# keys' roles cannot be dropped while the keys exist.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use FindBin;
use lib $FindBin::RealBin;
use IdempotencyTest;

my $node = preloaded_node('version_dumps',
	conf => "idempotency.expire_interval = 0\n");
$node->safe_psql('postgres', q{
CREATE ROLE regress_app;
CREATE ROLE regress_other;
});

my $hex_hash = 'ab' x 32;
# [role, key, request_hash SQL, fn argument]
my @calls = (
	[ 'regress_app', 'computed', 'NULL', 1 ],
	[ 'regress_app', 'client', q{'client-hash'}, 2 ],
	[ 'regress_app', 'client-hex', "'$hex_hash'", 3 ],
	[ 'regress_other', 'clé-ünïcode', 'NULL', 4 ],
	[ 'regress_other', 'computed', q{'other-client'}, 5 ],);

sub call_sql
{
	my ($role, $key, $hash, $n) = @_;
	return "SET ROLE $role; SELECT idempotency.idempotent_call('$key', $hash, "
	  . "'INSERT INTO runs VALUES (\$1) RETURNING n', $n), "
	  . "idempotency.last_call_replayed(); RESET ROLE;";
}

my $keys_query = q{SELECT key, scope::text, request_hash IS NOT NULL, response,
  expires_at - created_at FROM idempotency.keys WHERE key <> 'gone' ORDER BY key, scope::text};

for my $version ('0.1', '0.2', '0.3', '0.4', '0.5', '0.6')
{
	(my $name = "v$version") =~ s/\./_/;
	$node->safe_psql('postgres', "CREATE ROLE regress_gone_$name");
	$node->safe_psql('postgres', "CREATE DATABASE $name");
	$node->safe_psql(
		$name, qq{
SET client_encoding = 'UTF8';
CREATE EXTENSION idempotency VERSION '$version';
CREATE TABLE runs (n int);
GRANT SELECT, INSERT ON runs TO PUBLIC;
SET ROLE regress_gone_$name;
SELECT idempotency.idempotent_call('gone', NULL, 'SELECT 1');
RESET ROLE;
});
	for my $i (0 .. $#calls)
	{
		my $sql = "SET client_encoding = 'UTF8';";
		$sql .= "SET idempotency.ttl = '7 days';" if $i == 1;
		$node->safe_psql($name, $sql . call_sql(@{ $calls[$i] }));
	}
	my $raw_hash =
	  $version lt '0.4'
	  ? q{'legacy text'}
	  : q{sha256('legacy text'), idempotency.key_digest('raw-client')};
	my $digest_column = $version lt '0.4' ? '' : ', key_digest';
	$node->safe_psql(
		$name, qq{
INSERT INTO idempotency.keys (scope, key, request_hash, response, created_at, expires_at$digest_column)
SELECT 'regress_app', 'raw-client', r.request_hash, '"raw"', now(), now() + interval '1 day'$digest_column
  FROM (SELECT $raw_hash) AS r (request_hash$digest_column);
});
	$node->safe_psql('postgres', "DROP ROLE regress_gone_$name");
	is( $node->safe_psql(
			$name,
			q{SELECT extversion FROM pg_extension WHERE extname = 'idempotency'}),
		$version,
		"$version: keys stored under $version");
	my $before = $node->safe_psql($name, "SET client_encoding = 'UTF8'; $keys_query");

	my $custom = $node->basedir . "/$name.dump";
	my $plain = $node->basedir . "/$name.sql";
	command_ok([ 'pg_dump', '-Fc', '-d', $node->connstr($name), '-f', $custom ],
		"$version: pg_dump -Fc");
	command_ok([ 'pg_dump', '-Fp', '-d', $node->connstr($name), '-f', $plain ],
		"$version: pg_dump -Fp");

	for my $format ('custom', 'plain')
	{
		my $target = "${name}_$format";
		my $what = "$version, $format dump";
		$node->safe_psql('postgres', "CREATE DATABASE $target");
		if ($format eq 'custom')
		{
			command_ok([ 'pg_restore', '-d', $node->connstr($target), $custom ],
				"$what: pg_restore succeeds");
		}
		else
		{
			command_ok(
				[
					'psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1',
					'-d', $node->connstr($target), '-f', $plain
				],
				"$what: psql restores it");
		}
		is( $node->safe_psql(
				$target,
				q{SELECT extversion = default_version FROM pg_extension, pg_available_extensions
				   WHERE extname = 'idempotency' AND name = extname}),
			't',
			"$what: restored as the current version");
		is($node->safe_psql($target, "SET client_encoding = 'UTF8'; $keys_query"),
			$before, "$what: every key restored with its role, response and TTL");
		is( $node->safe_psql(
				$target, q{SELECT count(*) FROM idempotency.keys
				  WHERE key = 'gone' AND scope::text = '-'}),
			'1',
			"$what: the dropped role's key belongs to no role");
		is(sqlstate_of($node, 'DROP ROLE regress_other'),
			'2BP01', "$what: the restored keys hold their role (DROP ROLE refuses it)");
		for my $call (@calls)
		{
			my ($role, $key, $hash, $n) = @$call;
			is( $node->safe_psql(
					$target, "SET client_encoding = 'UTF8';" . call_sql(@$call)),
				"$n|t",
				"$what: $role\'s key '$key' replays");
		}
		is( $node->safe_psql(
				$target, q{SET ROLE regress_app;
SELECT idempotency.idempotent_call('raw-client', 'legacy text', 'INSERT INTO runs VALUES (9) RETURNING n'),
       idempotency.last_call_replayed()}),
			'"raw"|t',
			"$what: a client's hash stored as text replays");
		is($node->safe_psql($target, 'SELECT count(*) FROM runs'),
			scalar(@calls), "$what: fn ran again for no key");
		is( $node->safe_psql(
				$target, q{SELECT count(*) FILTER (WHERE key_digest = idempotency.key_digest(key)
				  AND octet_length(request_hash) = 32 AND status IS NULL), count(*)
				  FROM idempotency.keys}),
			(scalar(@calls) + 2) . '|' . (scalar(@calls) + 2),
			"$what: every row in the current layout");
	}
}

# Keys the libraries of 0.6 and 0.3 wrote themselves in a UTF8, a LATIN1
# and a WIN1252 database, dumped (custom format) and restored by the
# current library into a database of the same encoding and into a UTF8 one.
# The keys 0.3 stored in LATIN1 and WIN1252 replay only in a database of
# that encoding: their fingerprints hashed the text beyond ASCII in it.
for my $version ('0.6', '0.3')
{
	(my $v = $version) =~ s/\.//;
	my $old = old_release_node("old$v", $version,
		conf => "idempotency.expire_interval = 0\n");
	for my $encoding ('UTF8', 'LATIN1', 'WIN1252')
	{
		my $db = "old${v}_" . lc($encoding);
		store_old_release_keys($old, $db, $encoding);
		my $dump = $node->basedir . "/$db.dump";
		command_ok([ 'pg_dump', '-Fc', '-d', $old->connstr($db), '-f', $dump ],
			"$version, $encoding: pg_dump -Fc");
		for my $target_encoding (sort { $a cmp $b } keys %{ { $encoding => 1, UTF8 => 1 } })
		{
			my $target = "${db}_to_" . lc($target_encoding);
			my $what = "$version keys in $encoding restored into $target_encoding";
			$node->safe_psql('postgres',
				"CREATE DATABASE $target ENCODING '$target_encoding' TEMPLATE template0 LOCALE 'C'");
			command_ok([ 'pg_restore', '-d', $node->connstr($target), $dump ],
				"$what: pg_restore succeeds");
			check_old_release_keys($node, $target, $what,
				earlier_form_lost => $version eq '0.3' && $target_encoding ne $encoding);
		}
	}
	$old->stop;
}

$node->stop;
done_testing();
