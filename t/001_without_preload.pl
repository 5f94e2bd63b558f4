# idempotent_call needs no shared_preload_libraries: the library loads on
# first use, and the call works the same (the expiry worker is what needs
# preloading).
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

$node->stop;
done_testing();
