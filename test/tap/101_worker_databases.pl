# The expiry worker cleans every database where the extension is installed
# and leaves the others alone (also template databases and databases that
# refuse connections); SIGHUP changes its interval; CREATE DATABASE ...
# TEMPLATE, ALTER DATABASE ... RENAME, ... SET TABLESPACE and DROP DATABASE
# of a database it is working in succeed (each waits only a few seconds for
# other sessions, then fails: success shows the worker left).
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib $FindBin::RealBin;
use IdempotencyTest;

my $node = PostgreSQL::Test::Cluster->new('expiry');
$node->init;
$node->append_conf(
	'postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.expire_interval = '1s'
# Expired keys are deleted, not kept as tombstones (213 has those).
idempotency.remember = 0
});
$node->start;
my $log_start = -s $node->logfile;

# Claims keys through idempotent_call with the given TTL; 'expired' stores
# them and then moves them past their TTL.
sub claim_keys
{
	my ($db, $ttl, @keys) = @_;
	my $expired = $ttl eq 'expired';
	$node->safe_psql($db,
		"SET idempotency.ttl = '" . ($expired ? '1 day' : $ttl) . "';"
		  . join('',
			map { "SELECT idempotency.idempotent_call('$_', NULL, 'SELECT 1');" }
			  @keys)
		  . ($expired
			? expire_keys_sql("key IN ('" . join("', '", @keys) . "')")
			: ''));
}

sub count_keys
{
	my ($db, $condition) = @_;
	return $node->safe_psql($db,
		"SELECT count(*) FROM idempotency.keys WHERE $condition");
}

# Rounds the worker has finished in $db, read from the status view of
# database $via.
sub rounds_done
{
	my ($via, $db) = @_;
	return $node->safe_psql($via,
		"SELECT coalesce(sum(rounds), 0) FROM idempotency.expiry_status WHERE datname = '$db'"
	);
}

sub wait_for_rounds
{
	my ($via, $db, $rounds) = @_;
	$node->poll_query_until($via,
		"SELECT coalesce(sum(rounds), 0) >= $rounds FROM idempotency.expiry_status WHERE datname = '$db'"
	) or die "no $rounds rounds in $db";
}

sub worker_in
{
	my ($db) = @_;
	$node->poll_query_until('postgres',
		"SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'idempotency expiry' AND datname = '$db'"
	) or die "the expiry worker never worked in $db";
}

is( $node->safe_psql(
		'postgres',
		"SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'idempotency launcher' AND datname IS NULL"
	),
	'1',
	'the launcher runs, connected to no database');

# Two databases with the extension, and one with a look-alike table but no
# extension: the worker must go by the extension, not by the table.
for my $db ('served_a', 'served_b')
{
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	$node->safe_psql($db, 'CREATE EXTENSION idempotency');
}
$node->safe_psql('postgres', 'CREATE DATABASE plain');
$node->safe_psql(
	'plain', q{
CREATE SCHEMA idempotency;
CREATE TABLE idempotency.keys AS
    SELECT current_user::regrole AS scope, 'k' || g AS key, 'h' AS request_hash,
           'done' AS status, '1'::jsonb AS response,
           now() - interval '2 days' AS created_at,
           now() - interval '1 day' AS expires_at
      FROM generate_series(1, 10) AS g;
});

# A template database and one that refuses connections, both with the
# extension and an expired key: never visited. Each is a template, or
# closed, before its key expires (the closed one is a copy of the template).
$node->safe_psql('postgres', 'CREATE DATABASE template_db IS_TEMPLATE true');
$node->safe_psql('template_db', 'CREATE EXTENSION idempotency');
claim_keys('template_db', 'expired', 'never-visited');
$node->safe_psql('postgres',
	'CREATE DATABASE closed_db TEMPLATE template_db ALLOW_CONNECTIONS false');

for my $db ('served_a', 'served_b')
{
	claim_keys($db, 'expired', 'gone-1', 'gone-2');
	claim_keys($db, '1 day', 'kept');
}
for my $db ('served_a', 'served_b')
{
	$node->poll_query_until($db,
		"SELECT count(*) = 0 FROM idempotency.keys WHERE key LIKE 'gone-%'")
	  or die "expired keys stay in $db";
	pass("expired keys deleted in $db");
	is(count_keys($db, "key = 'kept'"), '1', "live key kept in $db");
}

# Two more rounds in served_a: the round in between visited every database.
wait_for_rounds('served_a', 'served_a', rounds_done('served_a', 'served_a') + 2);
is(count_keys('plain', 'true'),
	'10', 'a database without the extension is left alone');
