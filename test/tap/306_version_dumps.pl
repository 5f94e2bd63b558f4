# Dumps of the releases the current library serves, and of 0.6, restore
# into a database with the current library: pg_restore creates the current
# version (CREATE EXTENSION without VERSION) and copies the dumped version's
# columns into idempotency.keys, whose trigger keys_loaded recomputes every
# row's key_digest.
#
# - Keys the libraries of 0.6 and 0.7 stored by two roles (a fingerprint
#   computed by the extension, a client's hash, a client's hash that spells
#   a hex digest, a key beyond ASCII, a TTL of 7 days), a row inserted by
#   the superuser with a fingerprint of the form before 0.6 (the SHA-256 of
#   a client's text), and the key of a role dropped before the dump (at
#   0.6, which lets the role go; 0.7 deletes it with DROP OWNED), are
#   dumped in custom and plain format by the old release's cluster and
#   restored into a fresh database: every key replays for its role, fn
#   never runs again, the dropped role's key belongs to no role, and the
#   restored keys' roles cannot be dropped while the keys exist. The row of
#   the earlier fingerprint form is no longer matched: its retry answers
#   IK422 (docs/fingerprints.md).
# - Keys the libraries of 0.6 and 0.7 wrote themselves in a UTF8, a LATIN1
#   and a WIN1252 database restore into a database of the same encoding and
#   into a UTF8 one, and replay there.
# - A dump of 0.3 (request_hash as text) does not load: the trigger refuses
#   its rows (0A000, with a hint), and the key table stays empty.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use FindBin;
use lib $FindBin::RealBin;
use IdempotencyTest;
use IPC::Run;

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

for my $version ('0.6', '0.7')
{
	(my $name = "v$version") =~ s/\./_/;
	(my $v = $version) =~ s/\.//;
	my $old = old_release_node("old$v", $version,
		conf => "idempotency.expire_interval = 0\n");
	$old->safe_psql('postgres', "CREATE ROLE regress_gone_$name");
	$old->safe_psql('postgres', "CREATE DATABASE $name");
	$old->safe_psql(
		$name, qq{
SET client_encoding = 'UTF8';
CREATE EXTENSION idempotency;
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
		$old->safe_psql($name, $sql . call_sql(@{ $calls[$i] }));
	}
	# A client's hash as versions before 0.4 stored it (its text), as the
	# update to 0.4 turned it into a fingerprint: its SHA-256.
	$old->safe_psql(
		$name, q{
INSERT INTO idempotency.keys (scope, key, request_hash, response, created_at, expires_at, key_digest)
VALUES ('regress_app', 'raw-client', sha256('legacy text'), '"raw"', now(), now() + interval '1 day',
        idempotency.key_digest('raw-client'));
});
	is( $old->safe_psql(
			$name, q{SET ROLE regress_app;
SELECT idempotency.idempotent_call('raw-client', 'legacy text', 'INSERT INTO runs VALUES (9) RETURNING n'),
       idempotency.last_call_replayed()}),
		'"raw"|t',
		"$version: its library replays the client's hash stored as text");
	# From 0.7 on a role's keys hold it: DROP OWNED deletes them first.
	# 0.6 lets the role go and keeps its key, of no role.
	$old->safe_psql($name, "DROP OWNED BY regress_gone_$name") if $version ne '0.6';
	$old->safe_psql('postgres', "DROP ROLE regress_gone_$name");
	is( $old->safe_psql(
			$name,
			q{SELECT extversion FROM pg_extension WHERE extname = 'idempotency'}),
		$version,
		"$version: keys stored under $version");
	my $before = $old->safe_psql($name, "SET client_encoding = 'UTF8'; $keys_query");

	my $custom = $node->basedir . "/$name.dump";
	my $plain = $node->basedir . "/$name.sql";
	command_ok(
		[ $old->installed_command('pg_dump'), '-Fc', '-d', $old->connstr($name), '-f', $custom ],
		"$version: pg_dump -Fc");
	command_ok(
		[ $old->installed_command('pg_dump'), '-Fp', '-d', $old->connstr($name), '-f', $plain ],
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
			$version eq '0.6' ? '1' : '0',
			$version eq '0.6'
			? "$what: the dropped role's key belongs to no role"
			: "$what: the dropped role's key was deleted with DROP OWNED");
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
		# The current library matches fingerprints of the current form only.
		is( sqlstate_in(
			$node,
				$target, q{SET ROLE regress_app;
SELECT idempotency.idempotent_call('raw-client', 'legacy text', 'INSERT INTO runs VALUES (9) RETURNING n')}),
			'IK422',
			"$what: a client's hash stored as text, of the form before 0.6, is no longer matched (IK422)");
		is($node->safe_psql($target, 'SELECT count(*) FROM runs'),
			scalar(@calls), "$what: fn ran again for no key");
		is( $node->safe_psql(
				$target, q{SELECT count(*) FILTER (WHERE key_digest = idempotency.key_digest(key)
				  AND octet_length(request_hash) = 32 AND status IS NULL), count(*)
				  FROM idempotency.keys}),
			join('|', (scalar(@calls) + ($version eq '0.6' ? 2 : 1)) x 2),
			"$what: every row in the current layout");
	}

	# Keys the library wrote itself, in three encodings, dumped by its
	# cluster and restored into the same encoding and into UTF8.
	for my $encoding ('UTF8', 'LATIN1', 'WIN1252')
	{
		my $db = "old${v}_" . lc($encoding);
		store_old_release_keys($old, $db, $encoding);
		my $dump = $node->basedir . "/$db.dump";
		command_ok(
			[ $old->installed_command('pg_dump'), '-Fc', '-d', $old->connstr($db), '-f', $dump ],
			"$version, $encoding: pg_dump -Fc");
		for my $target_encoding (sort { $a cmp $b } keys %{ { $encoding => 1, UTF8 => 1 } })
		{
			my $target = "${db}_to_" . lc($target_encoding);
			my $what = "$version keys in $encoding restored into $target_encoding";
			$node->safe_psql('postgres',
				"CREATE DATABASE $target ENCODING '$target_encoding' TEMPLATE template0 LOCALE 'C'");
			command_ok([ 'pg_restore', '-d', $node->connstr($target), $dump ],
				"$what: pg_restore succeeds");
			check_old_release_keys($node, $target, $what);
		}
	}
	$old->stop;
}

