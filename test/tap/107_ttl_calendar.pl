# idempotency.max_ttl holds exactly, in calendar units: a key's expires_at
# is never later than created_at + max_ttl as the server computes
# timestamps, whatever units ttl and max_ttl are spelled in, on any day of
# the year. The server runs at chosen dates (libfaketime moves its clock):
# month ends, leap years, a daylight saving change.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

# Installed by test/lib.sh (Debian's libfaketime).
my ($faketime) = glob('/usr/lib/*/faketime/libfaketime.so.1');
BAIL_OUT('libfaketime is not installed (apt-get install libfaketime)')
  unless defined $faketime && -f $faketime;

my $node = PostgreSQL::Test::Cluster->new('ttl_calendar');
$node->init;
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION idempotency');
$node->stop;

# Restarts the server with its clock at `at` (UTC), then stores a key with
# the given settings; answers the key's lifetime (expires_at - created_at,
# in the session's time zone), whether expires_at is
# least(created_at + ttl, created_at + max_ttl) and whether it is at most
# created_at + max_ttl, all computed by the server.
sub lifetime_at
{
	my ($at, $settings, $key) = @_;
	{
		local $ENV{LD_PRELOAD} = $faketime;
		local $ENV{FAKETIME} = "\@$at";
		$node->start;
	}
	my $result = $node->safe_psql(
		'postgres', qq{
$settings
SELECT idempotency.idempotent_call('$key', NULL, 'SELECT 1');
SELECT expires_at - created_at,
       expires_at = least(created_at + current_setting('idempotency.ttl')::interval,
                          created_at + current_setting('idempotency.max_ttl')::interval),
       expires_at <= created_at + current_setting('idempotency.max_ttl')::interval,
       created_at::date
  FROM idempotency.keys WHERE key = '$key';
});
	$node->stop;
	my ($lifetime, $least, $within, $created) = split /\|/, (split /\n/, $result)[-1];
	is($created, substr($at, 0, 10), "$key: the server's clock was moved");
	ok($least eq 't' && $within eq 't',
		"$key: expires_at is least(created_at + ttl, created_at + max_ttl)");
	return $lifetime;
}

# The default max_ttl, '30 days', and ttl '1 mon': December has 31 days.
is(lifetime_at('2026-12-03 12:00:00', q{SET idempotency.ttl = '1 mon';}, 'dec-1-mon'),
	'30 days', "'1 mon' from 3 December is cut to max_ttl's 30 days");
# A month shorter than max_ttl is the month.
is(lifetime_at('2027-01-31 12:00:00', q{SET idempotency.ttl = '1 mon';}, 'jan-1-mon'),
	'28 days', "'1 mon' from 31 January 2027 is 28 days");
is(lifetime_at('2028-01-31 12:00:00', q{SET idempotency.ttl = 'P1M';}, 'jan-leap-1-mon'),
	'29 days', "'P1M' from 31 January 2028, a leap year, is 29 days");

# max_ttl '361 days': '1 year' (360 days when intervals compare) is allowed,
# and its keys live 361 days, not 365 or 366.
my $year = q{SET idempotency.max_ttl = '361 days';};
is(lifetime_at('2027-03-01 12:00:00', "$year SET idempotency.ttl = '1 year';", 'year'),
	'361 days', "'1 year' under max_ttl '361 days' lives 361 days");
is(lifetime_at('2028-02-29 12:00:00', "$year SET idempotency.ttl = 'P1Y';", 'leap-day-year'),
	'361 days', "'P1Y' from 29 February 2028 lives 361 days");
is(lifetime_at('2027-12-31 12:00:00', "$year SET idempotency.ttl = '11 mons 30 days';", 'mixed-year'),
	'361 days', "'11 mons 30 days' from 31 December 2027 lives 361 days, not 365");

# max_ttl in months: a month counts as the calendar month, February too.
my $month = q{SET idempotency.max_ttl = '1 mon';};
is(lifetime_at('2027-02-10 12:00:00', "$month SET idempotency.ttl = '30 days';", 'feb-30-days'),
	'28 days', "ttl '30 days' under max_ttl '1 mon' lives 28 days from 10 February 2027");
is(lifetime_at('2028-02-10 12:00:00', "$month SET idempotency.ttl = '30 days';", 'feb-leap-30-days'),
	'29 days', "the same in 2028, a leap year: 29 days");
is(lifetime_at('2027-03-10 12:00:00', "$month SET idempotency.ttl = '30 days';", 'mar-30-days'),
	'30 days', "and 30 days from 10 March, a 31-day month");

# A day of max_ttl is a calendar day in the session's time zone: on the day
# Paris moves its clocks forward it has 23 hours, and a ttl of '24 hours'
# is cut to them.
is( lifetime_at(
		'2027-03-27 12:00:00',
		q{SET TimeZone = 'Europe/Paris'; SET idempotency.max_ttl = '1 day';
		  SET idempotency.ttl = '24 hours';},
		'dst-day'),
	'23:00:00',
	"ttl '24 hours' under max_ttl '1 day' lives 23 hours across the spring change");

done_testing();
