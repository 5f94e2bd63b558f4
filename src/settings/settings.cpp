#include "idempotency/settings/sqlstate_list.hpp"

#include "idempotency/settings/settings.hpp"

#include "idempotency/compat.hpp"

extern "C" {
#include "utils/builtins.h"
#include "utils/datetime.h"
#include "utils/guc.h"
#include "utils/memutils.h"
}

namespace idempotency::settings {

namespace detail {
uint64 statement_hash_mask = ~(uint64)0;
}

namespace {

int interval_seconds = 0;
int batch_size = 0;
int rate = 0;
int statement_hash_bits = 0;

void assign_statement_hash_bits(int bits, void *) {
  detail::statement_hash_mask =
      bits >= 64 ? ~(uint64)0 : ((uint64)1 << bits) - 1;
}

// Refusals PostgreSQL only warns about (settings.hpp, define()) are seen
// through the public GUC API alone: the check hooks' source, and a
// placeholder's text before define() against the value in force after it.

struct CallSetting {
  const char *name;
  bool integer; // shown by GetConfigOption() as a number without its unit
  // A value the setting did not take: `checked`, its check hook refused it at
  // `source`; else PostgreSQL did before the hook (range, or superuser-only).
  bool refused = false;
  char *text = nullptr; // malloc'd (check hooks must not raise); may be null
  bool checked = false;
  GucSource source = PGC_S_DEFAULT;
  // The highest source the check hooks have seen outside define(): a
  // session's values come highest first; one outranked is not in force.
  GucSource highest_checked = PGC_S_DEFAULT;
  char *placeholder = nullptr; // its text before define()
};
static_assert(std::is_trivially_destructible_v<CallSetting>);

CallSetting max_ttl_state{"idempotency.max_ttl", false};
CallSetting ttl_state{"idempotency.ttl", false};
CallSetting wait_timeout_state{"idempotency.wait_timeout", true};
CallSetting max_response_size_state{"idempotency.max_response_size", true};
CallSetting store_errors_state{"idempotency.store_errors", false};
CallSetting remember_state{"idempotency.remember", false};
CallSetting *const call_settings[] = {
    &max_ttl_state,           &ttl_state,          &wait_timeout_state,
    &max_response_size_state, &store_errors_state, &remember_state};
bool any_refused = false;

// Whether define() is handing placeholders to the settings.
bool defining = false;

void keep_refused(CallSetting &setting, const char *text, bool checked,
                  GucSource source) {
  // Checked again by report_refused(): already kept.
  if (setting.refused && setting.text != nullptr &&
      strcmp(setting.text, text) == 0 && setting.checked == checked &&
      setting.source == source)
    return;
  free(setting.text);
  setting.refused = true;
  setting.text = strdup(text);
  setting.checked = checked;
  setting.source = source;
  any_refused = true;
}

// A call setting's check hook: `valid`'s verdict, its refusal kept when
// PostgreSQL would only warn and the value would have been in force.
template <CallSetting &checked, bool (*valid)(char **, void **, GucSource)>
bool check(char **newval, void **extra, GucSource source) {
  bool accepted = valid(newval, extra, source);
  if (source == PGC_S_TEST || source == PGC_S_DEFAULT || *newval == nullptr)
    return accepted;
  bool in_force = defining;
  if (!defining && checked.highest_checked <= source) {
    checked.highest_checked = source;
    // The sources PostgreSQL only warns about while a session starts.
    in_force = source == PGC_S_GLOBAL || source == PGC_S_DATABASE ||
               source == PGC_S_USER || source == PGC_S_DATABASE_USER;
  }
  if (!accepted && in_force)
    keep_refused(checked, *newval, true, source);
  return accepted;
}

// Whether the setting holds the value `text` after define().
bool holds(const CallSetting &setting, const char *text) {
  const char *in_force = GetConfigOption(setting.name, false, false);
  if (strcmp(in_force, text) == 0)
    return true;
  int flags = GetConfigOptionFlags(setting.name, false);
  int wanted = 0;
  int held = 0;
  return setting.integer && parse_int(text, &wanted, flags, nullptr) &&
         parse_int(in_force, &held, flags, nullptr) && wanted == held;
}

void refused_value_context(void *arg) {
  errcontext("%s: a value PostgreSQL could only warn about (set before the "
             "idempotency library was loaded, or a role's or database's "
             "value); calls fail until the setting is set again",
             static_cast<const char *>(arg));
}

// PostgreSQL's own error for the value, checked again as SET would: by the
// check hook (with the right to set the setting), or else with the session
// user's rights, which raises the range or permission error. Should the
// value pass now, a 22023 all the same: the setting did not take it.
[[noreturn]] void report_refused(const CallSetting &setting) {
  const char *name = setting.name;
  ErrorContextCallback context{error_context_stack, refused_value_context,
                               const_cast<char *>(name)};
  error_context_stack = &context;
  if (setting.text == nullptr)
    ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                    errmsg("invalid value for parameter \"%s\"", name)));
  (void)set_config_option_ext(name, setting.text,
                              setting.checked ? PGC_SUSET : PGC_USERSET,
                              setting.checked ? setting.source : PGC_S_SESSION,
                              setting.checked ? InvalidOid : GetUserId(),
                              GUC_ACTION_SET, false, ERROR, false);
  ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                  errmsg("invalid value for parameter \"%s\": \"%s\"", name,
                         setting.text)));
}

