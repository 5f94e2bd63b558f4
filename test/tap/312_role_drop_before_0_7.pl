# A role dropped while the extension was at 0.6 (DROP ROLE did not refuse
# then) left keys of no role. The update to 0.7, with the library of 0.7
# (the way the current library asks a database at 0.6 to take), deletes
# them; after the update to the current version a role that gets the
# dropped role's OID (pg_resetwal -o) sees none of them, and its calls with
# the old keys and request hashes run fn (no replay, no IK422). Builds the
# releases 0.6 and 0.7 from the repository's history (test/old-release.sh):
# it runs where that history is, on the host.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use FindBin;
use lib $FindBin::RealBin;
use IdempotencyTest;

sub call_sql
{
	my ($role, $key, $hash, $n) = @_;
	return "SET ROLE $role; SELECT idempotency.idempotent_call('$key', '$hash', "
	  . "'INSERT INTO runs VALUES (\$1) RETURNING n', $n), "
	  . "idempotency.last_call_replayed(); RESET ROLE;";
}

my $old = old_release_node('old_roles', '0.6', conf => "idempotency.expire_interval = 0\n");
$old->safe_psql('postgres', 'CREATE ROLE regress_d; CREATE DATABASE old');
$old->safe_psql('old', q{
CREATE EXTENSION idempotency;
CREATE TABLE runs (n int);
GRANT SELECT, INSERT ON runs TO PUBLIC;
});
is($old->safe_psql('old', call_sql('regress_d', 'same', 'h', 1)),
	'1|f', 'old (0.6): regress_d stores key \'same\'');
is($old->safe_psql('old', call_sql('regress_d', 'other-hash', 'h', 2)),
	'2|f', 'old (0.6): regress_d stores key \'other-hash\'');
my $oid_d = $old->safe_psql('postgres', q{SELECT 'regress_d'::regrole::oid});
$old->safe_psql('postgres', 'DROP ROLE regress_d');
my $keys_of_d = "SELECT count(*) FROM idempotency.keys WHERE scope::regrole::oid = $oid_d";
is($old->safe_psql('old', $keys_of_d), '2',
	'old (0.6): DROP ROLE does not refuse, the dropped role\'s keys are left');

my $at07 = reopen_with_release($old, 'old_roles_07', '0.7');
$at07->safe_psql('old', q{ALTER EXTENSION idempotency UPDATE TO '0.7'});
is($at07->safe_psql('old', $keys_of_d), '0',
	'old: the update to 0.7 deletes the keys of roles dropped before it');
my $current = reopen_with_current_library($at07, 'old_roles_current');
$current->safe_psql('old', 'ALTER EXTENSION idempotency UPDATE');
is($current->safe_psql('old', $keys_of_d), '0',
	'old: none is back after the update to the current version');

$current->safe_psql('postgres', 'VACUUM pg_catalog.pg_authid');
$current->stop;
command_ok([ 'pg_resetwal', '-o', $oid_d, $current->data_dir ],
	'old: pg_resetwal -o sets the next OID to the dropped role\'s');
$current->start;
$current->safe_psql('postgres', 'CREATE ROLE regress_e');
is($current->safe_psql('postgres', q{SELECT 'regress_e'::regrole::oid}),
	$oid_d, 'old: the new role regress_e has the dropped role\'s OID');
is($current->safe_psql('old', 'SET ROLE regress_e; SELECT count(*) FROM idempotency.keys'),
	'0', 'old: regress_e sees no key');
is($current->safe_psql('old', call_sql('regress_e', 'same', 'h', 11)),
	'11|f', 'old: regress_e\'s call with the same key and hash runs fn');
is($current->safe_psql('old', call_sql('regress_e', 'other-hash', 'x', 12)),
	'12|f', 'old: regress_e\'s call with another hash runs fn (no IK422)');
$current->stop;

done_testing();
