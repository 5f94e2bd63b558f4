# One role can neither block nor observe another role's keys:
#
# - claim locks carry the role in their tag and a keyed MAC of the key, so
#   no key of alice's takes bob's lock, and pg_locks cannot be matched to a
#   guessed key (as it could when the tag was hashtextextended(key, role));
# - the secret behind the MAC is the same in every backend, with or without
#   the library preloaded, so two callers of one key still meet;
# - EXPLAIN's row estimates are the same whatever other roles store, so a
#   binary search over key ranges or a count of a role's keys learns
#   nothing; ANALYZE gathers no statistics on the key table;
# - what EXPLAIN ANALYZE shows a scan read is the same whatever other roles
#   store in the range it asks for: no plan of a caller's reads the
#   expires_at index, and primary-key scans stay within the caller's role.
#   (Rows; page counts, BUFFERS, are not promised: docs/security.md.)
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use FindBin;
use lib $FindBin::RealBin;
use IdempotencyTest;

my $node = preloaded_node('role_isolation');

my $setup = q{
CREATE EXTENSION idempotency;
CREATE ROLE alice LOGIN;
CREATE ROLE bob LOGIN;
CREATE ROLE carol LOGIN;
-- Blocks while the test holds advisory lock 4242.
CREATE FUNCTION gate() RETURNS text LANGUAGE sql
  AS $$ SELECT pg_advisory_xact_lock_shared(4242)::text || current_user $$;
};
$node->safe_psql('postgres', $setup);

sub as_role
{
	my ($target, $role, $sql) = @_;
	my ($rc, $stdout, $stderr) = $target->psql(
		'postgres', $sql,
		on_error_stop => 0,
		extra_params => [ '-U', $role, '-v', 'VERBOSITY=verbose' ]);
	return $stderr =~ /ERROR:\s+([0-9A-Z]{5}):/ ? "error $1" : $stdout;
}

sub call_sql
{
	my ($key, $fn) = @_;
	return call_sql_of_key_expression("'$key'", $fn);
}

sub call_sql_of_key_expression
{
	my ($key_sql, $fn) = @_;
	return "SELECT idempotency.idempotent_call($key_sql, NULL, '$fn')";
}

# Starts a session of `role` on `target` that calls `key` (or the key the
# SQL expression `key_sql` gives) with fn gate(), and waits until it sits
# inside fn, holding its claim.
sub hold_claim
{
	my ($target, $role, $key, $key_sql) = @_;
	$key_sql //= "'$key'";
	my $session =
	  $target->background_psql('postgres', extra_params => [ '-U', $role ]);
	my $pid = $session->query_safe('SELECT pg_backend_pid()');
	$session->query_until(qr/sent/,
		"\\echo sent\n"
		  . call_sql_of_key_expression($key_sql, 'SELECT gate()') . ";\n");
	$target->poll_query_until('postgres',
		"SELECT count(*) = 1 FROM pg_locks WHERE pid = $pid AND locktype = 'advisory' AND NOT granted"
	) or die "$role never reached fn";
	return ($session, $pid);
}

# --- claim locks ------------------------------------------------------------

my $gate = $node->background_psql('postgres');
$gate->query_safe('SELECT pg_advisory_lock(4242)');
my ($alice, $alice_pid) = hold_claim($node, 'alice', 'order-paid:2001');
my ($bob, $bob_pid) = hold_claim($node, 'bob', 'order-paid:2001');

# What every role sees in pg_locks: carol looks. The only locks alice and
# bob hold are their claims (the gate's lock they wait for is not granted).
my $claims = qq{SELECT l.pid, l.classid, l.objid, l.objsubid FROM pg_locks AS l
 WHERE l.locktype = 'advisory' AND l.granted AND l.pid IN ($alice_pid, $bob_pid)};
