# GRANT and REVOKE on a key table never free a role that has keys.
#
# A role's mark is a pg_shdepend row of the kind PostgreSQL records for
# privileges on the column scope of idempotency.keys, and PostgreSQL
# deletes such rows of every role that leaves the column's privileges. So
# each GRANT or REVOKE that can change them - on the column, on the table
# (a REVOKE on the table revokes on its columns too), on all tables of the
# schema, and a REVOKE ... CASCADE that takes the grants of roles it does
# not name - must leave every role that has keys marked: DROP ROLE still
# fails with 2BP01, its keys stay; DROP OWNED BY then lets it go as before.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use FindBin;
use lib $FindBin::RealBin;
use IdempotencyTest;

my $node = preloaded_node('role_mark_grants',
	conf => "idempotency.expire_interval = 0\n");
$node->safe_psql('postgres', 'CREATE EXTENSION idempotency');

# The SQLSTATE of a statement, or 'no error'; and its whole output.
sub error_of
{
	my ($sql) = @_;
	my ($rc, $stdout, $stderr) = $node->psql(
		'postgres', $sql,
		on_error_stop => 0,
		extra_params => [ '-v', 'VERBOSITY=verbose' ]);
	return $stderr =~ /ERROR:\s+([0-9A-Z]{5}):/
	  ? ($1, $stderr)
	  : ('no error', $stderr);
}

sub keys_of
{
	my ($role) = @_;
	return $node->safe_psql('postgres',
		"SELECT count(*) FROM idempotency.keys WHERE scope::text = '$role'");
}

sub marks_of
{
	my ($role) = @_;
	return $node->safe_psql(
		'postgres', qq{
SELECT count(*) FROM pg_shdepend
 WHERE refclassid = 'pg_authid'::regclass AND refobjid = '$role'::regrole
   AND classid = 'pg_class'::regclass AND objid = 'idempotency.keys'::regclass
   AND deptype = 'a'});
}

# A role that stores one key.
sub role_with_key
{
	my ($role) = @_;
	$node->safe_psql(
		'postgres', qq{
CREATE ROLE $role;
SET ROLE $role;
SELECT idempotency.idempotent_call('k', NULL, 'SELECT 1');
RESET ROLE;
});
	is(marks_of($role), '1', "$role has keys and its mark");
}

# After `sql`, each role of `roles` still cannot be dropped and keeps its key.
sub still_held
{
	my ($what, $sql, @roles) = @_;
	$node->safe_psql('postgres', $sql);
	for my $role (@roles)
	{
		my ($state, $stderr) = error_of("DROP ROLE $role");
		is($state, '2BP01', "$what: DROP ROLE $role still fails with 2BP01");
		like(
			$stderr,
			qr/privileges for column scope of table idempotency\.keys/,
			"$what: ... naming the key table");
		is(keys_of($role), '1', "$what: ... and $role keeps its key");
	}
}

role_with_key('regress_column');
still_held(
	'column GRANT then REVOKE', q{
GRANT SELECT (scope) ON idempotency.keys TO regress_column;
REVOKE SELECT (scope) ON idempotency.keys FROM regress_column;
}, 'regress_column');

role_with_key('regress_table');
still_held(
	'table GRANT then REVOKE', q{
GRANT SELECT, UPDATE ON idempotency.keys TO regress_table;
REVOKE SELECT, UPDATE ON idempotency.keys FROM regress_table;
}, 'regress_table');

role_with_key('regress_column_table');
still_held(
	'column GRANT then table REVOKE', q{
GRANT SELECT (scope), UPDATE (scope) ON idempotency.keys TO regress_column_table;
REVOKE ALL ON idempotency.keys FROM regress_column_table;
}, 'regress_column_table');

role_with_key('regress_schema');
still_held(
	'GRANT then REVOKE on all tables of the schema', q{
GRANT SELECT (scope) ON idempotency.keys TO regress_schema;
GRANT SELECT ON ALL TABLES IN SCHEMA idempotency TO regress_schema;
REVOKE ALL ON ALL TABLES IN SCHEMA idempotency FROM regress_schema;
}, 'regress_schema');

# Two roles that have keys, named in one statement, in a transaction that
# drops nothing else: each stays marked.
role_with_key('regress_pair_a');
role_with_key('regress_pair_b');
still_held(
	'one REVOKE naming two roles, in a transaction block', q{
BEGIN;
GRANT SELECT (scope) ON idempotency.keys TO regress_pair_a, regress_pair_b;
REVOKE SELECT (scope) ON idempotency.keys FROM regress_pair_a, regress_pair_b;
COMMIT;
}, 'regress_pair_a', 'regress_pair_b');

