"""Helpers for handler code and queue consumers, on any DB-API cursor of
psycopg2, psycopg 3 or Django: claim, complete and release a key in the
caller's transaction, and with_idempotency, which runs a unit of work once
per key in a transaction of its own."""
import datetime
import json
from collections import namedtuple

from .errors import SealedError, claim_error

Claim = namedtuple("Claim", "replayed response created_at expires_at")


def _wait_timeout_setting(wait_timeout):
    if isinstance(wait_timeout, bool) or not isinstance(wait_timeout, (int, float, str)):
        raise TypeError("wait_timeout must be seconds (a number) or a text such as '2s'")
    if isinstance(wait_timeout, str):
        if not wait_timeout.strip():
            raise ValueError("wait_timeout must not be empty")
        return wait_timeout
    if wait_timeout < 0:
        raise ValueError("wait_timeout must be >= 0")
    return str(int(round(wait_timeout * 1000)))  # milliseconds


def _ttl_setting(ttl):
    """idempotency.ttl's text for a TTL given as seconds, a timedelta or an
    interval's text ('7 days'); the database checks the text's range
    (positive, at most idempotency.max_ttl) when it is set."""
    if isinstance(ttl, datetime.timedelta):
        ttl = ttl.total_seconds()
    if isinstance(ttl, bool) or not isinstance(ttl, (int, float, str)):
        raise TypeError("ttl must be seconds (a number), a datetime.timedelta or an interval such as '7 days'")
    if isinstance(ttl, str):
        if not ttl.strip():
            raise ValueError("ttl must not be empty")
        return ttl
    if not ttl > 0:
        raise ValueError("ttl must be positive")
    return f"{int(round(ttl * 1000))} milliseconds"


def claim_settings(wait_timeout=None, ttl=None):
    """The SELECT that sets the claim's settings for the transaction, and
    its parameters; None when there are none."""
    names = [name for name, value in (("wait_timeout", wait_timeout), ("ttl", ttl)) if value is not None]
    if not names:
        return None
    values = [_wait_timeout_setting(wait_timeout)] if wait_timeout is not None else []
    if ttl is not None:
        values.append(_ttl_setting(ttl))
    return ("SELECT " + ", ".join(f"set_config('idempotency.{name}', %s, true)" for name in names), values)


def set_ttl(cursor, ttl):
    """SET LOCAL idempotency.ttl: keys claimed later in this transaction
    are kept for ttl (seconds, a timedelta, or a text such as '7 days')."""
    cursor.execute("SELECT set_config('idempotency.ttl', %s, true)", [_ttl_setting(ttl)])
    cursor.fetchall()


def set_wait_timeout(cursor, wait_timeout):
    """SET LOCAL idempotency.wait_timeout (seconds, or a text with a unit)."""
    cursor.execute("SELECT set_config('idempotency.wait_timeout', %s, true)",
                   [_wait_timeout_setting(wait_timeout)])
    cursor.fetchall()


def claim(cursor, key, request_hash=None, wait_timeout=None, ttl=None):
    """Claims key in the cursor's open transaction. Returns Claim(replayed,
    response, created_at, expires_at); raises KeyInProgress, KeyGone,
    KeyReused or InvalidKey for the claim's own errors (any other error
    unchanged). wait_timeout and ttl are set for the rest of the
    transaction (SET LOCAL) before the claim."""
    # Outside the try: a bad setting's 22023 is not an invalid key.
    settings = claim_settings(wait_timeout, ttl)
    if settings is not None:
        cursor.execute(*settings)
        cursor.fetchall()
    try:
        # response as text: Django leaves jsonb undecoded, psycopg decodes it.
        cursor.execute("SELECT replayed, response::text, created_at, expires_at"
                       " FROM idempotency.claim(%s, %s)", [key, request_hash])
        replayed, response, created_at, expires_at = cursor.fetchone()
    except Exception as error:
        mapped = claim_error(error)
        if mapped is None:
            raise
        raise mapped from error
    return Claim(replayed, None if response is None else json.loads(response), created_at, expires_at)


def complete(cursor, key, response):
    """Stores response (a JSON value) for the key this transaction claimed."""
    cursor.execute("SELECT idempotency.complete(%s, %s::jsonb)",
                   [key, None if response is None else json.dumps(response)])
    cursor.fetchall()


def release(cursor, key):
    """Lets go of this transaction's claim without storing anything."""
    cursor.execute("SELECT idempotency.release(%s)", [key])
    cursor.fetchall()


class Sealable:
    """Forwards to an object until sealed; then every use raises
    SealedError."""

    def __init__(self, target, name="the transaction handle"):
        object.__setattr__(self, "_target", target)
        object.__setattr__(self, "_sealed", None)
        object.__setattr__(self, "_name", name)

    def seal(self, reason):
        object.__setattr__(self, "_sealed", reason)

    def __getattr__(self, name):
        if self._sealed is not None:
            raise SealedError(self._sealed)
        return getattr(self._target, name)

    def __enter__(self):
        if self._sealed is not None:
            raise SealedError(self._sealed)
        return self

    def __exit__(self, *exc):
        return False


def with_idempotency(conn, key, work, request_hash=None, wait_timeout=None, ttl=None):
    """Runs work(cursor) once for key, on a psycopg2 or psycopg 3 connection
    that is not in a transaction: in a transaction, after a claim; its
    result (a JSON value) is stored and committed with its work, and
    returned. A retry gets the stored result without running work. Raises
    what work raises (after ROLLBACK), and the claim's errors.

    Returns (replayed, response)."""
    autocommit = bool(getattr(conn, "autocommit", False))
    cursor = conn.cursor()
    try:
        if autocommit:
            cursor.execute("BEGIN")
        claimed = claim(cursor, key, request_hash, wait_timeout, ttl)
        if claimed.replayed:
            response = claimed.response
        else:
            handle = Sealable(cursor)
            try:
                response = work(handle)
            finally:
                handle.seal(f"the transaction of idempotency key {key!r} has ended; "
                            "use the cursor only inside the work function")
            complete(cursor, key, response)
        if autocommit:
            cursor.execute("COMMIT")
        else:
            conn.commit()
        return claimed.replayed, response
    except BaseException:
        if autocommit:
            try:
                cursor.execute("ROLLBACK")
            except Exception:
                pass
        else:
            conn.rollback()
        raise
    finally:
        cursor.close()
