# Failover: a primary with a synchronous streaming standby. Before promotion
# the standby answers replays of replicated keys and refuses anything that
# must write with 25006; after the primary dies and the standby is promoted,
# every key the primary acknowledged replays there instead of running again.
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
$primary->append_conf(
	'postgresql.conf', q{
shared_preload_libraries = 'idempotency'
synchronous_standby_names = 'standby'
# An acknowledged commit is already visible on the standby.
synchronous_commit = remote_apply
});
$primary->start;
$primary->backup('base');

my $standby = PostgreSQL::Test::Cluster->new('standby');
$standby->init_from_backup($primary, 'base', has_streaming => 1);
# Once promoted it stands alone: no synchronous standby to wait for.
$standby->append_conf('postgresql.conf', q{synchronous_standby_names = ''});
$standby->start;

$primary->safe_psql(
	'postgres', q{
CREATE EXTENSION idempotency;
CREATE TABLE runs (key text NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE FUNCTION work(op_key text, amount int) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO runs (key) VALUES (op_key);
  RETURN jsonb_build_object('key', op_key, 'amount', amount, 'at', clock_timestamp());
END $$;
});
is( $primary->safe_psql(
		'postgres',
		"SELECT sync_state FROM pg_stat_replication WHERE application_name = 'standby'"),
	'sync',
	'the standby is synchronous');

sub call_sql
{
	my ($key, $amount) = @_;
	return "SELECT idempotency.idempotent_call('$key', NULL, "
	  . "'SELECT work(\$1, \$2)', '$key'::text, $amount), "
	  . 'idempotency.last_call_replayed()';
}



# Keys the primary acknowledged, with the response it answered.
my %acknowledged;
for my $n (1 .. 20)
{
	my ($response, $replayed) = split /\|/,
	  $primary->safe_psql('postgres', call_sql("acked-$n", $n));
	die "acked-$n did not run" unless $replayed eq 'f';
	$acknowledged{"acked-$n"} = [ $response, $n ];
}

# A key whose transaction is still open on the primary at failover time.
my $open = $primary->background_psql('postgres');
$open->query_safe('BEGIN');
$open->query_safe(call_sql('open-at-failover', 1));

# --- on the standby, before promotion ---------------------------------------

is($standby->safe_psql('postgres', 'SELECT pg_is_in_recovery()'),
	't', 'the standby is in recovery');
my $replays_on_standby = 0;
for my $key (sort keys %acknowledged)
{
	my ($response, $amount) = @{ $acknowledged{$key} };
	$replays_on_standby++
	  if $standby->safe_psql('postgres', call_sql($key, $amount)) eq
	  "$response|t";
}
is($replays_on_standby, scalar keys %acknowledged,
	'every replicated key replays on the standby, byte for byte');
is( $standby->safe_psql(
		'postgres',
		'BEGIN ISOLATION LEVEL REPEATABLE READ; '
		  . call_sql('acked-1', 1) . '; COMMIT'),
	"$acknowledged{'acked-1'}[0]|t",
	'... also under REPEATABLE READ');
is(sqlstate_of($standby, call_sql('acked-1', 999)),
	'IK422', 'a replicated key with another request answers IK422');
is(sqlstate_of($standby, call_sql('new-on-standby', 1)),
	'25006', 'a new key must write: 25006 on the standby');
is(sqlstate_of($standby, call_sql('open-at-failover', 1)),
	'25006', 'a key in progress on the primary must write too: 25006');
is( $standby->safe_psql(
		'postgres',
		"SELECT count(*) FROM idempotency.keys WHERE key IN ('new-on-standby', 'open-at-failover')"),
	'0',
	'nothing of the refused calls is visible on the standby');

# --- failover -----------------------------------------------------------------

$primary->stop('immediate');
$open->{run}->kill_kill;
$standby->promote;
$standby->poll_query_until('postgres', 'SELECT NOT pg_is_in_recovery()')
  or die 'the standby was not promoted';

my ($replayed_after, $ran_again) = (0, 0);
for my $key (sort keys %acknowledged)
{
	my ($response, $amount) = @{ $acknowledged{$key} };
	$replayed_after++
	  if $standby->safe_psql('postgres', call_sql($key, $amount)) eq
	  "$response|t";
	$ran_again++ if runs_of($standby, $key) ne '1';
}
is($replayed_after, scalar keys %acknowledged,
	'every key acknowledged by the old primary replays on the promoted standby');
is($ran_again, 0, '... and none of them ran fn again');

my ($response, $replayed) = split /\|/,
  $standby->safe_psql('postgres', call_sql('open-at-failover', 1));
is($replayed, 'f',
	'the key whose transaction died with the primary runs on the new primary');
is(runs_of($standby, 'open-at-failover'), '1', '... exactly once');
is( $standby->safe_psql('postgres', call_sql('open-at-failover', 1)),
	"$response|t", '... and replays from then on');
is(sqlstate_of($standby, call_sql('acked-2', 999)),
	'IK422', 'a replicated key with another request still answers IK422');

$standby->stop;
done_testing();
