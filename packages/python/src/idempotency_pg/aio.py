"""The helpers of idempotency_pg.db for asyncio drivers: asyncpg
connections and psycopg 3's AsyncConnection. claim, complete and release
work in the caller's open transaction; with_idempotency runs a unit of
work once per key in a transaction of its own (a queue consumer's
message, say).

    claimed = await claim(conn, key, request_hash)
    replayed, response = await with_idempotency(conn, key, work)

The driver is told by the connection: asyncpg's take $1 placeholders,
psycopg's %s."""
import json

from .db import Claim, Sealable, _ttl_setting, _wait_timeout_setting, claim_settings
from .errors import claim_error


def _is_asyncpg(conn):
    conn = getattr(conn, "_target", conn)  # a Sealable handle
    return type(conn).__module__.startswith("asyncpg")


async def fetchrow(conn, sql, args=()):
    """One row of a statement written with %s placeholders, on either
    driver (asyncpg gets them as $1, $2, ...)."""
    if _is_asyncpg(conn):
        parts = sql.split("%s")
        sql = "".join(part + (f"${i + 1}" if i < len(parts) - 1 else "") for i, part in enumerate(parts))
        return await conn.fetchrow(sql, *args)
    async with conn.cursor() as cursor:
        await cursor.execute(sql, args)
        return await cursor.fetchone()


def _explicit(conn):
    """asyncpg, and psycopg in autocommit, take BEGIN/COMMIT as statements;
    psycopg otherwise opens a transaction by itself and ends it with
    commit()/rollback()."""
    return _is_asyncpg(conn) or bool(getattr(conn, "autocommit", False))


async def begin(conn):
    if _explicit(conn):
        await conn.execute("BEGIN")


async def commit(conn):
    if _explicit(conn):
        await conn.execute("COMMIT")
    else:
        await conn.commit()


async def rollback(conn):
    if _explicit(conn):
        await conn.execute("ROLLBACK")
    else:
        await conn.rollback()


async def set_wait_timeout(conn, wait_timeout):
    await fetchrow(conn, "SELECT set_config('idempotency.wait_timeout', %s, true)",
                    [_wait_timeout_setting(wait_timeout)])


async def set_ttl(conn, ttl):
    await fetchrow(conn, "SELECT set_config('idempotency.ttl', %s, true)", [_ttl_setting(ttl)])


async def claim(conn, key, request_hash=None, wait_timeout=None, ttl=None):
    """Claims key in the connection's open transaction. Returns Claim;
    raises KeyInProgress, KeyGone, KeyReused or InvalidKey for the claim's
    own errors (any other error unchanged). wait_timeout and ttl are set
    for the rest of the transaction (SET LOCAL) before the claim."""
    settings = claim_settings(wait_timeout, ttl)
    if settings is not None:
        await fetchrow(conn, *settings)
    try:
        row = await fetchrow(conn, "SELECT replayed, response::text, created_at, expires_at"
                                    " FROM idempotency.claim(%s, %s)", [key, request_hash])
    except Exception as error:
        mapped = claim_error(error)
        if mapped is None:
            raise
        raise mapped from error
    replayed, response, created_at, expires_at = tuple(row)
    return Claim(replayed, None if response is None else json.loads(response), created_at, expires_at)


async def complete(conn, key, response):
    """Stores response (a JSON value) for the key this transaction claimed."""
    await fetchrow(conn, "SELECT idempotency.complete(%s, %s::text::jsonb)",
                    [key, None if response is None else json.dumps(response)])


async def release(conn, key):
    """Lets go of this transaction's claim without storing anything."""
    await fetchrow(conn, "SELECT idempotency.release(%s)", [key])


async def with_idempotency(conn, key, work, request_hash=None, wait_timeout=None, ttl=None):
    """Runs await work(handle) once for key, on an asyncpg connection or a
    psycopg AsyncConnection that is not in a transaction: in a transaction,
    after a claim; its result (a JSON value) is stored and committed with
    its work, and returned. A retry gets the stored result without running
    work. handle is the connection until work returns, then sealed.
    Returns (replayed, response)."""
    await begin(conn)
    try:
        claimed = await claim(conn, key, request_hash, wait_timeout, ttl)
        if claimed.replayed:
            response = claimed.response
        else:
            handle = Sealable(conn)
            try:
                response = await work(handle)
            finally:
                handle.seal(f"the transaction of idempotency key {key!r} has ended; "
                            "use the connection only inside the work function")
            await complete(conn, key, response)
        await commit(conn)
        return claimed.replayed, response
    except BaseException:
        try:
            await rollback(conn)
        except Exception:
            pass
        raise
