// The clients scenario from libpq in C++ (see test/clients/run): bare
// placeholders, every value sent as text with no type (paramTypes NULL),
// as PQexecParams callers usually do.
#include <libpq-fe.h>

#include <chrono>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

namespace {

const std::string prefix = std::string(std::getenv("CLIENTS_RUN")) + "-" +
                           std::getenv("CLIENTS_CONFIG") + "-";
const int account = std::atoi(std::getenv("CLIENTS_ACCOUNT"));
const char *const stamp = "2026-01-02 03:04:05+00";
const char *const uuid = "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11";
const char *const doc = R"({"a": 1, "b": [true, null]})";

void result(const std::string &step, const std::string &field,
            const std::string &value) {
  std::cout << "RESULT " << step << ' ' << field << ' ' << value << std::endl;
}

bool ok(const PGresult *res) {
  return PQresultStatus(res) == PGRES_TUPLES_OK ||
         PQresultStatus(res) == PGRES_COMMAND_OK;
}

// docs:begin libpq
using Result = std::unique_ptr<PGresult, decltype(&PQclear)>;

// A parameter's text, or NULL.
struct Value {
  std::string text;
  bool null = false;
};
const Value null_value{"", true};

const char *const call_withdraw =
    "SELECT idempotency.idempotent_call($1, NULL, 'SELECT withdraw($1, $2)',"
    "                                   $2, $3)::text,"
    "       idempotency.last_call_replayed()";

// Runs one call; values as text, their types left to the server.
Result call(PGconn *conn, const char *sql, const std::vector<Value> &values) {
  std::vector<const char *> params;
  for (const Value &value : values)
    params.push_back(value.null ? nullptr : value.text.c_str());
  return Result(PQexecParams(conn, sql, static_cast<int>(params.size()),
                             nullptr /* paramTypes */, params.data(), nullptr,
                             nullptr, 0),
                &PQclear);
}

// A failed call's SQLSTATE: "IK409" (busy: retry later with the same key)
// or "IK422" (the key was used for another request).
std::string sqlstate(const PGresult *res) {
  const char *state = PQresultErrorField(res, PG_DIAG_SQLSTATE);
  return state ? state : "";
}
// docs:end libpq

const char *const call_types =
    "SELECT idempotency.idempotent_call($1, NULL,"
    "           'SELECT record_types($1, $2, $3, $4, $5, $6)',"
    "           $2, $3, $4, $5, $6, $7)::text,"
    "       idempotency.last_call_replayed()";

std::string replayed_text(const PGresult *res, int column) {
  return std::string(PQgetvalue(res, 0, column)) == "t" ? "true" : "false";
}

bool report_error(const std::string &step, const PGresult *res) {
  if (ok(res))
    return false;
  std::string message = PQresultErrorMessage(res);
  for (char &c : message)
    if (c == '\n')
      c = ' ';
  result(step, "error", sqlstate(res) + " " + message);
  return true;
}

void report_call(const std::string &step, PGconn *conn, const char *sql,
                 const std::vector<Value> &values) {
  Result res = call(conn, sql, values);
  if (report_error(step, res.get()))
    return;
  result(step, "response", PQgetvalue(res.get(), 0, 0));
  result(step, "replayed", replayed_text(res.get(), 1));
}

void exec(PGconn *conn, const char *sql) {
  Result res(PQexec(conn, sql), &PQclear);
  if (!ok(res.get()))
    std::cerr << sql << ": " << PQresultErrorMessage(res.get());
}

Value number(long n) { return Value{std::to_string(n)}; }

void prepared(PGconn *conn, const std::string &step, const char *mode,
              int acc) {
  exec(conn, (std::string("SET plan_cache_mode = ") + mode).c_str());
  Result prepare(PQprepare(conn, step.c_str(),
                           "SELECT idempotency.idempotent_call($1, NULL, "
                           "'SELECT withdraw($1, $2)', $2, $3)::text",
                           3, nullptr),
                 &PQclear);
  if (report_error(step, prepare.get()))
    return;
  for (const char *run : {"run", "retry"}) {
    for (int i = 0; i < 20; i++) {
      std::string key = prefix + step + "-" + std::to_string(i),
                  acc_text = std::to_string(acc),
                  amount = std::to_string(i + 1);
      const char *params[] = {key.c_str(), acc_text.c_str(), amount.c_str()};
      Result res(
          PQexecPrepared(conn, step.c_str(), 3, params, nullptr, nullptr, 0),
          &PQclear);
      std::string name = step + "." + run + "." + std::to_string(i);
      if (report_error(name, res.get()))
        continue;
      result(name, "response", PQgetvalue(res.get(), 0, 0));
    }
  }
  exec(conn, "RESET plan_cache_mode");
}

// An array literal of values, for a text[] or jsonb[] parameter: libpq has
// no array type, so each element is double-quoted (with \ before " and \)
// and a NULL element is the bare word NULL.
Value array_literal(const std::vector<Value> &values) {
  std::string text = "{";
  for (const Value &value : values) {
    if (text.size() > 1)
      text += ',';
    if (value.null) {
      text += "NULL";
      continue;
    }
    text += '"';
    for (char c : value.text) {
      if (c == '"' || c == '\\')
        text += '\\';
      text += c;
    }
    text += '"';
  }
  return Value{text + "}"};
}

} // namespace

