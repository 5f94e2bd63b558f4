"""The clients scenario's steps (see test/clients/run) for the Python
drivers with a DB-API connection, psycopg2 and psycopg 3: what they do
alike. Each driver's own file gives how it talks to the server as a Driver
(its placeholders, transactions, prepared statements and values)."""
import json
import os
import time
from datetime import datetime, timezone
from decimal import Decimal

env = os.environ
prefix = f"{env['CLIENTS_RUN']}-{env['CLIENTS_CONFIG']}-"
account = int(env["CLIENTS_ACCOUNT"])
STAMP = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
UUID = "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"
DOC = {"a": 1, "b": [True, None]}

CALL_TYPES = (
    "SELECT idempotency.idempotent_call(%s, NULL, 'SELECT record_types($1, $2, $3, $4, $5, $6)',"
    "                                   %s, %s, %s, %s, %s, %s)::text,"
    "       idempotency.last_call_replayed()")


def result(step, field, value):
    if isinstance(value, bool):
        value = str(value).lower()
    print(f"RESULT {step} {field} {value}", flush=True)


class Driver:
    """How one driver talks to the server. Statements are written with %s
    placeholders; a driver may rewrite them. Its docs snippet gives
    `withdraw`, `call_withdraw` (the snippet's CALL_WITHDRAW) and
    `rejected`, the snippet's exceptions for IK409 and IK422."""

    Error = Exception  # the driver's error class

    def __init__(self, withdraw, call_withdraw, rejected):
        self.withdraw = withdraw
        self.call_withdraw = call_withdraw
        self.rejected = rejected

    def connect(self, application_name=None):
        raise NotImplementedError

    def sqlstate(self, err):
        raise NotImplementedError

    def call(self, conn, text, values):
        """One statement as the driver runs a call on its own: its row."""
        raise NotImplementedError

    def transaction(self, conn):
        """A context manager around one transaction that commits; it gives
        a function (text, values, every_row=False) that runs a statement in
        it and answers its row (its rows with every_row)."""
        raise NotImplementedError

    def rolled_back(self, conn):
        """The same, around a transaction that is rolled back."""
        raise NotImplementedError

    def prepare(self, conn, name, mode):
        """A prepared CALL_WITHDRAW under plan_cache_mode `mode`: a function
        (key, account, amount) that executes it and answers the response."""
        raise NotImplementedError

    def unprepare(self, conn):
        """Resets plan_cache_mode after prepare."""
        raise NotImplementedError

    def uuid(self, text):
        return text

    def jsonb(self, value):
        raise NotImplementedError