// In the call settings' accessors: no call runs on a default nobody chose.
void raise_if_value_refused() {
  if (!any_refused)
    return;
  for (const CallSetting *setting : call_settings)
    if (setting->refused)
      report_refused(*setting);
  any_refused = false;
}

// For expiry, which reads idempotency.remember alone and must not stop
// because a role's or database's ttl was refused.
void raise_if_refused(const CallSetting &setting) {
  if (any_refused && setting.refused)
    report_refused(setting);
}

char *ttl_text = nullptr;
Interval ttl_value;
char *max_ttl_text = nullptr;
Interval max_ttl_value;
Interval key_ttl_value;
int wait_timeout = 0;
int max_response_size = 0;
char *remember_text = nullptr;
Interval remember_value;

char *store_errors_text = nullptr;
SqlstateList no_stored_errors{};
const SqlstateList *stored_errors_value = &no_stored_errors;

// Parses interval input ('24h', 'P1D') without raising, as check hooks must.
bool parse_interval(const char *text, Interval *out) {
  char copy[MAXDATELEN + 1];
  if (strlen(text) > MAXDATELEN)
    return false;
  strlcpy(copy, text, sizeof copy);
  char workbuf[256];
  char *fields[MAXDATEFIELDS];
  int field_types[MAXDATEFIELDS];
  int nfields = 0;
  int dtype = 0;
  struct pg_itm_in itm;
  int status = ParseDateTime(copy, workbuf, sizeof(workbuf), fields,
                             field_types, MAXDATEFIELDS, &nfields);
  if (status == 0)
    status = DecodeInterval(fields, field_types, nfields, INTERVAL_FULL_RANGE,
                            &dtype, &itm);
  if (status == DTERR_BAD_FORMAT) {
    strlcpy(copy, text, sizeof copy);
    status = DecodeISO8601Interval(copy, &dtype, &itm);
  }
  if (status != 0 || dtype != DTK_DELTA)
    return false;
  return itmin2interval(&itm, out) == 0;
}

// In microseconds, a day as `day_hours` hours and a month as `month_days` days.
long double span_usecs(const Interval &span, int day_hours, int month_days) {
  return span.time + (long double)span.day * day_hours * USECS_PER_HOUR +
         (long double)span.month * month_days * USECS_PER_DAY;
}

// As PostgreSQL orders intervals: a month is 30 days, a day 24 hours.
long double comparable_usecs(const Interval &span) {
  return span_usecs(span, HOURS_PER_DAY, DAYS_PER_MONTH);
}

bool is_zero(const Interval &span) {
  return span.month == 0 && span.day == 0 && span.time == 0;
}