is( as_role(
		$node, 'carol',
		"SELECT string_agg(r.rolname, ',' ORDER BY r.rolname) FROM ($claims) AS c "
		  . 'JOIN pg_roles AS r ON r.oid = c.classid '
		  . 'WHERE c.objsubid < 0 '
		  . 'AND c.classid = (SELECT usesysid FROM pg_stat_activity WHERE pid = c.pid)'),
	'alice,bob',
	'each claim lock carries its own role in the tag (classid), marked as a claim by a negative objsubid: '
	  . 'no key of one role can take another role\'s lock');
is(as_role($node, 'carol', "SELECT count(DISTINCT (c.objid, c.objsubid)) FROM ($claims) AS c"),
	'2', 'the same key text held by two roles shows unrelated tags');

# The old tag was hashtextextended(key, role oid), split into classid and
# objid: carol could confirm a guessed key by computing it. Now no guess
# matches either half, the right one included.
my $guesses =
  q{SELECT 'order-paid:' || g AS guess FROM generate_series(1990, 2010) AS g};
is( as_role(
		$node, 'carol', qq{
SELECT count(*) FROM ($claims) AS c, ($guesses) AS g, pg_stat_activity AS a
 WHERE a.pid = c.pid
   AND (((hashtextextended(g.guess, a.usesysid::int8) >> 32) & 4294967295)::oid = c.classid
     OR (hashtextextended(g.guess, a.usesysid::int8) & 4294967295)::oid = c.objid)}
	),
	'0',
	'no guessed key, the right one included, matches a claim lock by the old derivation');

# Two backends of one role still meet on the same key.
is( as_role($node, 'alice', call_sql('order-paid:2001', 'SELECT 1')),
	'error IK409', 'a second backend of alice meets her claim (IK409)');
is( as_role($node, 'bob', call_sql('order-paid:2002', 'SELECT current_user::text')),
	'"bob"', 'a different key of bob\'s runs while both claims are held');

$gate->query_safe('SELECT pg_advisory_unlock(4242)');
like(($alice->query('SELECT 1'))[0], qr/alice/, 'alice\'s call completes');
like(($bob->query('SELECT 1'))[0], qr/bob/, 'bob\'s call completes');
$_->quit for $alice, $bob;

# --- a collision built against the old tag ----------------------------------

# The old tag was hash_bytes_extended(key, seed = role oid), Bob Jenkins'
# lookup3, whose mix and final steps are bijections anyone can run
# backwards. So alice can build a 24-byte key whose old tag is exactly the
# old tag of bob's key: pick its first 12 bytes, run final and mix
# backwards from bob's hash, and read the last 12 bytes off the difference.

my $mask = 0xFFFFFFFF;
sub rot { my ($x, $k) = @_; return (($x << $k) | ($x >> (32 - $k))) & $mask }
sub add32 { return ($_[0] + $_[1]) & $mask }
sub sub32 { return ($_[0] - $_[1]) & $mask }

sub mix
{
	my ($x, $y, $z) = @_;
	$x = sub32($x, $z); $x ^= rot($z, 4);  $z = add32($z, $y);
	$y = sub32($y, $x); $y ^= rot($x, 6);  $x = add32($x, $z);
	$z = sub32($z, $y); $z ^= rot($y, 8);  $y = add32($y, $x);
	$x = sub32($x, $z); $x ^= rot($z, 16); $z = add32($z, $y);
	$y = sub32($y, $x); $y ^= rot($x, 19); $x = add32($x, $z);
	$z = sub32($z, $y); $z ^= rot($y, 4);  $y = add32($y, $x);
	return ($x, $y, $z);
}

sub unmix
{
	my ($x, $y, $z) = @_;
	$y = sub32($y, $x); $z ^= rot($y, 4);  $z = add32($z, $y);
	$x = sub32($x, $z); $y ^= rot($x, 19); $y = add32($y, $x);
	$z = sub32($z, $y); $x ^= rot($z, 16); $x = add32($x, $z);
	$y = sub32($y, $x); $z ^= rot($y, 8);  $z = add32($z, $y);
	$x = sub32($x, $z); $y ^= rot($x, 6);  $y = add32($y, $x);
	$z = sub32($z, $y); $x ^= rot($z, 4);  $x = add32($x, $z);
	return ($x, $y, $z);
}

