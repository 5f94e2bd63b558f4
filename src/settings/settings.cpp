// The extension's configuration parameters: the call's (idempotency.ttl,
// idempotency.wait_timeout) and the expiry worker's (idempotency.expire_*).
#include "settings/settings.hpp"

namespace idempotency::settings {

// The expiry worker's settings (idempotency.expire_*).
namespace {

constexpr int default_interval_seconds = 60;
constexpr int default_batch_size = 1000;
// A batch is one transaction; its keys stay locked until it commits, so it
// must stay short whatever is configured.
constexpr int max_batch_size = 100000;

int interval_seconds = default_interval_seconds;
int batch_size = default_batch_size;
// Flat out, the worker takes a whole core from the callers; 5 ms after each
// batch of 1000 still deletes over 100k keys a second (see docs/expiry.md).
int batch_delay_ms = 5;

void define_expiry_settings() {
  DefineCustomIntVariable(
      "idempotency.expire_interval",
      "Time the expiry worker sleeps between rounds.",
      "Each round deletes the expired keys of every database where the "
      "extension is installed. 0 turns the worker off.",
      &interval_seconds, default_interval_seconds, 0, INT_MAX, PGC_SIGHUP,
      GUC_UNIT_S, nullptr, nullptr, nullptr);

  DefineCustomIntVariable(
      "idempotency.expire_batch_size",
      "Expired keys examined per batch; the worker commits each batch.",
      "Smaller batches hold fewer row locks for less time; larger ones "
      "finish a backlog with fewer transactions.",
      &batch_size, default_batch_size, 1, max_batch_size, PGC_SUSET, 0, nullptr,
      nullptr, nullptr);

  DefineCustomIntVariable(
      "idempotency.expire_batch_delay",
      "Pause of the expiry worker after each batch.",
      "Spreads the deletion of a large backlog over time, leaving CPU and "
      "I/O to callers; 0 goes on at once.",
      &batch_delay_ms, 5, 0, 10000, PGC_SUSET, GUC_UNIT_MS, nullptr, nullptr,
      nullptr);
}

} // namespace

int expire_interval_seconds() { return interval_seconds; }

int expire_batch_size() { return batch_size; }

int expire_batch_delay_ms() { return batch_delay_ms; }

// The call's settings (idempotency.ttl, idempotency.wait_timeout).
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
  define_expiry_settings();
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