# REVOKE GRANT OPTION ... CASCADE takes the grant that regress_grantor
# made to regress_cascade, a role the statement does not name.
$node->safe_psql('postgres', 'CREATE ROLE regress_grantor');
role_with_key('regress_cascade');
still_held(
	'REVOKE GRANT OPTION ... CASCADE', q{
GRANT SELECT (scope) ON idempotency.keys TO regress_grantor WITH GRANT OPTION;
SET ROLE regress_grantor;
GRANT SELECT (scope) ON idempotency.keys TO regress_cascade;
RESET ROLE;
REVOKE GRANT OPTION FOR SELECT (scope) ON idempotency.keys
  FROM regress_grantor CASCADE;
}, 'regress_cascade');
is( $node->safe_psql(
		'postgres',
		q{SELECT count(*) FROM pg_attribute
 WHERE attrelid = 'idempotency.keys'::regclass AND attname = 'scope'
   AND pg_catalog.array_to_string(attacl, ',') LIKE '%regress_cascade%'}),
	'0',
	'... and its own grant on scope is gone');

# A session of the role that remembers its mark stores another key after
# a REVOKE: the mark is there.
role_with_key('regress_session');
my $session = $node->background_psql('postgres');
$session->query_safe('SET ROLE regress_session');
$session->query_safe(
	q{SELECT idempotency.idempotent_call('k2', NULL, 'SELECT 2')});
still_held(
	'a REVOKE while a session of the role runs', q{
GRANT SELECT (scope) ON idempotency.keys TO regress_session;
REVOKE SELECT (scope) ON idempotency.keys FROM regress_session;
DELETE FROM idempotency.keys WHERE key = 'k2';
}, 'regress_session');
$session->query_safe(
	q{SELECT idempotency.idempotent_call('k3', NULL, 'SELECT 3')});
$session->quit;
is(marks_of('regress_session'), '1', '... which then has one mark');

# A transaction records a role's first mark, a GRANT and REVOKE to another
# role make the session look its marks up again (finding the uncommitted
# one), and the transaction rolls back: the session's next key records the
# mark again.
$node->safe_psql('postgres', 'CREATE ROLE regress_rollback');
my $rollback = $node->background_psql('postgres');
$rollback->query_safe(
	q{BEGIN; SET LOCAL ROLE regress_rollback;
SELECT idempotency.idempotent_call('r1', NULL, 'SELECT 1');
RESET ROLE;
GRANT SELECT (scope) ON idempotency.keys TO regress_grantor;
REVOKE SELECT (scope) ON idempotency.keys FROM regress_grantor;
SET LOCAL ROLE regress_rollback;
SELECT idempotency.idempotent_call('r2', NULL, 'SELECT 2');
ROLLBACK});
is(marks_of('regress_rollback'), '0', 'a rolled back first key leaves no mark');
$rollback->query_safe(
	q{SET ROLE regress_rollback;
SELECT idempotency.idempotent_call('r3', NULL, 'SELECT 3'); RESET ROLE});
$rollback->quit;
is(marks_of('regress_rollback'), '1',
	'... and the session\'s next key records it');
is((error_of('DROP ROLE regress_rollback'))[0],
	'2BP01', '... so DROP ROLE regress_rollback fails');

# A role with a key and a grant of its own on scope: DROP OWNED BY takes
# both, and DROP ROLE succeeds.
role_with_key('regress_granted');
$node->safe_psql('postgres',
	'GRANT SELECT (scope) ON idempotency.keys TO regress_granted');
is((error_of('DROP ROLE regress_granted'))[0],
	'2BP01', 'a role with a key and a grant on scope cannot be dropped');
is( (error_of(
			'DROP OWNED BY regress_granted; DROP ROLE regress_granted'))[0],
	'no error',
	'... until DROP OWNED BY, which takes its keys and its grant');

# GRANT and REVOKE on other tables work as before.
$node->safe_psql(
	'postgres', q{
CREATE TABLE other (scope int);
GRANT SELECT (scope) ON other TO regress_column;
REVOKE SELECT (scope) ON other FROM regress_column;
GRANT SELECT ON ALL TABLES IN SCHEMA public TO regress_column;
REVOKE SELECT ON ALL TABLES IN SCHEMA public FROM regress_column;
});
is((error_of('DROP ROLE regress_column'))[0],
	'2BP01', 'GRANT and REVOKE on another table leave the mark');

# Every role the test made leaves through DROP OWNED BY.
for my $role (
	qw(regress_column regress_table regress_column_table regress_schema
	regress_pair_a regress_pair_b regress_cascade regress_session
	regress_rollback regress_grantor))
{
	is( (error_of("DROP OWNED BY $role; DROP ROLE $role"))[0],
		'no error', "DROP OWNED BY $role, then DROP ROLE $role");
}
is($node->safe_psql('postgres', 'SELECT count(*) FROM idempotency.keys'),
	'0', 'no key is left');

$node->stop;
done_testing();