sub unfinal
{
	my ($x, $y, $z) = @_;
	$z = add32($z, rot($y, 24)); $z ^= $y;
	$y = add32($y, rot($x, 14)); $y ^= $x;
	$x = add32($x, rot($z, 4));  $x ^= $z;
	$z = add32($z, rot($y, 16)); $z ^= $y;
	$y = add32($y, rot($x, 25)); $y ^= $x;
	$x = add32($x, rot($z, 11)); $x ^= $z;
	$z = add32($z, rot($y, 14)); $z ^= $y;
	return ($x, $y, $z);
}

# A 24-byte key, all bytes 0x01-0x7f (valid text), whose old tag under
# alice's oid equals `target` (bob's hash, as its high and low halves).
sub colliding_key
{
	my ($alice_oid, $target_high, $target_low) = @_;
	my $first = 'alice-order:';
	my $init = ($mask & (0x9e3779b9 + 24 + 3923095));
	my @state = mix($init, add32($init, $alice_oid), $init);
	my @words = unpack('V3', $first);
	@state = mix(map { add32($state[$_], $words[$_]) } 0 .. 2);
	for my $free (1 .. 10_000_000)
	{
		my @before = unmix(unfinal($free, $target_high, $target_low));
		my $last = pack('V3', map { sub32($before[$_], $state[$_]) } 0 .. 2);
		return unpack('H*', $first . $last) if $last =~ /^[\x01-\x7f]{12}$/;
	}
	die 'no key found';
}

my $alice_oid = $node->safe_psql('postgres', "SELECT 'alice'::regrole::oid");
my $bob_oid = $node->safe_psql('postgres', "SELECT 'bob'::regrole::oid");
my ($bob_high, $bob_low) = split /\|/,
  $node->safe_psql('postgres',
	"SELECT (h >> 32) & 4294967295, h & 4294967295 FROM hashtextextended('order-paid:2003', $bob_oid) AS h"
  );
my $forged =
  "convert_from(decode('" . colliding_key($alice_oid, $bob_high, $bob_low) . "', 'hex'), 'UTF8')";
is( $node->safe_psql('postgres',
		"SELECT hashtextextended($forged, $alice_oid) = hashtextextended('order-paid:2003', $bob_oid)"
	),
	't',
	'alice built a key whose old tag is the old tag of bob\'s order-paid:2003');

$gate->query_safe('SELECT pg_advisory_lock(4242)');
my ($forger) = hold_claim($node, 'alice', undef, $forged);
is( as_role(
		$node, 'bob',
		"SET idempotency.wait_timeout = '1s'; "
		  . call_sql('order-paid:2003', 'SELECT current_user::text')),
	'"bob"',
	'while alice holds that key, bob\'s order-paid:2003 runs: no IK409, no wait');
$gate->query_safe('SELECT pg_advisory_unlock(4242)');
$forger->query('SELECT 1');
$forger->quit;

# --- the secret without preloading -----------------------------------------

my $plain = PostgreSQL::Test::Cluster->new('role_isolation_plain');
$plain->init;
$plain->start;
$plain->safe_psql('postgres', $setup);
my $plain_gate = $plain->background_psql('postgres');
$plain_gate->query_safe('SELECT pg_advisory_lock(4242)');
my $secret_file = $plain->data_dir . '/idempotency_claim_secret';
ok(!-e $secret_file, 'no claim secret before the first claim');
my ($first, $first_pid) = hold_claim($plain, 'alice', 'unloaded-key');
ok(-s $secret_file == 32, 'the first claim made a 32-byte secret in the data directory');
is(sprintf('%o', (stat $secret_file)[2] & 0777),
	'600', '... readable by the server\'s user only');
is(as_role($plain, 'alice', call_sql('unloaded-key', 'SELECT 1')),
	'error IK409',
	'without preloading, another backend reads the same secret and meets the claim');
