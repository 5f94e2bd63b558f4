"""Starlette and FastAPI: makes an endpoint safe to retry with an
Idempotency-Key header, over asyncpg or psycopg 3's async connections, with
the rules, stored document, problem documents, fingerprint and key scoping
of the Django decorator and the Node package.

Starlette, an endpoint of the request:

    @idempotent(db=pool, scope=lambda request: request.user.identity)
    async def create_payment(request):
        db = request.state.db                    # the request's transaction
        row = await db.fetchrow("INSERT INTO payments ... RETURNING id", ...)
        return JSONResponse({"payment_id": row["id"]}, status_code=201)

FastAPI, a route class (dependencies, the response model and its
serialization all run inside the transaction):

    router = APIRouter(route_class=idempotent_route(db=pool, scope=principal_of))

    @router.post("/payments", status_code=201, response_model=Payment)
    async def create_payment(body: NewPayment, db=Depends(transaction)):
        ...

For a request with a key the adapter takes a connection from db, opens a
transaction, claims the key and runs the endpoint with the connection as
request.state.db. The response it returns is read to its end in the
transaction (a StreamingResponse's iterator included, up to
max_body_bytes), stored when the policy says so, and committed; then it is
sent, and its background tasks run after that, outside the transaction.
request.state.db is sealed once the response is settled: a background task
that uses it gets SealedError. An exception rolls back and propagates to
the framework's handlers; their answer is not stored.

db: an asyncpg Pool (pool.acquire()), a psycopg_pool AsyncConnectionPool
(pool.connection()), or an async function returning a new connection
(psycopg.AsyncConnection.connect, say), closed after the request.

scope is required, as in the Node package: Starlette has no principal
every application sets. scope=SHARED_KEYS shares the keys between every
client; a request whose scope is None or '' gets 401 principal-required."""
import functools
import inspect
import json
from contextlib import asynccontextmanager

from starlette.requests import Request
from starlette.responses import Response

from . import aio
from .db import Sealable, _wait_timeout_setting
from .errors import IdempotencyError, KeyGone, KeyInProgress, KeyReused
from .fingerprint import fingerprint, fingerprint_of_parts
from .key import KeyHeader, parse_key
from .policy import DEFAULT_VALIDATION_STATUSES, is_stored
from .scope import SHARED_KEYS, scope_text, scoped_key
from .stored import decode_body, stored_document

PROBLEM_BASE = "https://idempotency.example/problems/"
REPLAY_HEADERS = ("Location", "ETag")
MAX_BODY_BYTES = 1024 * 1024


def problem(status, type_, title, detail, problem_base=PROBLEM_BASE, headers=None):
    body = json.dumps({"type": problem_base + type_, "title": title, "status": status, "detail": detail})
    return Response(body, status_code=status, headers=headers, media_type="application/problem+json")


def replay(document):
    """The response of a stored document, with Idempotent-Replayed: true."""
    if not isinstance(document, dict) or not isinstance(document.get("status"), int):
        raise TypeError("the stored response of this key is not an HTTP response document")
    response = Response(decode_body(document), status_code=document["status"])
    for name, value in (document.get("headers") or {}).items():
        response.headers[name] = ", ".join(value) if isinstance(value, list) else value
    response.headers["Idempotent-Replayed"] = "true"
    return response


def read_key(request):
    """The key of a Starlette request: ASGI servers hand header bytes over
    as latin1 text, one character per byte."""
    values = request.headers.getlist("idempotency-key")
    if not values:
        return KeyHeader(missing=True)
    if len(values) > 1:
        return KeyHeader(error="Send one Idempotency-Key field, not several.")
    return parse_key(values[0])


def request_fingerprint(request, body):
    """The shared fingerprint of an ASGI request: the path as sent
    (raw_path) when the server gives it, else the decoded path."""
    scope = request.scope
    query = scope.get("query_string") or b""
    content_type = request.headers.get("content-type")
    raw_path = scope.get("raw_path")
    if raw_path:
        return fingerprint(request.method, raw_path + (b"?" + query if query else b""), content_type, body)
    return fingerprint_of_parts(request.method, scope["path"].encode("utf-8"), query, content_type, body)