// A TTL (or its maximum) has no negative part and a positive length, so a
// key expires after it was created in calendar time too: '-2 months 60 days
// 1 microsecond' is positive by the 30-day rule, yet ends before it starts
// whenever the two months before hold 61 days or more.
bool check_span(const char *name, char *text, Interval *parsed,
                long double longest_usecs = 0) {
  const char *problem = nullptr;
  if (text == nullptr || !parse_interval(text, parsed))
    problem = "%s must be an interval, such as '24h' or '7 days'.";
  else if (parsed->month < 0 || parsed->day < 0 || parsed->time < 0)
    problem = "%s must have no negative part.";
  else if (comparable_usecs(*parsed) <= 0)
    problem = "%s must be positive.";
  // A key of this TTL, claimed now, must get an expiry time within
  // timestamptz's range; a month counts as 31 days, its longest.
  else if (GetCurrentTimestamp() + span_usecs(*parsed, HOURS_PER_DAY, 31) >=
           END_TIMESTAMP)
    problem = "%s puts expiry times past the end of timestamptz's range.";
  else if (longest_usecs > 0 && comparable_usecs(*parsed) > longest_usecs)
    problem = "%s must be at most 365 days.";
  if (problem != nullptr)
    GUC_check_errdetail(problem, name);
  return problem == nullptr;
}

// Hands the parsed value to the assign hook in GUC's memory: GUC frees extra
// itself (with guc_free from PostgreSQL 16 on).
template <typename Parsed>
bool keep_parsed(const Parsed &parsed, void **extra) {
  auto *copy = static_cast<Parsed *>(compat::guc_malloc(LOG, sizeof(Parsed)));
  if (copy == nullptr)
    return false;
  *copy = parsed;
  *extra = copy;
  return true;
}

template <CallSetting &setting> void assign_int(int, void *) {
  setting.refused = false;
}

bool ttl_valid(char **newval, void **extra, GucSource source) {
  Interval parsed;
  if (!check_span("idempotency.ttl", *newval, &parsed))
    return false;
  // The built-in default is never refused (that would fail loading the
  // library when max_ttl is under 24h): keys of it are cut to max_ttl.
  if (source != PGC_S_DEFAULT &&
      comparable_usecs(parsed) > comparable_usecs(max_ttl_value)) {
    GUC_check_errdetail("idempotency.ttl must not exceed idempotency.max_ttl "
                        "(%s).",
                        max_ttl_text);
    return false;
  }
  return keep_parsed(parsed, extra);
}

// Keys get idempotency.ttl, or idempotency.max_ttl if a superuser lowered it
// below a ttl set earlier (a ttl above it is refused when set).
template <CallSetting &setting, Interval *value>
void assign_ttl(const char *, void *extra) {
  *value = *static_cast<Interval *>(extra);
  key_ttl_value = comparable_usecs(ttl_value) <= comparable_usecs(max_ttl_value)
                      ? ttl_value
                      : max_ttl_value;
  setting.refused = false;
}

bool max_ttl_valid(char **newval, void **extra, GucSource) {
  Interval parsed;
  return check_span("idempotency.max_ttl", *newval, &parsed) &&
         keep_parsed(parsed, extra);
}

// 0 (tombstones off), or a span as check_span() wants one, at most a year
// as intervals compare.
bool remember_valid(char **newval, void **extra, GucSource) {
  Interval parsed;
  if (*newval != nullptr && parse_interval(*newval, &parsed) && is_zero(parsed))
    return keep_parsed(parsed, extra);
  return check_span("idempotency.remember", *newval, &parsed,
                    365.0L * USECS_PER_DAY) &&
         keep_parsed(parsed, extra);
}

void assign_remember(const char *, void *extra) {
  remember_value = *static_cast<Interval *>(extra);
  remember_state.refused = false;
}

// By SqlstateListCheck, after ok.
constexpr const char *sqlstate_list_problems[] = {
    "is not a SQLSTATE (5 characters) or a class (2 characters)",
    "is one entry too many",
    "names a class of success, warning or no-data conditions, not of errors",
    "names a transient condition (a cancel, timeout, serialization failure, "
    "deadlock, resource shortage or internal error) that a retry may not meet "
    "again"};
static_assert(lengthof(sqlstate_list_problems) ==
              static_cast<size_t>(SqlstateListCheck::transient));