# A dump of 0.3: its rows hold request_hash as the hex text of the
# fingerprint, which the current library no longer reads. pg_restore loads
# the key table with one COPY, which the trigger's error ends as a whole:
# no row of it is loaded (the rest of the dump is restored).
my $old03 = old_release_node('old03', '0.3', conf => "idempotency.expire_interval = 0\n");
store_old_release_keys($old03, 'v0_3', 'UTF8');
is( $old03->safe_psql('v0_3', 'SELECT count(*) FROM idempotency.keys'),
	'4', '0.3: keys stored by the library of 0.3');
my $custom03 = $node->basedir . '/v0_3.dump';
my $plain03 = $node->basedir . '/v0_3.sql';
command_ok(
	[ $old03->installed_command('pg_dump'), '-Fc', '-d', $old03->connstr('v0_3'), '-f', $custom03 ],
	'0.3: pg_dump -Fc');
command_ok(
	[ $old03->installed_command('pg_dump'), '-Fp', '-d', $old03->connstr('v0_3'), '-f', $plain03 ],
	'0.3: pg_dump -Fp');
$old03->stop;

$node->safe_psql('postgres', 'CREATE DATABASE v0_3_custom');
my ($stdout, $stderr) = ('', '');
my $restored = IPC::Run::run([ 'pg_restore', '-d', $node->connstr('v0_3_custom'), $custom03 ],
	'>', \$stdout, '2>', \$stderr);
ok(!$restored, '0.3, custom dump: pg_restore fails');
like(
	$stderr,
	qr/COPY failed for table "keys": ERROR:  row of idempotency\.keys from a version before 0\.4 cannot be loaded\s+DETAIL:  Its request_hash is not a fingerprint of 32 bytes, or it has a status\.\s+HINT:  Restore the dump into a database with version 0\.7 of the extension, then dump that database again\./s,
	'0.3, custom dump: on the key table\'s data, with the trigger\'s message and hint');
like($stderr, qr/errors ignored on restore: 1$/m, '0.3, custom dump: the only error of the restore');
is($node->safe_psql('v0_3_custom', 'SELECT count(*) FROM idempotency.keys'),
	'0', '0.3, custom dump: the key table is empty, no row half loaded');
is($node->safe_psql('v0_3_custom', 'SELECT count(*) FROM runs'),
	'3', '0.3, custom dump: the other tables are restored');

$node->safe_psql('postgres', 'CREATE DATABASE v0_3_plain');
my ($rc, $out, $err) = $node->psql(
	'v0_3_plain', undef,
	on_error_stop => 0,
	extra_params => [ '-v', 'VERBOSITY=verbose', '-f', $plain03 ]);
like($err, qr/ERROR:  0A000: row of idempotency\.keys from a version before 0\.4 cannot be loaded/,
	'0.3, plain dump: the COPY of the keys fails with 0A000');
like($err, qr/HINT:  Restore the dump into a database with version 0\.7 of the extension/,
	'0.3, plain dump: ... with the hint');
is($node->safe_psql('v0_3_plain', 'SELECT count(*) FROM idempotency.keys'),
	'0', '0.3, plain dump: the key table is empty');

# A dump of 1.0 has no remember_for: its live keys are remembered for 7
# days past their TTL (docs/expiry.md#when-a-keys-windows-are-fixed),
# whatever the settings of the session that restores them, of a caller or
# of expiry.
my $old10 = old_release_node('old10', '1.0', conf => "idempotency.expire_interval = 0\n");
$old10->safe_psql('postgres', 'CREATE DATABASE v1_0');
$old10->safe_psql(
	'v1_0', q{
CREATE EXTENSION idempotency;
SET idempotency.remember = '1 hour';
SELECT idempotency.idempotent_call('from-1.0', NULL, 'SELECT 1');
});
my $dump10 = $node->basedir . '/v1_0.dump';
command_ok(
	[ $old10->installed_command('pg_dump'), '-Fc', '-d', $old10->connstr('v1_0'), '-f', $dump10 ],
	'1.0: pg_dump -Fc');
$old10->stop;
$node->safe_psql('postgres', 'CREATE DATABASE v1_0_restored');
{
	local $ENV{PGOPTIONS} = '-c idempotency.remember=0';
	command_ok([ 'pg_restore', '-d', $node->connstr('v1_0_restored'), $dump10 ],
		'1.0: pg_restore, by a session remembering nothing');
}
is( $node->safe_psql(
		'v1_0_restored', q{
UPDATE idempotency.keys SET created_at = now() - interval '2 days',
       expires_at = now() - interval '1 day' WHERE key = 'from-1.0';
SET idempotency.remember = 0;
SELECT remember_for IS NULL FROM idempotency.keys WHERE key = 'from-1.0';
SELECT state FROM idempotency.lookup('from-1.0');
SET idempotency.remember = '1s';
SELECT idempotency.expire();
SELECT expires_at - expired_at FROM idempotency.keys
 WHERE key_digest = idempotency.key_digest('from-1.0');
}),
	"t\ngone\n1\n7 days",
	'1.0: a restored key expired a day ago is remembered 7 days, by a caller and by expire()');

$node->stop;
done_testing();