def transaction(request: Request):
    """A FastAPI dependency: the request's transaction (request.state.db)."""
    return request.state.db


@asynccontextmanager
async def _connection(db):
    if hasattr(db, "acquire"):
        async with db.acquire() as conn:
            yield conn
    elif hasattr(db, "connection"):
        async with db.connection() as conn:
            yield conn
    else:
        conn = await db()
        try:
            yield conn
        finally:
            await conn.close()


class _TooLarge(Exception):
    pass


async def _read_body(response, limit):
    """The body's bytes; a streaming response is read to its end here,
    inside the transaction."""
    if hasattr(response, "body_iterator"):
        chunks, size = [], 0
        async for chunk in response.body_iterator:
            chunk = chunk.encode(response.charset) if isinstance(chunk, str) else bytes(chunk)
            size += len(chunk)
            if size > limit:
                raise _TooLarge()
            chunks.append(chunk)
        return b"".join(chunks)
    body = bytes(response.body)
    if len(body) > limit:
        raise _TooLarge()
    return body


def _whole(response, body):
    """The response with its body in one piece: same status, headers and
    background tasks."""
    whole = Response(body, status_code=response.status_code)
    whole.raw_headers = [(name, value) for name, value in response.raw_headers if name.lower() != b"content-length"]
    whole.raw_headers.append((b"content-length", str(len(body)).encode("latin1")))
    whole.background = response.background
    return whole


class _Settings:
    def __init__(self, db, scope, required, replay_headers, retry_after, store_validation_errors,
                 validation_statuses, wait_timeout, max_body_bytes, problem_base):
        if db is None:
            raise TypeError("db must be an asyncpg Pool, a psycopg_pool AsyncConnectionPool or an async "
                            "function returning a connection")
        if scope is not SHARED_KEYS and not callable(scope):
            raise TypeError("scope must name the principal of a request, as in scope=lambda request: "
                            "request.user.identity, so that one client's keys never reach another's responses; "
                            "scope=SHARED_KEYS shares the keys between every client")
        if wait_timeout is not None:
            _wait_timeout_setting(wait_timeout)
        self.db, self.scope, self.required = db, scope, required
        self.replay_headers = ("Content-Type", *replay_headers)
        self.retry_after, self.store_validation_errors = retry_after, store_validation_errors
        self.validation_statuses, self.wait_timeout = validation_statuses, wait_timeout
        self.max_body_bytes, self.problem_base = max_body_bytes, problem_base

    def problem_for(self, error):
        if isinstance(error, KeyInProgress):
            return problem(409, "request-in-progress", "A request with this Idempotency-Key is still being processed",
                           f"Retry the same request with the same key after {self.retry_after} s.",
                           self.problem_base, {"Retry-After": str(self.retry_after)})
        if isinstance(error, KeyGone):
            return problem(410, "request-already-ran", "This request already ran; its response is no longer kept",
                           "A request with this Idempotency-Key was processed before and its response has expired; "
                           "it is not run again.",
                           self.problem_base)
        if isinstance(error, KeyReused):
            return problem(422, "idempotency-key-reused", "Idempotency-Key reused with a different request",
                           "This key was used for another request; use a new key for a new request.",
                           self.problem_base)
        return problem(400, "invalid-idempotency-key", "Invalid Idempotency-Key", str(error), self.problem_base)

    def stored_headers(self, response):
        return {name: response.headers[name] for name in self.replay_headers if name in response.headers}


def _settings(db, scope, required=True, replay_headers=REPLAY_HEADERS, retry_after=1, store_validation_errors=False,
              validation_statuses=DEFAULT_VALIDATION_STATUSES, wait_timeout=None, max_body_bytes=MAX_BODY_BYTES,
              problem_base=PROBLEM_BASE):
    return _Settings(db, scope, required, replay_headers, retry_after, store_validation_errors, validation_statuses,
                     wait_timeout, max_body_bytes, problem_base)


