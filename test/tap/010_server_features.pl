# What the newer PostgreSQL majors show of the extension, each checked on the
# majors that have it:
# - PostgreSQL 18: pg_get_loaded_modules() names the library and its version
#   (META.json's);
# - PostgreSQL 17: the expiry launcher and the per-database worker wait
#   under wait events of their own (IdempotencyLauncherSleep,
#   IdempotencyExpiryPace); before, both show "Extension";
# - PostgreSQL 17: transaction_timeout ends a transaction that holds a claim,
#   and the key is free for the next caller at once, as
#   idle_in_transaction_session_timeout does on every major.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use IdempotencyTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = preloaded_node('server_features', conf => "idempotency.expire_interval = '1h'\n");
my $major = $node->pg_version->major;
$node->safe_psql('postgres', q{
CREATE EXTENSION idempotency;
CREATE TABLE runs (n int);
});

my ($meta_version) = slurp_file("$FindBin::RealBin/../../META.json") =~ /^   "version": "([^"]+)"/m;
if ($major >= 18)
{
	is( $node->safe_psql(
			'postgres', q{SELECT module_name || ' ' || version FROM pg_get_loaded_modules()
 WHERE file_name LIKE 'idempotency%'}),
		"idempotency $meta_version",
		"PostgreSQL $major: pg_get_loaded_modules() names the library and its version $meta_version");
}
else
{
	is($node->safe_psql('postgres', q{SELECT count(*) FROM pg_proc WHERE proname = 'pg_get_loaded_modules'}),
		'0', "PostgreSQL $major: no pg_get_loaded_modules() (the magic block names nothing)");
}

my $launcher_wait = $major >= 17 ? 'IdempotencyLauncherSleep' : 'Extension';
ok( $node->poll_query_until(
		'postgres', qq{SELECT wait_event_type || '/' || wait_event FROM pg_stat_activity
 WHERE backend_type = 'idempotency launcher'}, "Extension/$launcher_wait"),
	"PostgreSQL $major: the sleeping launcher waits on Extension/$launcher_wait");

# A claim held by a transaction that a timeout ends is free at once.
sub claim_freed_by
{
	my ($setting) = @_;
	my $key = "held-$setting";
	my $holder = $node->background_psql('postgres', on_error_stop => 0);
	$holder->query_safe("SET $setting = '3s'");
	$holder->query_safe('BEGIN');
	$holder->query_safe("SELECT replayed FROM idempotency.claim('$key', 'h')");
	is(sqlstate_of($node, "SELECT idempotency.claim('$key', 'h')"),
		'IK409', "$setting: while the transaction holds the claim, another caller gets IK409");
	ok( $node->poll_query_until(
			'postgres', qq{SELECT count(*) = 0 FROM pg_locks l JOIN pg_stat_activity a USING (pid)
 WHERE a.query LIKE '%claim(''$key''%' AND a.pid <> pg_backend_pid()}),
		"$setting: the timeout ends the holder's transaction");
	is( $node->safe_psql('postgres', qq{BEGIN; SELECT replayed FROM idempotency.claim('$key', 'h');
SELECT idempotency.complete('$key', '"mine"'); COMMIT;
SELECT replayed, response FROM idempotency.claim('$key', 'h')}),
		"f\n\nt|\"mine\"",
		"$setting: the next caller claims the key, runs and stores its answer");
	$holder->quit;
}

claim_freed_by('idle_in_transaction_session_timeout');
if ($major >= 17)
{
	claim_freed_by('transaction_timeout');
}
else
{
	isnt(sqlstate_of($node, "SET transaction_timeout = '3s'"),
		'no error', "PostgreSQL $major has no transaction_timeout");
}

done_testing();