bool store_errors_valid(char **newval, void **extra, GucSource) {
  SqlstateList parsed;
  const char *text = *newval == nullptr ? "" : *newval;
  SqlstateListResult result = parse_sqlstate_list(text, parsed);
  if (result.check != SqlstateListCheck::ok) {
    GUC_check_errdetail(
        "idempotency.store_errors entry \"%.*s\" %s; the setting is a "
        "comma-separated list of SQLSTATEs (P0001) and classes (23), at most "
        "%d entries.",
        (int)result.entry_size, text + result.entry_start,
        sqlstate_list_problems[static_cast<int>(result.check) - 1],
        SqlstateList::capacity);
    return false;
  }
  return keep_parsed(parsed, extra);
}

void assign_store_errors(const char *, void *extra) {
  stored_errors_value = static_cast<const SqlstateList *>(extra);
  store_errors_state.refused = false;
}

TimestampTz plus_interval(TimestampTz start, const Interval &span) {
  return DatumGetTimestampTz(
      DirectFunctionCall2(timestamptz_pl_interval, TimestampTzGetDatum(start),
                          IntervalPGetDatum(const_cast<Interval *>(&span))));
}

} // namespace

void define() {
  for (CallSetting *setting : call_settings) {
    // NULL (15) or "" (16 on) for a placeholder nothing set.
    const char *text = GetConfigOption(setting->name, true, false);
    setting->placeholder = text == nullptr || *text == '\0'
                               ? nullptr
                               : MemoryContextStrdup(TopMemoryContext, text);
  }
  defining = true;
  DefineCustomIntVariable(
      "idempotency.expire_interval",
      "Time the expiry worker sleeps between rounds.",
      "Each round deletes the expired keys of every database where the "
      "extension is installed. 0 turns the worker off.",
      &interval_seconds, 60, 0, INT_MAX, PGC_SIGHUP, GUC_UNIT_S, nullptr,
      nullptr, nullptr);

  DefineCustomIntVariable(
      "idempotency.expire_batch_size",
      "Expired keys examined per batch; the worker commits each batch.",
      "Smaller batches hold fewer row locks for less time; larger ones "
      "finish a backlog with fewer transactions.",
      // At most 100000: a batch is one transaction that keeps its keys
      // locked until it commits, and must stay short whatever is configured.
      &batch_size, 1000, 1, 100000, PGC_SUSET, 0, nullptr, nullptr, nullptr);

  DefineCustomIntVariable(
      "idempotency.expire_rate",
      "Expired keys per second the expiry worker deletes at most.",
      "After each batch the worker sleeps as long as it takes for the "
      "round's average to stay at or under this rate, leaving CPU and I/O "
      "to callers while a large backlog is deleted; 0 deletes flat out.",
      // 100000 leaves callers most of a core and still deletes keys many
      // times faster than they add them (docs/benchmark.md#expiry).
      &rate, 100000, 0, INT_MAX, PGC_SUSET, 0, nullptr, nullptr, nullptr);

  // Like PostgreSQL's own debug_* settings: for superusers, left out of
  // postgresql.conf.sample, no use in production.
  DefineCustomIntVariable(
      "idempotency.debug_statement_hash_bits",
      "Bits of a fn statement's hash the backend's statement caches key it "
      "by.",
      "A developer setting that makes different fn statements share a hash "
      "(0: all of them), to test that the caches still tell them apart by "
      "text and argument types. 64, the default, keeps the whole hash.",
      &statement_hash_bits, 64, 0, 64, PGC_SUSET, GUC_NOT_IN_SAMPLE, nullptr,
      assign_statement_hash_bits, nullptr);

  // Defined before idempotency.ttl, whose check compares with it.
  DefineCustomStringVariable(
      "idempotency.max_ttl", "The longest idempotency.ttl any role may set.",
      "SET, ALTER ROLE ... SET and ALTER DATABASE ... SET refuse a longer "
      "idempotency.ttl; a ttl set before this was lowered is cut to it.",
      &max_ttl_text, "30 days", PGC_SUSET, 0,
      check<max_ttl_state, max_ttl_valid>,
      assign_ttl<max_ttl_state, &max_ttl_value>, nullptr);

  DefineCustomStringVariable(
      "idempotency.ttl",
      "How long a processed idempotency key is kept and replayed.",
      "The value in force when a key is claimed is that key's TTL; "
      "a key past its TTL is treated as absent.",
      &ttl_text, "24h", PGC_USERSET, 0, check<ttl_state, ttl_valid>,
      assign_ttl<ttl_state, &ttl_value>, nullptr);

  DefineCustomStringVariable(
      "idempotency.remember",
      "How long a key is remembered after its response expired.",
      "Within this span a retry of the same request gets IK410 instead of "
      "running again, another request with the key IK422; 0 turns "
      "tombstones off. At most 365 days.",
      &remember_text, "7 days", PGC_SUSET, 0,
      check<remember_state, remember_valid>, assign_remember, nullptr);

  DefineCustomIntVariable(
      "idempotency.wait_timeout",
      "How long a call waits for another transaction holding the same key.",
      "0 answers IK409 at once; otherwise the call waits up to this long, "
      "then replays the finished response, or runs fn if the holder rolled "
      "back.",
      &wait_timeout, 0, 0, INT_MAX, PGC_USERSET, GUC_UNIT_MS, nullptr,
      assign_int<wait_timeout_state>, nullptr);

  DefineCustomIntVariable(
      "idempotency.max_response_size",
      "The largest response stored, by idempotent_call or complete().",
      "A larger response is an error, and nothing is stored. "
      "Measured as the response's jsonb size before compression.",
      &max_response_size, 10 * 1024 * 1024, 0, INT_MAX, PGC_SUSET,
      GUC_UNIT_BYTE, nullptr, assign_int<max_response_size_state>, nullptr);

  DefineCustomStringVariable(
      "idempotency.store_errors",
      "SQLSTATEs and classes of fn errors that are stored as the outcome.",
      "A comma-separated list such as 'P0001, 23'. When not empty, fn runs in "
      "a subtransaction; an error it raises with a listed SQLSTATE undoes "
      "fn's effects and is stored and returned as {\"error\": {...}}; "
      "retries get the same document.",
      &store_errors_text, "", PGC_USERSET, GUC_LIST_INPUT,
      check<store_errors_state, store_errors_valid>, assign_store_errors,
      nullptr);
  defining = false;
  // A placeholder its setting did not take, for a reason its check hook did
  // not see.
  for (CallSetting *setting : call_settings) {
    if (setting->placeholder == nullptr)
      continue;
    if (!setting->refused && !holds(*setting, setting->placeholder))
      keep_refused(*setting, setting->placeholder, false, PGC_S_SESSION);
    pfree(setting->placeholder);
    setting->placeholder = nullptr;
  }
}

