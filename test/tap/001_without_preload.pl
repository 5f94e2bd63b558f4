# idempotent_call needs no shared_preload_libraries: the library loads on
# first use, and the call works the same (the expiry worker is what needs
# preloading). Settings are checked the same way: a value PostgreSQL kept
# unchecked before the library was loaded (SET, ALTER ROLE ... SET) and that
# the setting refuses makes calls fail with the error SET gives for it,
# never a silent fallback to the default.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('without_preload');
$node->init;
$node->start;

is($node->safe_psql('postgres', 'SHOW shared_preload_libraries'),
	'', 'the library is not preloaded');

$node->safe_psql(
	'postgres', q{
CREATE EXTENSION idempotency;
CREATE TABLE runs (n int);
});

my $call = q{SELECT idempotency.idempotent_call('k1', NULL,
  'INSERT INTO runs VALUES ($1) RETURNING n', 7),
  idempotency.last_call_replayed()};
is($node->safe_psql('postgres', $call), '7|f', 'first call runs fn');
is($node->safe_psql('postgres', $call), '7|t', 'a retry in a new session replays');
is($node->safe_psql('postgres', 'SELECT count(*) FROM runs'),
	'1', 'fn ran once');

my ($rc, $out, $err) = $node->psql('postgres',
	q{SELECT idempotency.idempotent_call('k1', NULL, 'SELECT 1')});
like($err, qr/already used with a different request/,
	'IK422 without preloading');

is( $node->safe_psql(
		'postgres',
		q{SELECT count(*) FROM pg_stat_activity WHERE backend_type LIKE 'idempotency%'}
	),
	'0',
	'no background worker runs without preloading');

# --- settings set before the library is loaded --------------------------------

# Runs $sql in a new session (as $role, if given) with verbose errors;
# returns psql's stdout and stderr.
sub session
{
	my ($sql, $role) = @_;
	my ($rc, $out, $err) = $node->psql(
		'postgres',
		"\\set VERBOSITY verbose\n$sql",
		on_error_stop => 0,
		extra_params => [ defined $role ? ('-U', $role) : () ]);
	return ($out, $err);
}

my $stored = q{SELECT count(*) FROM idempotency.keys WHERE key LIKE 'pre-%'};

# Out of range before the library is loaded: PostgreSQL keeps the value
# unchecked (a placeholder), so SET succeeds; the first call, which loads
# the library, fails with the setting's own 22023, fn does not run, nothing
# is stored. Once loaded, the same SET is refused at once.
($out, $err) = session(q{
SET idempotency.ttl = '31 days';
SELECT idempotency.idempotent_call('pre-ttl', NULL, 'INSERT INTO runs VALUES (31) RETURNING n');
SET idempotency.ttl = '31 days';
});
like($err,
	qr/ERROR:  22023: invalid value for parameter "idempotency.ttl": "31 days"\nDETAIL:  idempotency.ttl must not exceed idempotency.max_ttl[^\n]*\nCONTEXT:  idempotency.ttl: a value PostgreSQL could only warn about/,
	'a ttl over max_ttl set before loading fails the first call with 22023, saying why SET did not refuse it');
like($err, qr/ERROR:  22023: invalid value for parameter "idempotency.ttl": "31 days".*ERROR:  22023: invalid value for parameter "idempotency.ttl": "31 days"/s,
	'... and once loaded, SET refuses it itself');
is($node->safe_psql('postgres', 'SELECT count(*) FROM runs WHERE n = 31'),
	'0', '... fn did not run');
is($node->safe_psql('postgres', $stored), '0', '... nothing stored');

# Every call fails until the setting is set again; then calls work.
($out, $err) = session(q{
SET idempotency.ttl = '31 days';
SELECT idempotency.idempotent_call('pre-ttl', NULL, 'SELECT 1');
SELECT idempotency.idempotent_call('pre-ttl', NULL, 'SELECT 1');
SET idempotency.ttl = '2 days';
SELECT idempotency.idempotent_call('pre-ttl', NULL, 'SELECT 1');
SELECT expires_at - created_at FROM idempotency.keys WHERE key = 'pre-ttl';
});
is(() = $err =~ /ERROR:  22023/g, 2, 'a refused ttl fails every call');
is($out, "1\n2 days", '... until the session sets a valid one');