def run(driver):
    """Runs every step with `driver`, printing RESULT lines."""
    call_withdraw = driver.call_withdraw
    doc = driver.jsonb(DOC)
    uuid = driver.uuid(UUID)

    def step(name, body):
        try:
            body()
        except driver.Error as err:
            result(name, "error", f"{driver.sqlstate(err)} {err}".replace("\n", " "))

    def report_call(name, conn, text, values):
        def body():
            response, replayed = driver.call(conn, text, values)
            result(name, "response", response)
            result(name, "replayed", replayed)
        step(name, body)

    conn = driver.connect()
    other = driver.connect(application_name="clients-holder")

    first = prefix + "first"
    for name in ("first", "retry"):
        def call(name=name):
            try:
                response, replayed = driver.withdraw(conn, first, account + 1, 300)
            except driver.rejected as err:
                raise err.__cause__
            result(name, "response", response)
            result(name, "replayed", replayed)
        step(name, call)

    def conflict():
        try:
            driver.call(conn, call_withdraw, (first, account + 1, 301))
        except driver.Error as err:
            result("conflict", "sqlstate", driver.sqlstate(err))
    step("conflict", conflict)

    def busy():
        key = prefix + "busy"
        with driver.transaction(other) as holder:  # holds the key until the block ends
            holder(call_withdraw, (key, account + 2, 100))
            started = time.monotonic()
            try:
                driver.call(conn, call_withdraw, (key, account + 2, 100))
            except driver.Error as err:
                result("busy", "sqlstate", driver.sqlstate(err))
            result("busy", "elapsed_ms", int((time.monotonic() - started) * 1000))
        report_call("busy_after", conn, call_withdraw, (key, account + 2, 100))
    step("busy", busy)

    def handler():
        key = prefix + "handler"
        with driver.transaction(conn) as execute:
            replayed, = execute("SELECT replayed FROM idempotency.claim(%s, %s)", (key, "hash-1"))
            result("handler_claim", "replayed", replayed)
            work, = execute("SELECT withdraw(%s, %s)", (account + 3, 50))
            result("handler_work", "response", json.dumps(work))
            execute("SELECT idempotency.complete(%s, %s)", (key, driver.jsonb(work)))
        with driver.transaction(conn) as execute:
            replayed, response = execute(
                "SELECT replayed, response::text FROM idempotency.claim(%s, %s)", (key, "hash-1"))
        result("handler_again", "replayed", replayed)
        result("handler_again", "response", response)
    step("handler", handler)

    def release():
        key = prefix + "release"
        with driver.transaction(conn) as execute:
            execute("SELECT replayed FROM idempotency.claim(%s, %s)", (key, None))
            execute("SELECT idempotency.release(%s)", (key,))
        state, = driver.call(conn, "SELECT state FROM idempotency.lookup(%s)", (key,))
        result("release_lookup", "state", state)
        with driver.rolled_back(conn) as execute:
            replayed, = execute("SELECT replayed FROM idempotency.claim(%s, %s)", (key, None))
        result("release_again", "replayed", replayed)
    step("release", release)

    # Three keys, the second with a None request hash, in one transaction:
    # withdraw for each claimed key, the answers as a list of the driver's
    # jsonb values. psycopg2 sends that list as ARRAY['...', ...], a text[],
    # hence the cast (psycopg sends a jsonb[] already). Then the batch again
    # with the first key repeated under another hash.
    batch_keys = [f"{prefix}batch-{i}" for i in range(3)]
    batch_hashes = ["hash-0", None, "hash-2"]

    def batch():
        with driver.transaction(conn) as execute:
            claims = execute("SELECT key, outcome FROM idempotency.claim_batch(%s, %s) ORDER BY ordinality",
                             (batch_keys, batch_hashes), every_row=True)
            keys, responses = [], []
            for i, (key, outcome) in enumerate(claims):
                result(f"batch.{i}", "outcome", outcome)
                if outcome != "claimed":
                    continue
                work, = execute("SELECT withdraw(%s, %s)::text", (account + 6 + i, 10 * (i + 1)))
                result(f"batch.{i}", "response", work)
                keys.append(key)
                responses.append(driver.jsonb(json.loads(work)))
            execute("SELECT idempotency.complete_batch(%s, %s::jsonb[])", (keys, responses))
    step("batch", batch)

    def batch_retry():
        with driver.transaction(conn) as execute:
            rows = execute("SELECT outcome, sqlstate, response::text FROM idempotency.claim_batch(%s, %s) ORDER BY ordinality",
                           (batch_keys + batch_keys[:1], batch_hashes + ["hash-0-other"]), every_row=True)
        for i, (outcome, sqlstate, response) in enumerate(rows):
            result(f"batch_retry.{i}", "outcome", outcome)
            result(f"batch_retry.{i}", "response", response)
            result(f"batch_retry.{i}", "sqlstate", sqlstate)
    step("batch_retry", batch_retry)

    key = prefix + "types"
    for name in ("types", "types_retry"):
        report_call(name, conn, CALL_TYPES, (key, key, True, STAMP, uuid, doc, Decimal("12.50")))
    key = prefix + "types-null"
    for name in ("types_null", "types_null_retry"):
        report_call(name, conn, CALL_TYPES, (key, key, None, None, None, None, None))

    for name, mode, acc in (("prepared", "auto", account + 4), ("prepared_generic", "force_generic_plan", account + 5)):
        def prepared(name=name, mode=mode, acc=acc):
            execute = driver.prepare(conn, name, mode)
            for run in ("run", "retry"):
                for i in range(20):
                    response = execute(f"{prefix}{name}-{i}", acc, i + 1)
                    result(f"{name}.{run}.{i}", "response", response)
            driver.unprepare(conn)
        step(name, prepared)

    report_call("cross", conn, call_withdraw, (env["CLIENTS_CROSS_KEY"], int(env["CLIENTS_CROSS_ACCOUNT"]), 250))
    report_call("cross_types", conn, CALL_TYPES,
                (env["CLIENTS_CROSS_KEY"] + "-types", env["CLIENTS_CROSS_TAG"], True, STAMP, uuid, doc, Decimal("12.50")))
    other.close()
    conn.close()