const Interval &ttl() {
  raise_if_value_refused();
  return key_ttl_value;
}

TimestampTz key_expiry(TimestampTz created_at, const Interval &ttl) {
  raise_if_value_refused();
  return Min(plus_interval(created_at, ttl),
             plus_interval(created_at, max_ttl_value));
}

bool remember_keys() {
  raise_if_refused(remember_state);
  return !is_zero(remember_value);
}

const Interval &remember() {
  raise_if_refused(remember_state);
  return remember_value;
}

TimestampTz forgotten_at(TimestampTz response_expired_at) {
  raise_if_refused(remember_state);
  return plus_interval(response_expired_at, remember_value);
}

int64 remember_usecs(TimestampTz expires_at, const Interval &remember) {
  if (is_zero(remember) || TIMESTAMP_NOT_FINITE(expires_at))
    return 0;
  // A month is at most 31 days, a day 25 hours.
  if ((long double)expires_at + span_usecs(remember, 25, 31) >=
      (long double)END_TIMESTAMP)
    return END_TIMESTAMP - 1 - expires_at;
  return plus_interval(expires_at, remember) - expires_at;
}

int wait_timeout_ms() {
  raise_if_value_refused();
  return wait_timeout;
}

Size max_response_bytes() {
  raise_if_value_refused();
  return (Size)max_response_size;
}

const SqlstateList &stored_errors() {
  raise_if_value_refused();
  return *stored_errors_value;
}

int expire_interval_seconds() { return interval_seconds; }

int expire_batch_size() { return batch_size; }

int expire_rate() { return rate; }

} // namespace idempotency::settings
