"""The clients scenario from psycopg2 (see test/clients/run): %s
placeholders, Python values as psycopg2 adapts them (it interpolates them
into the SQL on the client); the prepared statement is SQL PREPARE with
untyped parameters."""
import json
import os
import time
import uuid
from datetime import datetime, timezone
from decimal import Decimal

import psycopg2
from psycopg2.extras import Json

env = os.environ
prefix = f"{env['CLIENTS_RUN']}-{env['CLIENTS_CONFIG']}-"
account = int(env["CLIENTS_ACCOUNT"])
STAMP = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
UUID = str(uuid.UUID("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"))
DOC = Json({"a": 1, "b": [True, None]})


def result(step, field, value):
    if isinstance(value, bool):
        value = str(value).lower()
    print(f"RESULT {step} {field} {value}", flush=True)


def step(name, body):
    try:
        body()
    except psycopg2.Error as err:
        result(name, "error", f"{err.pgcode} {err}".replace("\n", " "))


# docs:begin psycopg2
class Busy(Exception):
    """IK409: another transaction holds the key; retry later with the same key."""


class KeyReused(Exception):
    """IK422: the key was used for another request; a new request needs a new key."""


CALL_WITHDRAW = (
    "SELECT idempotency.idempotent_call(%s, NULL, 'SELECT withdraw($1, $2)', %s, %s)::text,"
    "       idempotency.last_call_replayed()")


def withdraw(conn, key, account, amount):
    try:
        with conn, conn.cursor() as cur:  # one transaction: commits, or rolls back on error
            cur.execute(CALL_WITHDRAW, (key, account, amount))
            return cur.fetchone()  # ('{"account": 7, "balance": 9700}', False)
    except psycopg2.Error as err:
        if err.pgcode == "IK409":
            raise Busy(key) from err  # 409: retry later with the same key
        if err.pgcode == "IK422":
            raise KeyReused(key) from err  # 422: a new request needs a new key
        raise
# docs:end psycopg2


CALL_TYPES = (
    "SELECT idempotency.idempotent_call(%s, NULL, 'SELECT record_types($1, $2, $3, $4, $5, $6)',"
    "                                   %s, %s, %s, %s, %s, %s)::text,"
    "       idempotency.last_call_replayed()")


def fetch(conn, text, values=None):
    with conn, conn.cursor() as cur:
        cur.execute(text, values)
        return cur.fetchone()


def report_call(name, conn, text, values):
    def body():
        response, replayed = fetch(conn, text, values)
        result(name, "response", response)
        result(name, "replayed", replayed)
    step(name, body)


def main():
    conn = psycopg2.connect("")
    other = psycopg2.connect("application_name=clients-holder")

    first = prefix + "first"
    for name in ("first", "retry"):
        def call(name=name):
            try:
                response, replayed = withdraw(conn, first, account + 1, 300)
            except (Busy, KeyReused) as err:
                raise err.__cause__
            result(name, "response", response)
            result(name, "replayed", replayed)
        step(name, call)

    def conflict():
        try:
            fetch(conn, CALL_WITHDRAW, (first, account + 1, 301))
        except psycopg2.Error as err:
            result("conflict", "sqlstate", err.pgcode)
    step("conflict", conflict)

    def busy():
        key = prefix + "busy"
        with other, other.cursor() as holder:  # holds the key until the block ends
            holder.execute(CALL_WITHDRAW, (key, account + 2, 100))
            started = time.monotonic()
            try:
                fetch(conn, CALL_WITHDRAW, (key, account + 2, 100))
            except psycopg2.Error as err:
                result("busy", "sqlstate", err.pgcode)
            result("busy", "elapsed_ms", int((time.monotonic() - started) * 1000))
        report_call("busy_after", conn, CALL_WITHDRAW, (key, account + 2, 100))
    step("busy", busy)

    def handler():
        key = prefix + "handler"
        with conn, conn.cursor() as cur:
            cur.execute("SELECT replayed FROM idempotency.claim(%s, %s)", (key, "hash-1"))
            result("handler_claim", "replayed", cur.fetchone()[0])
            cur.execute("SELECT withdraw(%s, %s)", (account + 3, 50))
            work = cur.fetchone()[0]
            result("handler_work", "response", json.dumps(work))
            cur.execute("SELECT idempotency.complete(%s, %s)", (key, Json(work)))
        replayed, response = fetch(conn, "SELECT replayed, response::text FROM idempotency.claim(%s, %s)", (key, "hash-1"))
        result("handler_again", "replayed", replayed)
        result("handler_again", "response", response)
    step("handler", handler)

    def release():
        key = prefix + "release"
        with conn, conn.cursor() as cur:
            cur.execute("SELECT replayed FROM idempotency.claim(%s, %s)", (key, None))
            cur.execute("SELECT idempotency.release(%s)", (key,))
        state, = fetch(conn, "SELECT state FROM idempotency.lookup(%s)", (key,))
        result("release_lookup", "state", state)
        with conn.cursor() as cur:
            cur.execute("SELECT replayed FROM idempotency.claim(%s, %s)", (key, None))
            replayed, = cur.fetchone()
        conn.rollback()
        result("release_again", "replayed", replayed)
    step("release", release)

    key = prefix + "types"
    for name in ("types", "types_retry"):
        report_call(name, conn, CALL_TYPES, (key, key, True, STAMP, UUID, DOC, Decimal("12.50")))
    key = prefix + "types-null"
    for name in ("types_null", "types_null_retry"):
        report_call(name, conn, CALL_TYPES, (key, key, None, None, None, None, None))

    for name, mode, acc in (("prepared", "auto", account + 4), ("prepared_generic", "force_generic_plan", account + 5)):
        def prepared(name=name, mode=mode, acc=acc):
            with conn, conn.cursor() as cur:
                cur.execute(f"SET plan_cache_mode = {mode}")
                cur.execute(f"PREPARE {name} AS SELECT idempotency.idempotent_call($1, NULL, 'SELECT withdraw($1, $2)', $2, $3)::text")
            for run in ("run", "retry"):
                for i in range(20):
                    response, = fetch(conn, f"EXECUTE {name}(%s, %s, %s)", (f"{prefix}{name}-{i}", acc, i + 1))
                    result(f"{name}.{run}.{i}", "response", response)
            with conn, conn.cursor() as cur:
                cur.execute("RESET plan_cache_mode")
        step(name, prepared)

    report_call("cross", conn, CALL_WITHDRAW, (env["CLIENTS_CROSS_KEY"], int(env["CLIENTS_CROSS_ACCOUNT"]), 250))
    report_call("cross_types", conn, CALL_TYPES,
                (env["CLIENTS_CROSS_KEY"] + "-types", env["CLIENTS_CROSS_TAG"], True, STAMP, UUID, DOC, Decimal("12.50")))
    other.close()
    conn.close()


main()
