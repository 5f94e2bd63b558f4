# Two databases counting their first call at the same moment get a counter
# slot each, even when both find the same free slot. Here both first calls
# wait inside the search for a free slot (their look-up of a dropped
# database's slot owner needs pg_database, which the test keeps locked), so
# both have chosen before either takes a slot.
use strict;
use warnings;
use FindBin;
use lib $FindBin::RealBin;
use IdempotencyTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

# No expiry worker: it would count in the databases too.
my $node = preloaded_node('stats_slots', conf => "idempotency.expire_interval = 0\n");
for my $db (qw(gone shop bank))
{
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	$node->safe_psql($db, 'CREATE EXTENSION idempotency');
}
# The first slot belongs to a database that is then dropped: reusable, once
# a look-up in pg_database has found its owner gone.
$node->safe_psql('gone', "SELECT idempotency.idempotent_call('k', NULL, 'SELECT 1')");
$node->safe_psql('postgres', 'DROP DATABASE gone');

my %caller = map { $_ => $node->background_psql($_) } qw(shop bank);
my $locker = $node->background_psql('postgres');
$locker->query_safe('BEGIN; LOCK TABLE pg_catalog.pg_database IN ACCESS EXCLUSIVE MODE');
for my $db (qw(shop bank))
{
	$caller{$db}->query_until(qr/calling/, qq{
\\echo calling
SELECT idempotency.idempotent_call('k', NULL, 'SELECT 1');
});
}
# New connections would wait for pg_database too: the locker watches.
my $deadline = time() + $PostgreSQL::Test::Utils::timeout_default;
until ($locker->query_safe(
	"SELECT count(*) FROM pg_catalog.pg_locks WHERE relation = 'pg_catalog.pg_database'::regclass AND NOT granted") eq '2')
{
	die 'the first calls never waited for pg_database' if time() > $deadline;
	sleep 1;
}
$locker->query_safe('COMMIT');
$locker->quit;
$_->quit for values %caller;

my $counted = q{SELECT string_agg(datname || ':' || calls_ran, ',' ORDER BY datname)
  FROM idempotency.stats WHERE datname IN ('shop', 'bank')};
is($node->safe_psql('shop', $counted), 'bank:1,shop:1',
	'each database counts its own call in its own slot');

done_testing();
