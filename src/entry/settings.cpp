#include "entry/settings.hpp"

namespace idempotency::settings {

namespace {

char *ttl_text = nullptr;
Interval ttl_value;
int wait_timeout = 0;

// Parses an interval without raising errors (check hooks must not), accepting
// what interval input accepts: '24h', '7 days', '1 day 2 hours', 'P1D'.
bool parse_interval(const char *text, Interval *out) {
  char copy[MAXDATELEN + 1];
  if (strlen(text) > MAXDATELEN)
    return false;
  strcpy(copy, text);

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
    strcpy(copy, text);
    status = DecodeISO8601Interval(copy, &dtype, &itm);
  }
  if (status != 0 || dtype != DTK_DELTA)
    return false;
  return itmin2interval(&itm, out) == 0;
}

bool interval_is_positive(const Interval &span) {
  // Compare as PostgreSQL does: a month is 30 days, a day 24 hours.
  long double total = span.time + (long double)span.day * USECS_PER_DAY +
                      (long double)span.month * DAYS_PER_MONTH * USECS_PER_DAY;
  return total > 0;
}

bool check_ttl(char **newval, void **extra, GucSource) {
  Interval parsed;
  if (*newval == nullptr || !parse_interval(*newval, &parsed)) {
    GUC_check_errdetail("idempotency.ttl must be an interval, such as '24h' "
                        "or '7 days'.");
    return false;
  }
  if (!interval_is_positive(parsed)) {
    GUC_check_errdetail("idempotency.ttl must be positive.");
    return false;
  }
  // GUC frees extra with free(); PostgreSQL 15 exports no guc_malloc.
  auto *copy = static_cast<Interval *>(malloc(sizeof(Interval)));
  if (copy == nullptr)
    return false;
  *copy = parsed;
  *extra = copy;
  return true;
}

void assign_ttl(const char *, void *extra) {
  ttl_value = *static_cast<Interval *>(extra);
}

} // namespace

void define() {
  DefineCustomStringVariable(
      "idempotency.ttl",
      "How long a processed idempotency key is kept and replayed.",
      "The value in force when a key is claimed is that key's TTL; "
      "a key past its TTL is treated as absent.",
      &ttl_text, "24h", PGC_USERSET, 0, check_ttl, assign_ttl, nullptr);

  DefineCustomIntVariable(
      "idempotency.wait_timeout",
      "How long a call waits for another transaction holding the same key.",
      "0 answers IK409 at once; otherwise the call waits up to this long, "
      "then replays the finished response, or runs fn if the holder rolled "
      "back.",
      &wait_timeout, 0, 0, INT_MAX, PGC_USERSET, GUC_UNIT_MS, nullptr, nullptr,
      nullptr);
}

const Interval &ttl() { return ttl_value; }

int wait_timeout_ms() { return wait_timeout; }

} // namespace idempotency::settings
