"""The clients scenario from asyncpg (see test/clients/run): $n
placeholders, Python values as asyncpg encodes them (binary, with the
parameter types the server reports for the statement)."""
import asyncio
import json
import os
import time
import uuid
from datetime import datetime, timezone
from decimal import Decimal

import asyncpg

env = os.environ
prefix = f"{env['CLIENTS_RUN']}-{env['CLIENTS_CONFIG']}-"
account = int(env["CLIENTS_ACCOUNT"])
STAMP = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
UUID = uuid.UUID("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11")
DOC = json.dumps({"a": 1, "b": [True, None]})  # asyncpg takes jsonb as text


def result(step, field, value):
    if isinstance(value, bool):
        value = str(value).lower()
    print(f"RESULT {step} {field} {value}", flush=True)


async def step(name, body):
    try:
        await body()
    except asyncpg.PostgresError as err:
        result(name, "error", f"{err.sqlstate} {err}".replace("\n", " "))


# docs:begin asyncpg
class Busy(Exception):
    """IK409: another transaction holds the key; retry later with the same key."""


class KeyReused(Exception):
    """IK422: the key was used for another request; a new request needs a new key."""


CALL_WITHDRAW = """
    SELECT idempotency.idempotent_call($1, NULL, 'SELECT withdraw($1, $2)', $2, $3)::text AS response,
           idempotency.last_call_replayed() AS replayed"""


async def withdraw(conn, key, account, amount):
    try:
        row = await conn.fetchrow(CALL_WITHDRAW, key, account, amount)
        return row["response"], row["replayed"]  # '{"account": 7, "balance": 9700}', False
    except asyncpg.PostgresError as err:
        if err.sqlstate == "IK409":
            raise Busy(key) from err  # 409: retry later with the same key
        if err.sqlstate == "IK422":
            raise KeyReused(key) from err  # 422: a new request needs a new key
        raise
# docs:end asyncpg


CALL_TYPES = """
    SELECT idempotency.idempotent_call($1, NULL, 'SELECT record_types($1, $2, $3, $4, $5, $6)',
                                       $2, $3, $4, $5, $6, $7)::text AS response,
           idempotency.last_call_replayed() AS replayed"""


async def report_call(name, conn, text, *values):
    async def body():
        row = await conn.fetchrow(text, *values)
        result(name, "response", row["response"])
        result(name, "replayed", row["replayed"])
    await step(name, body)