is(as_role($plain, 'alice', 'SELECT pg_read_binary_file(\'idempotency_claim_secret\')'),
	'error 42501', 'SQL cannot read the secret without superuser rights');
$plain_gate->query_safe('SELECT pg_advisory_unlock(4242)');
$first->query('SELECT 1');
$_->quit for $first, $plain_gate;
$plain->stop;

# --- planner estimates ------------------------------------------------------

# Stores bob's and carol's keys directly (as the superuser may): `bob` keys
# for bob and `carol` keys for carol, all of one width, with text that sorts
# low ('aa-') or high ('zz-'). Then gathers statistics.
sub store_world
{
	my (%world) = @_;
	my $rows = join(
		' UNION ALL ',
		map {
			my $role = $_;
			"SELECT '$role'::regrole, k, sha256(k::bytea), '{\"ok\": true}'::jsonb, "
			  . "now(), now() + interval '1 day', idempotency.key_digest(k) "
			  . "FROM generate_series(1, $world{$role}{keys}) AS g, "
			  . "LATERAL (SELECT '$world{$role}{prefix}-' || lpad(g::text, 4, '0') AS k) AS l"
		} sort keys %world);
	$node->safe_psql('postgres',
		"TRUNCATE idempotency.keys; INSERT INTO idempotency.keys $rows; "
		  . 'VACUUM ANALYZE idempotency.keys');
}

# What alice's EXPLAINs say: the row estimate of each probe. The first
# probes are steps of a binary search over key text; the last ones ask how
# many keys bob and carol hold.
my @probes = (
	"key < 'm'", "key >= 'm'", "key < 'b'", "key > 'y'",
	"key = 'zz-0001'", "request_hash > 'a'", "created_at < now()",
	"expires_at > now()", "scope OPERATOR(idempotency.=) 'bob'", "scope OPERATOR(idempotency.=) 'carol'");

sub estimates
{
	return join(
		"\n",
		map {
			my $plan = as_role($node, 'alice',
				"EXPLAIN SELECT * FROM idempotency.keys WHERE $_");
			my @rows = $plan =~ /rows=(\d+)/g;
			"$_: @rows";
		} @probes);
}

store_world(
	bob => { prefix => 'zz', keys => 600 },
	carol => { prefix => 'aa', keys => 10 });
my $bob_many_high = estimates();
store_world(
	bob => { prefix => 'aa', keys => 10 },
	carol => { prefix => 'zz', keys => 600 });
my $bob_few_low = estimates();
is($bob_few_low, $bob_many_high,
	'alice\'s row estimates are the same whether bob holds 600 high keys or 10 low ones');
# Equal because every EXPLAIN failed would prove nothing: each gave an
# estimate.
is_deeply(
	[ grep { !/: \d+/ } split /\n/, $bob_many_high . "\n" . $bob_few_low ],
	[], 'every one of alice\'s EXPLAINs gave a row estimate');
is( $node->safe_psql('postgres',
		"SELECT count(*) FROM pg_statistic WHERE starelid = 'idempotency.keys'::regclass"
	),
	'0',
	'ANALYZE gathers no statistics on idempotency.keys');
is( $node->safe_psql('postgres',
		"SELECT keys FROM idempotency.stats WHERE datname = 'postgres'"),
	'610', 'idempotency.stats still counts the keys');

# --- what scans read: EXPLAIN ANALYZE --------------------------------------

# alice holds 3 keys ('n-1'..'n-3', expiring in an hour); bob holds 500,
# either all inside the ranges alice probes (text 'mm-...' > 'm', expiring in
# 30 minutes: before hers) or all outside them (text 'aa-...', expiring in 3
# days). Rows of one width in one order, so the table is the same size and
# alice's rows sit in the same places in both.
sub store_bob_keys
{
	my ($prefix, $expires_in) = @_;
	$node->safe_psql('postgres', qq{
TRUNCATE idempotency.keys;
INSERT INTO idempotency.keys
  SELECT 'alice'::regrole, 'n-' || g, sha256('h'::bytea), NULL, now(), now() + interval '1 hour',
         idempotency.key_digest('n-' || g)
    FROM generate_series(1, 3) AS g;
INSERT INTO idempotency.keys
  SELECT 'bob'::regrole, '$prefix-' || lpad(g::text, 4, '0'), sha256('h'::bytea), NULL, now(),
         now() + interval '$expires_in', idempotency.key_digest('$prefix-' || lpad(g::text, 4, '0'))
    FROM generate_series(1, 500) AS g;
});
	$node->safe_psql('postgres', 'VACUUM ANALYZE idempotency.keys');
}

