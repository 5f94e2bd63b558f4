#include "entry/settings.hpp"

namespace idempotency::settings {

namespace {

char *ttl_text = nullptr;
Interval ttl_value;
int wait_timeout = 0;
char *store_errors_text = nullptr;
SqlstateList no_stored_errors{};
const SqlstateList *stored_errors_value = &no_stored_errors;

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

const char *sqlstate_list_problem(SqlstateListCheck check) {
  switch (check) {
  case SqlstateListCheck::ok:
    break;
  case SqlstateListCheck::malformed:
    return "is not a SQLSTATE (5 characters) or a class (2 characters)";
  case SqlstateListCheck::too_many:
    return "is one entry too many";
  case SqlstateListCheck::not_an_error:
    return "names a class of success, warning or no-data conditions, not of "
           "errors";
  case SqlstateListCheck::transient:
    return "names a transient condition (a cancel, timeout, serialization "
           "failure, deadlock, resource shortage or internal error) that a "
           "retry may not meet again";
  }
  return "";
}

bool check_store_errors(char **newval, void **extra, GucSource) {
  SqlstateList parsed;
  const char *text = *newval == nullptr ? "" : *newval;
  SqlstateListResult result = parse_sqlstate_list(text, parsed);
  if (result.check != SqlstateListCheck::ok) {
    GUC_check_errdetail(
        "idempotency.store_errors entry \"%.*s\" %s; the setting is a "
        "comma-separated list of SQLSTATEs (P0001) and classes (23), at most "
        "%d entries.",
        (int)result.entry_size, text + result.entry_start,
        sqlstate_list_problem(result.check), SqlstateList::capacity);
    return false;
  }
  auto *copy = static_cast<SqlstateList *>(malloc(sizeof(SqlstateList)));
  if (copy == nullptr)
    return false;
  *copy = parsed;
  *extra = copy;
  return true;
}

void assign_store_errors(const char *, void *extra) {
  stored_errors_value = extra == nullptr
                            ? &no_stored_errors
                            : static_cast<const SqlstateList *>(extra);
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

  DefineCustomStringVariable(
      "idempotency.store_errors",
      "SQLSTATEs and classes of fn errors that are stored as the outcome.",
      "A comma-separated list such as 'P0001, 23'. When not empty, fn runs in "
      "a subtransaction; an error it raises with a listed SQLSTATE undoes "
      "fn's effects and is stored and returned as {\"error\": {...}}; "
      "retries get the same document.",
      &store_errors_text, "", PGC_USERSET, GUC_LIST_INPUT, check_store_errors,
      assign_store_errors, nullptr);
}

const Interval &ttl() { return ttl_value; }

int wait_timeout_ms() { return wait_timeout; }

const SqlstateList &stored_errors() { return *stored_errors_value; }

} // namespace idempotency::settings
