# Derived keys (idempotency.derived_key) outlive everything a retry may
# follow: a restart, a crash, a physical standby and its promotion, and a
# dump restored into another database of the cluster (same role OIDs). Each
# must hand the provider the key it had before, or the effect would happen
# twice.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use FindBin;
use lib $FindBin::RealBin;
use IdempotencyTest;

my $primary = PostgreSQL::Test::Cluster->new('primary');
$primary->init(allows_streaming => 1);
$primary->append_conf('postgresql.conf',
	"shared_preload_libraries = 'idempotency'\n");
$primary->start;

$primary->safe_psql(
	'postgres', q{
CREATE ROLE regress_app;
CREATE ROLE regress_other;
CREATE DATABASE source;
});
$primary->safe_psql('source', 'CREATE EXTENSION idempotency');

$primary->backup('base');
my $standby = PostgreSQL::Test::Cluster->new('standby');
$standby->init_from_backup($primary, 'base', has_streaming => 1);
$standby->start;

my $derived = q{SET ROLE regress_app;
SELECT string_agg(idempotency.derived_key(k, l), ' ' ORDER BY k, l)
  FROM (VALUES ('order-1', 'charge'), ('order-1', 'email'), ('order-2', 'charge')) AS v(k, l)};
my $before = $primary->safe_psql('source', $derived);
like($before, qr/^([0-9a-f-]{36} ){2}[0-9a-f-]{36}$/, 'three derived keys');
isnt(
	$primary->safe_psql(
		'source',
		q{SET ROLE regress_other; SELECT idempotency.derived_key('order-1', 'charge')}),
	(split / /, $before)[0],
	'another role derives another key');

$primary->restart;
is($primary->safe_psql('source', $derived), $before, 'the same after a restart');

$primary->stop('immediate');
$primary->start;
is($primary->safe_psql('source', $derived), $before, 'the same after a crash');

$primary->wait_for_catchup($standby);
is($standby->safe_psql('source', $derived),
	$before, 'the same on a hot standby');

# Restored into another database of the cluster: CREATE EXTENSION draws a
# new secret, then the dump's row replaces it.
my $dump = $primary->basedir . '/source.dump';
command_ok([ 'pg_dump', '-Fc', '-d', $primary->connstr('source'), '-f', $dump ],
	'pg_dump of a database with derived keys');
$primary->safe_psql('postgres', 'CREATE DATABASE target');
command_ok([ 'pg_restore', '-d', $primary->connstr('target'), $dump ],
	'pg_restore into another database');
is($primary->safe_psql('target', $derived), $before,
	'the same after a dump restored into another database');
is($primary->safe_psql('target', 'SELECT count(*) FROM idempotency.derived_key_secret'),
	'1', 'one secret after the restore');

# A database that was not restored has its own secret.
$primary->safe_psql('postgres', 'CREATE DATABASE fresh');
$primary->safe_psql('fresh', 'CREATE EXTENSION idempotency');
isnt($primary->safe_psql('fresh', $derived),
	$before, 'another database derives other keys');

# The primary is lost; the standby takes over.
$primary->wait_for_catchup($standby);
$primary->stop('immediate');
$standby->promote;
is($standby->safe_psql('source', $derived),
	$before, 'the same after the standby is promoted');

# A rotation changes them, on purpose.
$standby->safe_psql('source',
	q{UPDATE idempotency.derived_key_secret SET secret = sha256('rotated')});
isnt($standby->safe_psql('source', $derived),
	$before, 'a rotation of the secret changes every derived key');

done_testing();