is( $node->safe_psql(
		'served_a',
		"SELECT string_agg(datname || ':' || total_deleted || ':' || coalesce(last_error, 'ok'), ',' ORDER BY datname) FROM idempotency.expiry_status"
	),
	'served_a:2:ok,served_b:2:ok',
	'the status view shows the served databases and what was deleted, and no template or closed database'
);
$node->safe_psql('postgres', 'ALTER DATABASE closed_db ALLOW_CONNECTIONS true');
is(count_keys($_, 'true'), '1', "$_ was not visited")
  for 'template_db', 'closed_db';
unlike(
	substr(slurp_file($node->logfile), $log_start),
	qr/\b(ERROR|FATAL|PANIC):/,
	'no errors in the log');

# SIGHUP: a long interval stops the rounds, a short one resumes them. Once
# the reload is in and no round runs, three of the old 1 s intervals pass
# (measured from the last round's end, read from the status view) without
# a round.
$node->safe_psql('postgres',
	"ALTER SYSTEM SET idempotency.expire_interval = '1h'; SELECT pg_reload_conf()"
);
$node->poll_query_until('served_a',
	"SELECT current_setting('idempotency.expire_interval') = '1h' AND bool_and(running_since IS NULL) FROM idempotency.expiry_status"
) or die 'a round never ended';
my $rounds = rounds_done('served_a', 'served_a');
claim_keys('served_a', 'expired', 'waits-for-reload');
$node->poll_query_until('served_a',
	"SELECT clock_timestamp() > max(last_finished) + interval '3s' FROM idempotency.expiry_status"
) or die 'the clock stopped';
is(count_keys('served_a', "key = 'waits-for-reload'"),
	'1', 'after a reload to 1h, no round runs for three old intervals');
is(rounds_done('served_a', 'served_a'), $rounds, 'no round was counted');

$node->safe_psql('postgres',
	"ALTER SYSTEM SET idempotency.expire_interval = '1s'; SELECT pg_reload_conf()"
);
$node->poll_query_until('served_a',
	"SELECT count(*) = 0 FROM idempotency.keys WHERE key = 'waits-for-reload'")
  or die 'the reload to 1s was not picked up';
pass('after a reload to 1s, the next round runs');

# A database with a backlog the worker works through slowly, so that it is
# still connected when CREATE DATABASE ... TEMPLATE and DROP DATABASE come.
$node->safe_psql('postgres', 'CREATE DATABASE busy');
$node->safe_psql(
	'busy', q{
CREATE EXTENSION idempotency;
ALTER DATABASE busy SET idempotency.expire_batch_size = 1;
ALTER DATABASE busy SET idempotency.expire_rate = 10;
-- Written as keys claimed under remember = 0 are (a key's window is its
-- row's): expiry deletes them rather than keeping tombstones.
INSERT INTO idempotency.keys (scope, key, request_hash, response, created_at,
                              expires_at, key_digest, remember_for)
    SELECT current_user::regrole, 'k' || g, sha256('h'::bytea), '1'::jsonb,
           now() - interval '2 days', now() - interval '1 day',
           idempotency.key_digest('k' || g), interval '0'
      FROM generate_series(1, 1000) AS g;
});

# Each command waits a few seconds for other sessions to leave, then fails
# ("being accessed by other users"); the worker is in the database when it
# starts, so its success shows the worker left.
sub succeeds_while_worker_in
{
	my ($db, $command, $what) = @_;
	worker_in($db);
	my ($rc, $stdout, $stderr) = $node->psql('postgres', $command);
	is($rc, 0, "$what of a database being cleaned succeeds")
	  or diag($stderr);
}
succeeds_while_worker_in('busy', 'CREATE DATABASE busy_copy TEMPLATE busy',
	'CREATE DATABASE ... TEMPLATE');
cmp_ok(count_keys('busy', 'true'),
	'>', 0, 'the round in that database was not over');
succeeds_while_worker_in('busy', 'ALTER DATABASE busy RENAME TO busy_renamed',
	'ALTER DATABASE ... RENAME');
my $tablespace = $node->basedir . '/busy_tablespace';
mkdir $tablespace or die "$tablespace: $!";
$node->safe_psql('postgres', "CREATE TABLESPACE busy_space LOCATION '$tablespace'");
succeeds_while_worker_in('busy_renamed',
	'ALTER DATABASE busy_renamed SET TABLESPACE busy_space',
	'ALTER DATABASE ... SET TABLESPACE');
succeeds_while_worker_in('busy_renamed', 'DROP DATABASE busy_renamed',
	'DROP DATABASE');

$node->poll_query_until('busy_copy',
	'SELECT count(*) = 0 FROM idempotency.keys')
  or die 'the copy is not cleaned';
pass('the copy of a served database is served too');
unlike(
	substr(slurp_file($node->logfile), $log_start),
	qr/being accessed by other users/,
	'nobody was told the database is in use');

$node->stop;
done_testing();
