"""The clients scenario from psycopg 3 (see test/clients/run): bare
placeholders, Python values as psycopg adapts them.

    python3 psycopg_scenario.py %s|%b
"""
import json
import os
import sys
import time
import uuid
from datetime import datetime, timezone
from decimal import Decimal

import psycopg
from psycopg.types.json import Jsonb

P = sys.argv[1]  # %s: psycopg picks text or binary per value; %b: binary
env = os.environ
prefix = f"{env['CLIENTS_RUN']}-{env['CLIENTS_CONFIG']}-"
account = int(env["CLIENTS_ACCOUNT"])
STAMP = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
UUID = uuid.UUID("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11")
DOC = Jsonb({"a": 1, "b": [True, None]})


def result(step, field, value):
    if isinstance(value, bool):
        value = str(value).lower()
    print(f"RESULT {step} {field} {value}", flush=True)


def step(name, body):
    try:
        body()
    except psycopg.Error as err:
        result(name, "error", f"{err.sqlstate} {err}".replace("\n", " "))


# docs:begin psycopg
class Busy(Exception):
    """IK409: another transaction holds the key; retry later with the same key."""


class KeyReused(Exception):
    """IK422: the key was used for another request; a new request needs a new key."""


CALL_WITHDRAW = (
    "SELECT idempotency.idempotent_call(%s, NULL, 'SELECT withdraw($1, $2)', %s, %s)::text,"
    "       idempotency.last_call_replayed()")


def withdraw(conn, key, account, amount):
    try:
        response, replayed = conn.execute(CALL_WITHDRAW, (key, account, amount)).fetchone()
        return response, replayed  # '{"account": 7, "balance": 9700}', False
    except psycopg.Error as err:
        if err.sqlstate == "IK409":
            raise Busy(key) from err  # 409: retry later with the same key
        if err.sqlstate == "IK422":
            raise KeyReused(key) from err  # 422: a new request needs a new key
        raise
# docs:end psycopg


# The same statements with %b where the configuration asks for binary.
def sql(text):
    return text.replace("%s", P)


CALL_WITHDRAW = sql(CALL_WITHDRAW)
CALL_TYPES = sql(
    "SELECT idempotency.idempotent_call(%s, NULL, 'SELECT record_types($1, $2, $3, $4, $5, $6)',"
    "                                   %s, %s, %s, %s, %s, %s)::text,"
    "       idempotency.last_call_replayed()")


def report_call(name, conn, text, values):
    def body():
        response, replayed = conn.execute(text, values).fetchone()
        result(name, "response", response)
        result(name, "replayed", replayed)
    step(name, body)


def main():
    conn = psycopg.connect(autocommit=True)
    other = psycopg.connect(autocommit=True, application_name="clients-holder")

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
            conn.execute(CALL_WITHDRAW, (first, account + 1, 301))
        except psycopg.Error as err:
            result("conflict", "sqlstate", err.sqlstate)
    step("conflict", conflict)

    def busy():
        key = prefix + "busy"
        with other.transaction():
            other.execute(CALL_WITHDRAW, (key, account + 2, 100))
            started = time.monotonic()
            try:
                conn.execute(CALL_WITHDRAW, (key, account + 2, 100))
            except psycopg.Error as err:
                result("busy", "sqlstate", err.sqlstate)
            result("busy", "elapsed_ms", int((time.monotonic() - started) * 1000))
        report_call("busy_after", conn, CALL_WITHDRAW, (key, account + 2, 100))
    step("busy", busy)

    def handler():
        key = prefix + "handler"
        with conn.transaction():
            replayed, = conn.execute(sql("SELECT replayed FROM idempotency.claim(%s, %s)"), (key, "hash-1")).fetchone()
            result("handler_claim", "replayed", replayed)
            work, = conn.execute(sql("SELECT withdraw(%s, %s)"), (account + 3, 50)).fetchone()
            result("handler_work", "response", json.dumps(work))
            conn.execute(sql("SELECT idempotency.complete(%s, %s)"), (key, Jsonb(work)))
        with conn.transaction():
            replayed, response = conn.execute(
                sql("SELECT replayed, response::text FROM idempotency.claim(%s, %s)"), (key, "hash-1")).fetchone()
        result("handler_again", "replayed", replayed)
        result("handler_again", "response", response)
    step("handler", handler)

    def release():
        key = prefix + "release"
        with conn.transaction():
            conn.execute(sql("SELECT replayed FROM idempotency.claim(%s, %s)"), (key, None))
            conn.execute(sql("SELECT idempotency.release(%s)"), (key,))
        state, = conn.execute(sql("SELECT state FROM idempotency.lookup(%s)"), (key,)).fetchone()
        result("release_lookup", "state", state)
        with conn.transaction(force_rollback=True):
            replayed, = conn.execute(sql("SELECT replayed FROM idempotency.claim(%s, %s)"), (key, None)).fetchone()
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
            conn.execute(f"SET plan_cache_mode = {mode}")
            for run in ("run", "retry"):
                for i in range(20):
                    response, _ = conn.execute(CALL_WITHDRAW, (f"{prefix}{name}-{i}", acc, i + 1), prepare=True).fetchone()
                    result(f"{name}.{run}.{i}", "response", response)
            conn.execute("RESET plan_cache_mode")
        step(name, prepared)

    report_call("cross", conn, CALL_WITHDRAW, (env["CLIENTS_CROSS_KEY"], int(env["CLIENTS_CROSS_ACCOUNT"]), 250))
    report_call("cross_types", conn, CALL_TYPES,
                (env["CLIENTS_CROSS_KEY"] + "-types", env["CLIENTS_CROSS_TAG"], True, STAMP, UUID, DOC, Decimal("12.50")))
    other.close()
    conn.close()


main()