# A valid value set before loading is the one calls use.
($out, $err) = session(q{
SET idempotency.ttl = '3 days';
SELECT idempotency.idempotent_call('pre-valid', NULL, 'SELECT 1');
SELECT expires_at - created_at FROM idempotency.keys WHERE key = 'pre-valid';
});
is($out, "1\n3 days", 'a valid ttl set before loading is used');

# The other call settings: out of range (wait_timeout), refused entries
# (store_errors), an invalid interval (ttl, max_ttl).
for my $case (
	[
		q{SET idempotency.wait_timeout = '-1'},
		qr/-1 ms is outside the valid range for parameter "idempotency.wait_timeout"/
	],
	[
		q{SET idempotency.store_errors = '55P03'},
		qr/invalid value for parameter "idempotency.store_errors": "55P03"/
	],
	[
		q{SET idempotency.ttl = '1 mon -1 day'},
		qr/invalid value for parameter "idempotency.ttl": "1 mon -1 day"/
	],
	[
		q{SET idempotency.max_ttl = 'forever'},
		qr/invalid value for parameter "idempotency.max_ttl": "forever"/
	])
{
	my ($set, $error) = @$case;
	($out, $err) = session("$set;\n"
		  . q{SELECT idempotency.idempotent_call('pre-other', NULL, 'SELECT 1');});
	like($err, qr/ERROR:  22023: $error/,
		"$set before loading fails the first call with 22023");
}
is($node->safe_psql('postgres', $stored), '2', 'none of them stored a key');

# A superuser-only setting set by another role before loading: the call
# fails with 42501, as SET would once the library is loaded.
$node->safe_psql('postgres', 'CREATE ROLE bob LOGIN; GRANT INSERT ON runs TO bob');
($out, $err) = session(q{
SET idempotency.max_ttl = '1 year';
SELECT idempotency.idempotent_call('pre-bob', NULL, 'SELECT 1');
}, 'bob');
like($err, qr/ERROR:  42501: permission denied to set parameter "idempotency.max_ttl"/,
	'max_ttl set by a non-superuser before loading fails the call with 42501');

# ALTER ROLE ... SET in a session without the library is not checked
# (PostgreSQL cannot); a session of that role then fails its calls with
# 22023 until it sets the value. In a session that has loaded the library,
# ALTER ROLE ... SET checks it at once.
$node->safe_psql('postgres', q{ALTER ROLE bob SET idempotency.ttl = '31 days'});
($out, $err) = session(q{
SELECT idempotency.idempotent_call('pre-bob', NULL, 'SELECT 1');
RESET idempotency.ttl;
SELECT idempotency.idempotent_call('pre-bob', NULL, 'SELECT 1');
}, 'bob');
like($err,
	qr/ERROR:  22023: invalid value for parameter "idempotency.ttl": "31 days"/,
	"a role's unchecked ttl fails its session's calls with 22023");
is($out, '1', '... until the session resets it');
($out, $err) = session(q{
SELECT idempotency.idempotent_call('pre-loader', NULL, 'SELECT 1');
ALTER ROLE bob SET idempotency.ttl = '32 days';
});
like($err,
	qr/ERROR:  22023: invalid value for parameter "idempotency.ttl": "32 days"/,
	'with the library loaded, ALTER ROLE ... SET refuses an out-of-range ttl');
$node->safe_psql('postgres', 'ALTER ROLE bob RESET ALL');

# A superuser's unchecked ALTER ROLE ... SET of a superuser-only setting:
# bob's calls fail with the value's own 22023, not with a 42501 for bob.
$node->safe_psql('postgres',
	q{ALTER ROLE bob SET idempotency.max_ttl = 'forever'});
($out, $err) = session(
	q{SELECT idempotency.idempotent_call('pre-bob', NULL, 'SELECT 1');},
	'bob');
like($err,
	qr/ERROR:  22023: invalid value for parameter "idempotency.max_ttl": "forever"/,
	"a superuser's unchecked max_ttl for a role fails its calls with 22023");
$node->safe_psql('postgres', 'ALTER ROLE bob RESET ALL');

$node->stop;
done_testing();
