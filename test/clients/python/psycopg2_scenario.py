"""The clients scenario from psycopg2 (see test/clients/run): %s
placeholders, Python values as psycopg2 adapts them (it interpolates them
into the SQL on the client); the prepared statement is SQL PREPARE with
untyped parameters. The steps are dbapi_scenario's."""
from contextlib import contextmanager

import psycopg2
from psycopg2.extras import Json

import dbapi_scenario


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


def fetch(conn, text, values=None):
    with conn, conn.cursor() as cur:  # one transaction: commits, or rolls back on error
        cur.execute(text, values)
        return cur.fetchone()


def executor(cur):
    def execute(text, values, every_row=False):
        cur.execute(text, values)
        return (cur.fetchall() if every_row else cur.fetchone()) if cur.description else None
    return execute


class Psycopg2(dbapi_scenario.Driver):
    Error = psycopg2.Error

    def connect(self, application_name=None):
        return psycopg2.connect(f"application_name={application_name}" if application_name else "")

    def sqlstate(self, err):
        return err.pgcode

    def call(self, conn, text, values):
        return fetch(conn, text, values)

    @contextmanager
    def transaction(self, conn):
        with conn, conn.cursor() as cur:
            yield executor(cur)

    @contextmanager
    def rolled_back(self, conn):
        with conn.cursor() as cur:
            yield executor(cur)
        conn.rollback()

    def prepare(self, conn, name, mode):
        with conn, conn.cursor() as cur:
            cur.execute(f"SET plan_cache_mode = {mode}")
            cur.execute(f"PREPARE {name} AS SELECT idempotency.idempotent_call($1, NULL, 'SELECT withdraw($1, $2)', $2, $3)::text")
        return lambda key, account, amount: fetch(conn, f"EXECUTE {name}(%s, %s, %s)", (key, account, amount))[0]

    def unprepare(self, conn):
        with conn, conn.cursor() as cur:
            cur.execute("RESET plan_cache_mode")

    def jsonb(self, value):
        return Json(value)


dbapi_scenario.run(Psycopg2(withdraw, CALL_WITHDRAW, (Busy, KeyReused)))