# Plans that would read other roles' keys in a range: the expires_at index
# for a range, an order or min(), the primary key for a key range. Each
# with sequential scans off, and with index or bitmap scans off too.
my @plan_settings = (
	'SET enable_seqscan = off; SET enable_sort = off;',
	'SET enable_seqscan = off; SET enable_sort = off; SET enable_bitmapscan = off;',
	'SET enable_seqscan = off; SET enable_sort = off; SET enable_indexscan = off;');
my @scans = (
	"SELECT * FROM idempotency.keys WHERE expires_at < now() + interval '2 hours'",
	"SELECT * FROM idempotency.keys WHERE expires_at < now() + interval '2 hours' ORDER BY expires_at",
	"SELECT * FROM idempotency.keys WHERE expires_at IS NOT NULL ORDER BY expires_at LIMIT 1",
	"SELECT * FROM idempotency.keys WHERE expires_at IS NOT NULL LIMIT 1",
	'SELECT min(expires_at) FROM idempotency.keys',
	"SELECT * FROM idempotency.keys WHERE key > 'm'",
	"SELECT * FROM idempotency.keys WHERE key > 'm' ORDER BY key LIMIT 1",
	"SELECT * FROM idempotency.keys WHERE key >= 'mm' AND key < 'mn'",
	"SELECT * FROM idempotency.keys WHERE key > 'm' AND expires_at < now() + interval '2 hours'");

sub scans_read
{
	return join(
		"\n",
		map {
			my $settings = $_;
			map {
				"$settings $_\n"
				  . as_role($node, 'alice',
					"$settings EXPLAIN (ANALYZE, BUFFERS OFF, COSTS OFF, TIMING OFF, SUMMARY OFF) $_")
			} @scans
		} @plan_settings);
}

store_bob_keys('mm', '30 minutes');
my $bob_inside = scans_read();
store_bob_keys('aa', '3 days');
my $bob_outside = scans_read();
is($bob_inside, $bob_outside,
	'alice\'s EXPLAIN ANALYZE reads the same whether bob\'s 500 keys lie inside her ranges or outside them');
unlike($bob_inside, qr/^error /m, 'every scan of alice\'s ran');
# PostgreSQL 18 prints rows with two decimals.
like($bob_inside, qr/actual rows=3(?:\.00)? /, '... and found her own keys');
unlike($bob_inside, qr/keys_expires_at_idx/,
	'no plan of hers reads the expires_at index');
is( as_role(
		$node, 'alice',
		"SELECT count(*) FROM idempotency.keys WHERE expires_at OPERATOR(idempotency.~<~) now()"),
	'error 42501',
	'the operators of the expires_at index are not hers to use');

# --- no statistics on the key table -----------------------------------------

# ANALYZE gathers no statistics on idempotency.keys (every column has
# STATISTICS 0): its rows of every role would otherwise be summed up in
# pg_statistic, where estimates read them. The same rows in a table of
# their own get statistics, which shows ANALYZE had rows to look at.
$node->safe_psql('postgres', 'CREATE DATABASE analyzed');
$node->safe_psql(
	'analyzed', q{
CREATE EXTENSION idempotency;
INSERT INTO idempotency.keys (scope, key, request_hash, response, created_at, expires_at)
  SELECT 'pg_monitor', 'k' || g, sha256(convert_to('h' || g, 'UTF8')), NULL, now(), now() + interval '1 day'
    FROM generate_series(1, 100) AS g;
CREATE TABLE keys_copy AS SELECT * FROM idempotency.keys;
ANALYZE idempotency.keys;
ANALYZE keys_copy;
});
is( $node->safe_psql('analyzed',
		q{SELECT count(*) FROM pg_statistic WHERE starelid = 'idempotency.keys'::regclass}),
	'0', 'ANALYZE gathers no statistics on idempotency.keys');
