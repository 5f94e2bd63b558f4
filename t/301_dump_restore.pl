# pg_dump keeps the keys: after a dump and restore into another database,
# a retry replays instead of running fn again.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use FindBin;
use lib $FindBin::RealBin;
use IdempotencyTest;

my $node = preloaded_node('dump_restore');

$node->safe_psql(
	'postgres', q{
CREATE ROLE regress_app;
CREATE DATABASE source;
});
$node->safe_psql(
	'source', q{
CREATE EXTENSION idempotency;
CREATE TABLE runs (n int);
GRANT SELECT, INSERT ON runs TO regress_app;
SET ROLE regress_app;
SELECT idempotency.idempotent_call('kept-1', NULL, 'INSERT INTO runs VALUES ($1) RETURNING n', 1);
BEGIN;
SET LOCAL idempotency.ttl = '7 days';
SELECT idempotency.idempotent_call('kept-7d', NULL, 'INSERT INTO runs VALUES ($1) RETURNING n', 7);
COMMIT;
});

my $keys_query = q{SELECT scope, key, request_hash, response,
  expires_at - created_at FROM idempotency.keys ORDER BY key};
my $before = $node->safe_psql('source', $keys_query);

my $dump = $node->basedir . '/source.dump';
command_ok([ 'pg_dump', '-Fc', '-d', $node->connstr('source'), '-f', $dump ],
	'pg_dump of a database with keys');
$node->safe_psql('postgres', 'CREATE DATABASE target');
command_ok([ 'pg_restore', '-d', $node->connstr('target'), $dump ],
	'pg_restore into another database');

is($node->safe_psql('target', $keys_query), $before,
	'the restored keys are the dumped keys, scope and TTL included');

my $retry = q{SET ROLE regress_app;
SELECT idempotency.idempotent_call('kept-1', NULL, 'INSERT INTO runs VALUES ($1) RETURNING n', 1),
       idempotency.last_call_replayed()};
is($node->safe_psql('target', $retry), '1|t', 'a retry after restore replays');
is($node->safe_psql('target', 'SELECT count(*) FROM runs'),
	'2', 'fn did not run again (two rows came with the dump)');

my ($rc, $out, $err) = $node->psql('target',
	q{SET ROLE regress_app; INSERT INTO idempotency.keys (scope, key, request_hash, created_at, expires_at)
	  VALUES ('regress_app', 'x', 'h', now(), now())});
like($err, qr/permission denied/, 'the restored key table is still closed to callers');

$node->stop;
done_testing();
