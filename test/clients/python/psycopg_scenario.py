"""The clients scenario from psycopg 3 (see test/clients/run): bare
placeholders, Python values as psycopg adapts them. The steps are
dbapi_scenario's.

    python3 psycopg_scenario.py %s|%b
"""
import sys
import uuid
from contextlib import contextmanager

import psycopg
from psycopg.types.json import Jsonb

import dbapi_scenario

P = sys.argv[1]  # %s: psycopg picks text or binary per value; %b: binary


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


def executor(conn):
    def execute(text, values, every_row=False):
        cur = conn.execute(sql(text), values)
        return (cur.fetchall() if every_row else cur.fetchone()) if cur.description else None
    return execute


class Psycopg(dbapi_scenario.Driver):
    Error = psycopg.Error

    def connect(self, application_name=None):
        if application_name:
            return psycopg.connect(autocommit=True, application_name=application_name)
        return psycopg.connect(autocommit=True)

    def sqlstate(self, err):
        return err.sqlstate

    def call(self, conn, text, values):
        return conn.execute(sql(text), values).fetchone()

    @contextmanager
    def transaction(self, conn):
        with conn.transaction():
            yield executor(conn)

    @contextmanager
    def rolled_back(self, conn):
        with conn.transaction(force_rollback=True):
            yield executor(conn)

    def prepare(self, conn, name, mode):
        conn.execute(f"SET plan_cache_mode = {mode}")
        return lambda key, account, amount: conn.execute(
            CALL_WITHDRAW, (key, account, amount), prepare=True).fetchone()[0]

    def unprepare(self, conn):
        conn.execute("RESET plan_cache_mode")

    def uuid(self, text):
        return uuid.UUID(text)

    def jsonb(self, value):
        return Jsonb(value)


dbapi_scenario.run(Psycopg(withdraw, CALL_WITHDRAW, (Busy, KeyReused)))