ok( $node->safe_psql('analyzed',
		q{SELECT count(*) FROM pg_statistic WHERE starelid = 'keys_copy'::regclass}) > 0,
	'... while a copy of its rows gets them');

# --- a maximum lowered below settings in force --------------------------------

# alice keeps 20 days for her keys; then a superuser lowers the maximum to an
# hour in postgresql.conf, under the 24h default too. The server and the
# library still start; alice's stored setting is skipped (WARNING), and her
# calls fail with the setting's 22023 rather than give her keys a TTL she
# did not choose, until her session sets idempotency.ttl (or resets it).
$node->safe_psql('postgres', "ALTER ROLE alice SET idempotency.ttl = '20 days'");
$node->append_conf('postgresql.conf', "idempotency.max_ttl = '1 hour'\n");
$node->restart;
my ($rc, $out, $err) = $node->psql(
	'postgres', q{
\set VERBOSITY verbose
SHOW idempotency.ttl;
SELECT idempotency.idempotent_call('after-lowering', NULL, 'SELECT 1');
},
	extra_params => [ '-U', 'alice' ]);
like($err, qr/WARNING:.*idempotency.ttl.*must not exceed idempotency.max_ttl/s,
	'the session is warned that its stored ttl was skipped');
like($err, qr/ERROR:  22023: invalid value for parameter "idempotency.ttl": "20 days"/,
	'... and a call fails with 22023 naming the setting');
is($node->safe_psql('postgres',
		q{SELECT count(*) FROM idempotency.keys WHERE key = 'after-lowering'}),
	'0', '... storing nothing');
($rc, $out, $err) = $node->psql(
	'postgres', q{
SET idempotency.ttl = '30min';
SELECT idempotency.idempotent_call('after-lowering', NULL, 'SELECT 1');
SELECT expires_at - created_at FROM idempotency.keys WHERE key = 'after-lowering';
RESET idempotency.ttl;
SELECT idempotency.idempotent_call('after-reset', NULL, 'SELECT 1');
SELECT expires_at - created_at FROM idempotency.keys WHERE key = 'after-reset';
},
	extra_params => [ '-U', 'alice' ]);
is($out, "1\n00:30:00\n1\n01:00:00",
	'a ttl the session sets works again; after RESET keys get the default, cut to the maximum');

# The maximum lowered under a database's ttl and over alice's own: her
# session's stored ttl outranks the database's, so the refused one is not
# in force there and her calls use hers; a session without a role's ttl
# fails its calls with the database's 22023.
$node->safe_psql('postgres', q{
ALTER ROLE alice SET idempotency.ttl = '30min';
ALTER DATABASE postgres SET idempotency.ttl = '50min';
});
$node->append_conf('postgresql.conf', "idempotency.max_ttl = '40min'\n");
$node->restart;
($rc, $out, $err) = $node->psql(
	'postgres', q{
SELECT idempotency.idempotent_call('outranked', NULL, 'SELECT 1');
SELECT expires_at - created_at FROM idempotency.keys WHERE key = 'outranked';
},
	extra_params => [ '-U', 'alice' ]);
is($out, "1\n00:30:00",
	"a role's ttl in force over a refused database ttl is the one calls use");
($rc, $out, $err) = $node->psql('postgres',
	q{SELECT idempotency.idempotent_call('refused-database-ttl', NULL, 'SELECT 1')});
like($err, qr/ERROR:  invalid value for parameter "idempotency.ttl": "50min"/,
	"... while a session without a role's ttl fails with the database's 22023");
$node->safe_psql('postgres', 'ALTER DATABASE postgres RESET idempotency.ttl');

$node->stop;
done_testing();