async def _handle(settings, handler, request):
    header = read_key(request)
    if header.error is not None:
        return problem(400, "invalid-idempotency-key", "Invalid Idempotency-Key", header.error, settings.problem_base)
    if header.missing and settings.required:
        return problem(400, "missing-idempotency-key", "Missing Idempotency-Key header",
                       "Send a unique Idempotency-Key with this request and repeat it on retries.",
                       settings.problem_base)
    key = header.key
    if key is not None and settings.scope is not SHARED_KEYS:
        principal = settings.scope(request)
        if inspect.isawaitable(principal):
            principal = await principal
        principal = scope_text(principal)
        if principal is None:
            return problem(401, "principal-required", "Request without a principal",
                           "This route keeps the Idempotency-Keys of each client apart and could not tell who sent "
                           "this request.", settings.problem_base)
        key = scoped_key(principal, key)
    request_hash = request_fingerprint(request, await request.body())

    async with _connection(settings.db) as conn:
        await aio.begin(conn)
        ended = False
        handle = Sealable(conn, "request.state.db")
        try:
            if key is not None:
                try:
                    claimed = await aio.claim(conn, key, request_hash, settings.wait_timeout)
                except IdempotencyError as error:
                    await aio.rollback(conn)
                    ended = True
                    return settings.problem_for(error)
                if claimed.replayed:
                    await aio.commit(conn)
                    ended = True
                    return replay(claimed.response)
            request.state.db = handle
            response = await handler(request)
            try:
                body = await _read_body(response, settings.max_body_bytes)
            except _TooLarge:
                await aio.rollback(conn)
                ended = True
                return problem(500, "response-too-large", "Response too large to store",
                               f"The response is larger than {settings.max_body_bytes} bytes and cannot be stored "
                               "for replay; nothing was committed.", settings.problem_base)
            handle.seal("request.state.db was used after the response was settled: the request's transaction "
                        "ends with its response. Do the work before answering.")
            if is_stored(response.status_code, settings.store_validation_errors, settings.validation_statuses):
                if key is not None:
                    await aio.complete(conn, key, stored_document(
                        response.status_code, settings.stored_headers(response), body))
                await aio.commit(conn)
            else:
                await aio.rollback(conn)
            ended = True
            return _whole(response, body)
        finally:
            handle.seal("request.state.db was used after the response was settled: the request's transaction "
                        "ends with its response. Do the work before answering.")
            if not ended:
                try:
                    await aio.rollback(conn)
                except Exception:
                    pass


def idempotent(endpoint=None, *, db=None, scope=None, **options):
    """Decorates a Starlette endpoint (async def endpoint(request)); options
    as in idempotency_pg.django's decorator (required, replay_headers,
    retry_after, store_validation_errors, validation_statuses, wait_timeout,
    max_body_bytes, problem_base), plus db and scope (both required)."""
    if endpoint is None:
        return functools.partial(idempotent, db=db, scope=scope, **options)
    settings = _settings(db, scope, **options)

    @functools.wraps(endpoint)
    async def wrapper(request):
        return await _handle(settings, endpoint, request)

    return wrapper


def idempotent_route(*, db, scope, **options):
    """A FastAPI route class: APIRouter(route_class=idempotent_route(...))
    or @app.post(..., route_class_override=...)."""
    from fastapi.routing import APIRoute

    settings = _settings(db, scope, **options)

    class IdempotentRoute(APIRoute):
        def get_route_handler(self):
            handler = super().get_route_handler()

            async def idempotent_handler(request):
                return await _handle(settings, handler, request)

            return idempotent_handler

    return IdempotentRoute


__all__ = ["idempotent", "idempotent_route", "transaction", "replay", "problem", "read_key", "request_fingerprint",
           "SHARED_KEYS"]
