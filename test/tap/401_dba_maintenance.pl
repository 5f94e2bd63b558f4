# DBA maintenance of idempotency.keys under load: while clients keep
# calling idempotent_call, the table is reindexed concurrently, gets a new
# index built concurrently, is rewritten by VACUUM FULL and CLUSTER, and
# gets a column with a default. No call fails with anything but IK409 (the
# DDL only makes calls wait for its locks, as it would for any table),
# every acknowledged key replays afterwards without running fn again, rows
# written after the new column have its default, and amcheck finds every
# index consistent with the table.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;

use FindBin;
use lib $FindBin::RealBin;
use IdempotencyTest;

my $clients = 4;
my $calls_per_client = 3000;    # the most a client makes; the stop flag ends it sooner

my $node = preloaded_node('dba_maintenance');
$node->safe_psql(
	'postgres', q{
CREATE EXTENSION idempotency;
CREATE EXTENSION amcheck;
CREATE TABLE runs (key text NOT NULL);
CREATE FUNCTION work(op_key text) RETURNS jsonb LANGUAGE sql AS $$
  INSERT INTO runs VALUES (op_key) RETURNING jsonb_build_object('key', key)
$$;
-- Once it has a row, clients make no further calls.
CREATE TABLE load_stop (stopped bool);
-- How many of the keys did not replay (fn ran again, or another answer).
CREATE FUNCTION not_replayed(keys text[]) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
  k text;
  missing bigint := 0;
BEGIN
  FOREACH k IN ARRAY keys LOOP
    IF idempotency.idempotent_call(k, NULL, 'SELECT work($1)', k)
         IS DISTINCT FROM jsonb_build_object('key', k)
       OR NOT idempotency.last_call_replayed() THEN
      missing := missing + 1;
    END IF;
  END LOOP;
  RETURN missing;
END $$;
});

# One client: a psql session making one call per statement, each in its own
# transaction, with a fresh key; the call's output line acknowledges it.
# Script and output are files, so a client never waits for the test to
# read from it.
sub start_client
{
	my ($client) = @_;
	my $script = "\\set VERBOSITY verbose\n";
	for my $i (1 .. $calls_per_client)
	{
		my $key = "c$client-$i";
		$script .=
		  "SELECT 'ack', k, idempotency.idempotent_call(k, NULL, 'SELECT work(\$1)', k) "
		  . "FROM (VALUES ('$key')) AS v (k) WHERE NOT EXISTS (SELECT FROM load_stop);\n";
	}
	my $base = $node->basedir . "/client$client";
	append_to_file("$base.sql", $script);
	my $handle = IPC::Run::start(
		[
			'psql', '-X', '-q', '-A', '-f', "$base.sql", '-d',
			$node->connstr('postgres') . ' application_name=load_client'
		],
		'<', \undef, '>', "$base.out", '2>', "$base.err",
		IPC::Run::timeout($PostgreSQL::Test::Utils::timeout_default * 3));
	return { handle => $handle, out => "$base.out", err => "$base.err" };
}

# Waits until the clients have made `more` calls beyond what they had made,
# so each maintenance step overlaps with calls; or until no client is left
# (they stop early only when their calls fail, which the test reports).
sub wait_for_calls
{
	my ($more) = @_;
	my $target =
	  $node->safe_psql('postgres', 'SELECT count(*) FROM runs') + $more;
	$node->poll_query_until(
		'postgres', qq{
SELECT (SELECT count(*) >= $target FROM runs)
    OR NOT EXISTS (SELECT FROM pg_stat_activity WHERE application_name = 'load_client')})
	  or die "the clients made no calls";
}

my @client_runs = map { start_client($_) } 1 .. $clients;

my @maintenance = (
	'REINDEX TABLE CONCURRENTLY idempotency.keys',
	'CREATE INDEX CONCURRENTLY keys_created_at_idx ON idempotency.keys (created_at)',
	'VACUUM FULL idempotency.keys',
	'CLUSTER idempotency.keys USING keys_pkey',
	'ALTER TABLE idempotency.keys ADD COLUMN note int NOT NULL DEFAULT 7',
	'CREATE INDEX CONCURRENTLY keys_note_idx ON idempotency.keys (note, lower(key)) WHERE note > 0',
	'REINDEX TABLE CONCURRENTLY idempotency.keys',
);
for my $statement (@maintenance)
{
	wait_for_calls(50);
	$node->safe_psql('postgres', $statement);
	pass("under load: $statement");
}
wait_for_calls(50);
$node->safe_psql('postgres', 'INSERT INTO load_stop VALUES (true)');

my (@acknowledged, %failures);
for my $run (@client_runs)
{
	$run->{handle}->finish;
	my $out = slurp_file($run->{out});
	my $err = slurp_file($run->{err});
	push @acknowledged, $out =~ /^ack\|([^|]+)\|/mg;
	$failures{$1}++ while $err =~ /ERROR:\s+([0-9A-Z]{5}):/g;
	my @other = grep { !/ERROR:|^\s*$|LOCATION:|DETAIL:|HINT:/ }
	  split /\n/, $err;
	is(join("\n", @other), '', 'a client wrote nothing else to stderr');
}
delete $failures{IK409};
is(join(', ', map { "$_ x$failures{$_}" } sort keys %failures),
	'', 'no call failed with anything but IK409');
note scalar(@acknowledged) . ' keys acknowledged';
cmp_ok(scalar @acknowledged, '>', 7 * 50, 'the clients made calls throughout');

my $keys = "ARRAY['" . join("', '", @acknowledged) . "']";
is($node->safe_psql('postgres', "SELECT not_replayed($keys)"),
	'0', 'every acknowledged key replays');
is( $node->safe_psql(
		'postgres',
		'SELECT count(*) FROM (SELECT key FROM runs GROUP BY key HAVING count(*) > 1) AS again'
	),
	'0',
	'fn ran once per key');
is( $node->safe_psql(
		'postgres',
		"SELECT count(*) FROM runs WHERE key NOT IN (SELECT key FROM idempotency.keys)"),
	'0', 'every run committed its key');
is($node->safe_psql('postgres', 'SELECT count(*) FROM idempotency.keys WHERE note IS DISTINCT FROM 7'),
	'0', 'keys stored after the column was added have its default');
is( $node->safe_psql(
		'postgres', q{
SELECT string_agg(c.relname || ': ' || i.indisvalid, ', ' ORDER BY c.relname)
  FROM pg_index AS i JOIN pg_class AS c ON c.oid = i.indexrelid
 WHERE i.indrelid = 'idempotency.keys'::regclass
   AND bt_index_check(i.indexrelid, heapallindexed => true) IS NOT NULL}),
	'keys_created_at_idx: true, keys_expires_at_idx: true, keys_note_idx: true, keys_pkey: true',
	'amcheck: every index is valid and holds every row');

$node->stop;
done_testing();
