# Untyped placeholders (what most drivers send) get their types from fn
# through a parse-analysis hook, which works only where the library is
# loaded before the statement is parsed: shared_preload_libraries, or
# session_preload_libraries as here. Without either, a session that has not
# yet used the extension gets PostgreSQL's 42P18, as docs/fingerprints.md
# says; with session_preload_libraries the same statement works and replays
# what a typed call stored.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('untyped_parameters');
$node->init;
$node->start;

$node->safe_psql(
	'postgres', q{
CREATE EXTENSION idempotency;
CREATE TABLE runs (n int);
CREATE FUNCTION withdraw(account int, amount bigint) RETURNS jsonb LANGUAGE sql
  AS $$ INSERT INTO runs VALUES (1); SELECT jsonb_build_object('account', account, 'amount', amount) $$;
});

my $prepare = q{PREPARE p AS SELECT idempotency.idempotent_call($1, NULL,
  'SELECT withdraw($1, $2)', $2, $3)};

my ($rc, $out, $err) = $node->psql('postgres', $prepare);
like($err, qr/could not determine data type of parameter \$2/,
	'without the library loaded, an untyped argument is 42P18');

($rc, $out, $err) = $node->psql('postgres',
	"SELECT idempotency.last_call_replayed(); $prepare; "
	  . q{SELECT parameter_types FROM pg_prepared_statements WHERE name = 'p'});
is($out, "\n{text,integer,bigint}",
	'once the session has loaded the library, the same statement is typed by fn');

is( $node->safe_psql(
		'postgres',
		q{SELECT idempotency.idempotent_call('k', NULL, 'SELECT withdraw($1, $2)', 7, 300)}),
	'{"amount": 300, "account": 7}',
	'a typed call stores the key');

$node->safe_psql('postgres',
	q{ALTER DATABASE postgres SET session_preload_libraries = 'idempotency'});
is( $node->safe_psql(
		'postgres',
		"$prepare; EXECUTE p('k', '7', '300'); SELECT idempotency.last_call_replayed()"),
	qq({"amount": 300, "account": 7}\nt),
	'with session_preload_libraries a new session types the arguments and replays');
is($node->safe_psql('postgres', 'SELECT count(*) FROM runs'),
	'1', 'withdraw ran once');

$node->stop;
done_testing();