async def main():
    conn = await asyncpg.connect()
    other = await asyncpg.connect(server_settings={"application_name": "clients-holder"})

    first = prefix + "first"
    for name in ("first", "retry"):
        async def call(name=name):
            try:
                response, replayed = await withdraw(conn, first, account + 1, 300)
            except (Busy, KeyReused) as err:
                raise err.__cause__
            result(name, "response", response)
            result(name, "replayed", replayed)
        await step(name, call)

    async def conflict():
        try:
            await conn.fetchrow(CALL_WITHDRAW, first, account + 1, 301)
        except asyncpg.PostgresError as err:
            result("conflict", "sqlstate", err.sqlstate)
    await step("conflict", conflict)

    async def busy():
        key = prefix + "busy"
        async with other.transaction():
            await other.fetchrow(CALL_WITHDRAW, key, account + 2, 100)
            started = time.monotonic()
            try:
                await conn.fetchrow(CALL_WITHDRAW, key, account + 2, 100)
            except asyncpg.PostgresError as err:
                result("busy", "sqlstate", err.sqlstate)
            result("busy", "elapsed_ms", int((time.monotonic() - started) * 1000))
        await report_call("busy_after", conn, CALL_WITHDRAW, key, account + 2, 100)
    await step("busy", busy)

    async def handler():
        key = prefix + "handler"
        async with conn.transaction():
            replayed = await conn.fetchval("SELECT replayed FROM idempotency.claim($1, $2)", key, "hash-1")
            result("handler_claim", "replayed", replayed)
            work = await conn.fetchval("SELECT withdraw($1, $2)", account + 3, 50)
            result("handler_work", "response", work)
            await conn.execute("SELECT idempotency.complete($1, $2)", key, work)
        async with conn.transaction():
            row = await conn.fetchrow("SELECT replayed, response::text FROM idempotency.claim($1, $2)", key, "hash-1")
        result("handler_again", "replayed", row["replayed"])
        result("handler_again", "response", row["response"])
    await step("handler", handler)

    async def release():
        key = prefix + "release"
        async with conn.transaction():
            await conn.execute("SELECT replayed FROM idempotency.claim($1, $2)", key, None)
            await conn.execute("SELECT idempotency.release($1)", key)
        result("release_lookup", "state", await conn.fetchval("SELECT state FROM idempotency.lookup($1)", key))
        transaction = conn.transaction()
        await transaction.start()
        replayed = await conn.fetchval("SELECT replayed FROM idempotency.claim($1, $2)", key, None)
        await transaction.rollback()
        result("release_again", "replayed", replayed)
    await step("release", release)

    # Three keys, the second with a None request hash, in one transaction:
    # withdraw for each claimed key, the answers (asyncpg's jsonb, text) as a
    # list for jsonb[]. Then the batch again with the first key repeated
    # under another hash.
    batch_keys = [f"{prefix}batch-{i}" for i in range(3)]
    batch_hashes = ["hash-0", None, "hash-2"]

    async def batch():
        async with conn.transaction():
            claims = await conn.fetch("SELECT key, outcome FROM idempotency.claim_batch($1, $2) ORDER BY ordinality",
                                      batch_keys, batch_hashes)
            keys, responses = [], []
            for i, claim in enumerate(claims):
                result(f"batch.{i}", "outcome", claim["outcome"])
                if claim["outcome"] != "claimed":
                    continue
                work = await conn.fetchval("SELECT withdraw($1, $2)", account + 6 + i, 10 * (i + 1))
                result(f"batch.{i}", "response", work)
                keys.append(claim["key"])
                responses.append(work)
            await conn.execute("SELECT idempotency.complete_batch($1, $2)", keys, responses)
    await step("batch", batch)

    async def batch_retry():
        async with conn.transaction():
            rows = await conn.fetch(
                "SELECT outcome, sqlstate, response::text FROM idempotency.claim_batch($1, $2) ORDER BY ordinality",
                batch_keys + batch_keys[:1], batch_hashes + ["hash-0-other"])
        for i, row in enumerate(rows):
            result(f"batch_retry.{i}", "outcome", row["outcome"])
            result(f"batch_retry.{i}", "response", row["response"])
            result(f"batch_retry.{i}", "sqlstate", row["sqlstate"])
    await step("batch_retry", batch_retry)

    key = prefix + "types"
    for name in ("types", "types_retry"):
        await report_call(name, conn, CALL_TYPES, key, key, True, STAMP, UUID, DOC, Decimal("12.50"))
    key = prefix + "types-null"
    for name in ("types_null", "types_null_retry"):
        await report_call(name, conn, CALL_TYPES, key, key, None, None, None, None, None)

    for name, mode, acc in (("prepared", "auto", account + 4), ("prepared_generic", "force_generic_plan", account + 5)):
        async def prepared(name=name, mode=mode, acc=acc):
            await conn.execute(f"SET plan_cache_mode = {mode}")
            statement = await conn.prepare(CALL_WITHDRAW)
            for run in ("run", "retry"):
                for i in range(20):
                    row = await statement.fetchrow(f"{prefix}{name}-{i}", acc, i + 1)
                    result(f"{name}.{run}.{i}", "response", row["response"])
            await conn.execute("RESET plan_cache_mode")
        await step(name, prepared)

    await report_call("cross", conn, CALL_WITHDRAW, env["CLIENTS_CROSS_KEY"], int(env["CLIENTS_CROSS_ACCOUNT"]), 250)
    await report_call("cross_types", conn, CALL_TYPES, env["CLIENTS_CROSS_KEY"] + "-types", env["CLIENTS_CROSS_TAG"],
                      True, STAMP, UUID, DOC, Decimal("12.50"))
    await other.close()
    await conn.close()


asyncio.run(main())
