// withdraw: a C++17 libpq client of the payment service's database
// (examples/http/schema.sql) showing the error handling every driver needs
// around idempotency.idempotent_call:
//
//   - errors are told apart by SQLSTATE (PG_DIAG_SQLSTATE), never by message;
//   - IK409 (key in progress elsewhere), 40001 (serialization failure) and
//     40P01 (deadlock) mean "run the same transaction again", after a
//     backoff;
//   - a lost connection, even one lost during COMMIT, means "reconnect and
//     retry with the same key": the key turns a retry of a withdrawal that
//     did commit into a replay, so the outcome never has to be guessed;
//   - IK422, 22023 and 22004 are the caller's mistakes and are not retried.
//
// Usage: withdraw KEY ACCOUNT AMOUNT
// Connection settings come from the PG* environment variables (PGHOST,
// PGDATABASE, PGUSER, PGOPTIONS, ...). On success prints one JSON line:
//   {"replayed": false, "attempts": 1, "response": {...}}
// Exit status: 0 withdrawn (or replayed), 1 other error, 2 invalid key,
// 3 key already used for a different request, 4 refused by withdraw()
// (no such account, insufficient funds), 5 gave up retrying, 64 usage.

#include <libpq-fe.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <thread>

namespace {

constexpr int max_attempts = 10;
constexpr std::chrono::milliseconds first_backoff{50};
constexpr std::chrono::milliseconds max_backoff{1000};

constexpr const char *call_withdraw =
    "SELECT idempotency.idempotent_call($1, NULL, 'SELECT withdraw($1, $2)', "
    "$2::bigint, $3::bigint)";
constexpr const char *ask_replayed = "SELECT idempotency.last_call_replayed()";

enum ExitStatus {
  exit_ok = 0,
  exit_failed = 1,
  exit_invalid_key = 2,
  exit_key_reused = 3,
  exit_refused = 4,
  exit_gave_up = 5,
  exit_usage = 64,
};

// What a failed statement means for the caller.
enum class Failure {
  retry,     // run the transaction again after a backoff
  reconnect, // the connection is gone: reconnect, then retry
  invalid_key,
  key_reused,
  refused,
  other,
};

using Connection = std::unique_ptr<PGconn, decltype(&PQfinish)>;
using Result = std::unique_ptr<PGresult, decltype(&PQclear)>;

struct Request {
  const char *key;
  const char *account;
  const char *amount;
};

struct Outcome {
  bool succeeded = false;
  Failure failure = Failure::other;
  std::string sqlstate; // empty when the server sent none
  std::string message;  // for people; never inspected
  std::string response;
  bool replayed = false;
};

Failure classify_sqlstate(std::string_view sqlstate) {
  if (sqlstate == "IK409" || sqlstate == "40001" || sqlstate == "40P01")
    return Failure::retry;
  if (sqlstate == "IK422")
    return Failure::key_reused;
  if (sqlstate == "22023" || sqlstate == "22004")
    return Failure::invalid_key;
  // Raised by withdraw(): no such account, insufficient funds.
  if (sqlstate == "P0002" || sqlstate == "PY402")
    return Failure::refused;
  // Class 08 (connection exception) and 57P01 (the server ended the
  // session, e.g. pg_terminate_backend or a shutdown).
  if (sqlstate.substr(0, 2) == "08" || sqlstate == "57P01")
    return Failure::reconnect;
  return Failure::other;
}

Outcome failed(PGconn *conn, const PGresult *result) {
  Outcome outcome;
  const char *sqlstate = PQresultErrorField(result, PG_DIAG_SQLSTATE);
  const char *message = PQresultErrorField(result, PG_DIAG_MESSAGE_PRIMARY);
  outcome.sqlstate = sqlstate != nullptr ? sqlstate : "";
  outcome.message = message != nullptr ? message : PQerrorMessage(conn);
  if (PQstatus(conn) == CONNECTION_BAD)
    outcome.failure = Failure::reconnect;
  else
    outcome.failure = classify_sqlstate(outcome.sqlstate);
  return outcome;
}

Result execute(PGconn *conn, const char *sql) {
  return Result(PQexec(conn, sql), &PQclear);
}

bool has_status(const Result &result, ExecStatusType expected) {
  return PQresultStatus(result.get()) == expected;
}

// Ends a failed transaction; a broken connection is noticed by the caller.
void roll_back(PGconn *conn) {
  if (PQstatus(conn) == CONNECTION_OK &&
      PQtransactionStatus(conn) != PQTRANS_IDLE)
    execute(conn, "ROLLBACK");
}

// One try: the call, the replay flag and the commit in one transaction.
Outcome withdraw_once(PGconn *conn, const Request &request) {
  Result begin = execute(conn, "BEGIN");
  if (!has_status(begin, PGRES_COMMAND_OK))
    return failed(conn, begin.get());

  const char *params[] = {request.key, request.account, request.amount};
  Result call(PQexecParams(conn, call_withdraw, 3, nullptr, params, nullptr,
                           nullptr, 0),
              &PQclear);
  if (!has_status(call, PGRES_TUPLES_OK)) {
    Outcome outcome = failed(conn, call.get());
    roll_back(conn);
    return outcome;
  }
  Result replayed = execute(conn, ask_replayed);
  if (!has_status(replayed, PGRES_TUPLES_OK)) {
    Outcome outcome = failed(conn, replayed.get());
    roll_back(conn);
    return outcome;
  }
  Result commit = execute(conn, "COMMIT");
  if (!has_status(commit, PGRES_COMMAND_OK))
    return failed(conn, commit.get());

  Outcome outcome;
  outcome.succeeded = true;
  outcome.response = PQgetvalue(call.get(), 0, 0);
  outcome.replayed = std::string_view(PQgetvalue(replayed.get(), 0, 0)) == "t";
  return outcome;
}

// Exponential backoff with jitter, so clients that collided on a key do not
// collide again in lockstep.
std::chrono::milliseconds backoff(int attempt, std::mt19937 &random) {
  auto ceiling = std::min(max_backoff, first_backoff * (1 << (attempt - 1)));
  std::uniform_int_distribution<long> jitter(ceiling.count() / 2,
                                             ceiling.count());
  return std::chrono::milliseconds(jitter(random));
}

const char *describe(const Outcome &outcome) {
  return outcome.sqlstate.empty() ? "no SQLSTATE" : outcome.sqlstate.c_str();
}

ExitStatus exit_status_for(Failure failure) {
  switch (failure) {
  case Failure::invalid_key:
    return exit_invalid_key;
  case Failure::key_reused:
    return exit_key_reused;
  case Failure::refused:
    return exit_refused;
  case Failure::retry:
  case Failure::reconnect:
  case Failure::other:
    break;
  }
  return exit_failed;
}

Connection connect() {
  const char *keywords[] = {"fallback_application_name", nullptr};
  const char *values[] = {"idempotency-libpq-example", nullptr};
  return Connection(PQconnectdbParams(keywords, values, 0), &PQfinish);
}

int run(const Request &request) {
  Connection conn = connect();
  std::mt19937 random{std::random_device{}()};

  for (int attempt = 1; attempt <= max_attempts; ++attempt) {
    if (PQstatus(conn.get()) != CONNECTION_OK)
      PQreset(conn.get());
    Outcome outcome;
    if (PQstatus(conn.get()) == CONNECTION_OK) {
      outcome = withdraw_once(conn.get(), request);
    } else {
      outcome.failure = Failure::reconnect;
      outcome.message = PQerrorMessage(conn.get());
    }

    if (outcome.succeeded) {
      std::printf("{\"replayed\": %s, \"attempts\": %d, \"response\": %s}\n",
                  outcome.replayed ? "true" : "false", attempt,
                  outcome.response.c_str());
      return exit_ok;
    }
    if (outcome.failure != Failure::retry &&
        outcome.failure != Failure::reconnect) {
      std::fprintf(stderr, "withdraw failed: %s: %s\n", describe(outcome),
                   outcome.message.c_str());
      return exit_status_for(outcome.failure);
    }
    auto pause = backoff(attempt, random);
    std::fprintf(stderr, "attempt %d: %s (%s), %s in %ld ms\n", attempt,
                 outcome.failure == Failure::reconnect ? "connection lost"
                                                       : "retryable error",
                 describe(outcome),
                 outcome.failure == Failure::reconnect ? "reconnecting"
                                                       : "retrying",
                 static_cast<long>(pause.count()));
    std::this_thread::sleep_for(pause);
  }
  std::fprintf(stderr, "withdraw gave up after %d attempts\n", max_attempts);
  return exit_gave_up;
}

} // namespace

int main(int argc, char **argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s KEY ACCOUNT AMOUNT\n", argv[0]);
    return exit_usage;
  }
  return run(Request{argv[1], argv[2], argv[3]});
}