int main() {
  PGconn *conn = PQconnectdb("application_name=clients");
  PGconn *other = PQconnectdb("application_name=clients-holder");
  if (PQstatus(conn) != CONNECTION_OK || PQstatus(other) != CONNECTION_OK) {
    std::cerr << PQerrorMessage(conn) << PQerrorMessage(other);
    return 1;
  }

  const std::string first = prefix + "first";
  report_call("first", conn, call_withdraw,
              {{first}, number(account + 1), number(300)});
  report_call("retry", conn, call_withdraw,
              {{first}, number(account + 1), number(300)});
  {
    Result res =
        call(conn, call_withdraw, {{first}, number(account + 1), number(301)});
    result("conflict", "sqlstate", sqlstate(res.get()));
  }

  {
    const std::string key = prefix + "busy";
    exec(other, "BEGIN");
    Result held =
        call(other, call_withdraw, {{key}, number(account + 2), number(100)});
    if (!report_error("busy", held.get())) {
      auto started = std::chrono::steady_clock::now();
      Result res =
          call(conn, call_withdraw, {{key}, number(account + 2), number(100)});
      auto elapsed = std::chrono::duration_cast<std::chrono::milliseconds>(
          std::chrono::steady_clock::now() - started);
      result("busy", "sqlstate", sqlstate(res.get()));
      result("busy", "elapsed_ms", std::to_string(elapsed.count()));
    }
    exec(other, "COMMIT");
    report_call("busy_after", conn, call_withdraw,
                {{key}, number(account + 2), number(100)});
  }

  {
    const std::string key = prefix + "handler";
    exec(conn, "BEGIN");
    Result claim = call(conn, "SELECT replayed FROM idempotency.claim($1, $2)",
                        {{key}, {"hash-1"}});
    if (!report_error("handler_claim", claim.get()))
      result("handler_claim", "replayed", replayed_text(claim.get(), 0));
    Result work = call(conn, "SELECT withdraw($1, $2)::text",
                       {number(account + 3), number(50)});
    if (!report_error("handler_work", work.get())) {
      std::string response = PQgetvalue(work.get(), 0, 0);
      result("handler_work", "response", response);
      Result complete = call(conn, "SELECT idempotency.complete($1, $2)",
                             {{key}, {response}});
      report_error("handler_complete", complete.get());
    }
    exec(conn, "COMMIT");
    exec(conn, "BEGIN");
    Result again = call(
        conn, "SELECT replayed, response::text FROM idempotency.claim($1, $2)",
        {{key}, {"hash-1"}});
    exec(conn, "COMMIT");
    if (!report_error("handler_again", again.get())) {
      result("handler_again", "replayed", replayed_text(again.get(), 0));
      result("handler_again", "response", PQgetvalue(again.get(), 0, 1));
    }
  }

  {
    const std::string key = prefix + "release";
    exec(conn, "BEGIN");
    Result claim = call(conn, "SELECT replayed FROM idempotency.claim($1, $2)",
                        {{key}, null_value});
    Result release = call(conn, "SELECT idempotency.release($1)", {{key}});
    exec(conn, "COMMIT");
    Result lookup =
        call(conn, "SELECT state FROM idempotency.lookup($1)", {{key}});
    if (!report_error("release_lookup", lookup.get()))
      result("release_lookup", "state", PQgetvalue(lookup.get(), 0, 0));
    exec(conn, "BEGIN");
    Result again = call(conn, "SELECT replayed FROM idempotency.claim($1, $2)",
                        {{key}, null_value});
    exec(conn, "ROLLBACK");
    if (!report_error("release_again", again.get()))
      result("release_again", "replayed", replayed_text(again.get(), 0));
  }

  // Three keys, the second with a NULL request hash, in one transaction:
  // withdraw for each claimed key, the answers as a jsonb[] literal. Then
  // the batch again with the first key repeated under another hash.
  {
    std::vector<Value> keys, hashes{{"hash-0"}, null_value, {"hash-2"}};
    for (int i = 0; i < 3; i++)
      keys.push_back({prefix + "batch-" + std::to_string(i)});
    exec(conn, "BEGIN");
    Result claims = call(conn,
                         "SELECT outcome FROM idempotency.claim_batch($1, $2)"
                         " ORDER BY ordinality",
                         {array_literal(keys), array_literal(hashes)});
    if (!report_error("batch", claims.get())) {
      std::vector<Value> claimed, responses;
      for (int i = 0; i < PQntuples(claims.get()); i++) {
        const std::string outcome = PQgetvalue(claims.get(), i, 0);
        const std::string name = "batch." + std::to_string(i);
        result(name, "outcome", outcome);
        if (outcome != "claimed")
          continue;
        Result work = call(conn, "SELECT withdraw($1, $2)::text",
                           {number(account + 6 + i), number(10 * (i + 1))});
        if (report_error(name, work.get()))
          continue;
        result(name, "response", PQgetvalue(work.get(), 0, 0));
        claimed.push_back(keys[i]);
        responses.push_back({PQgetvalue(work.get(), 0, 0)});
      }
      Result complete =
          call(conn, "SELECT idempotency.complete_batch($1, $2)",
               {array_literal(claimed), array_literal(responses)});
      report_error("batch", complete.get());
    }
    exec(conn, "COMMIT");
    keys.push_back(keys[0]);
    hashes.push_back({"hash-0-other"});
    exec(conn, "BEGIN");
    Result again =
        call(conn,
             "SELECT outcome, sqlstate, response::text"
             " FROM idempotency.claim_batch($1, $2) ORDER BY ordinality",
             {array_literal(keys), array_literal(hashes)});
    exec(conn, "COMMIT");
    if (!report_error("batch_retry", again.get())) {
      for (int i = 0; i < PQntuples(again.get()); i++) {
        const std::string name = "batch_retry." + std::to_string(i);
        result(name, "outcome", PQgetvalue(again.get(), i, 0));
        result(name, "sqlstate", PQgetvalue(again.get(), i, 1));
        result(name, "response", PQgetvalue(again.get(), i, 2));
      }
    }
  }

  const std::string types = prefix + "types";
  for (const char *step : {"types", "types_retry"})
    report_call(
        step, conn, call_types,
        {{types}, {types}, {"true"}, {stamp}, {uuid}, {doc}, {"12.50"}});
  const std::string types_null = prefix + "types-null";
  for (const char *step : {"types_null", "types_null_retry"})
    report_call(step, conn, call_types,
                {{types_null},
                 {types_null},
                 null_value,
                 null_value,
                 null_value,
                 null_value,
                 null_value});

  prepared(conn, "prepared", "auto", account + 4);
  prepared(conn, "prepared_generic", "force_generic_plan", account + 5);

  const std::string cross_key = std::getenv("CLIENTS_CROSS_KEY");
  report_call(
      "cross", conn, call_withdraw,
      {{cross_key}, {std::getenv("CLIENTS_CROSS_ACCOUNT")}, number(250)});
  report_call("cross_types", conn, call_types,
              {{cross_key + "-types"},
               {std::getenv("CLIENTS_CROSS_TAG")},
               {"true"},
               {stamp},
               {uuid},
               {doc},
               {"12.50"}});
  PQfinish(other);
  PQfinish(conn);
  return 0;
}
