# Generic plans: one prepared statement, planned once for every key and
# argument value (plan_cache_mode = force_generic_plan), called through the
# extended protocol by pgbench's clients with many keys, each key repeated:
# every key runs once with its own arguments and every repeat replays its
# response. Both as a named prepared statement (-M prepared) and as unnamed
# statements (-M extended); test/tap/402_pgbouncer.pl runs the same behind
# PgBouncer's transaction pooling.
use strict;
use warnings;
use FindBin;
use lib $FindBin::RealBin;
use IdempotencyTest;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = preloaded_node('generic_plans');
generic_plan_database($node, 'generic');
my $connstr = 'host=' . $node->host . ' port=' . $node->port . ' dbname=generic';
is($node->safe_psql('generic', 'SHOW plan_cache_mode'), 'force_generic_plan',
	'sessions of the database plan generically');
generic_plan_run($node, 'generic', $connstr, 'prepared', 'named');
generic_plan_run($node, 'generic', $connstr, 'extended', 'unnamed');

$node->stop;
done_testing();
