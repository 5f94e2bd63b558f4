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
transaction (a StreamingResponse's iterator included, and a response
without a body attribute, FileResponse say, run once into a buffer; up to
max_body_bytes), stored when the policy says so, and committed; then it is
sent, and its background tasks run after that, outside the transaction.
request.state.db is sealed once the response is settled: a background task
that uses it gets SealedError. An exception rolls back and propagates to
the framework's handlers; their answer is not stored.

db: an asyncpg Pool (pool.acquire()), a psycopg_pool AsyncConnectionPool
(pool.connection()), an async function of no argument returning a new
connection (psycopg.AsyncConnection.connect, say), closed after the
request, or a function of the request returning one of those, called per
request: db=lambda request: request.app.state.pool, for a pool created at
startup (in the lifespan).

scope is required, as in the Node package: Starlette has no principal
every application sets. scope=SHARED_KEYS shares the keys between every
client; a request whose scope is None or '', or whose scope function
raises one of NO_PRINCIPAL_ERRORS, gets 401 principal-required. On a
FastAPI route, scope=Depends(dependency) takes the principal from a
dependency, solved once with the route's own.

Every outcome is logged under the logger "idempotency_pg"
(idempotency_pg.log)."""
import functools
import inspect
import json
import logging
from contextlib import asynccontextmanager
from typing import Any

import anyio
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import Response

from . import aio
from .db import Sealable, _ttl_setting, _wait_timeout_setting
from .errors import IdempotencyError, KeyGone, KeyInProgress, KeyReused
from .fingerprint import fingerprint, fingerprint_of_parts
from .key import KeyHeader, parse_key
from .log import log_event, not_stored_reason
from .policy import DEFAULT_VALIDATION_STATUSES, is_stored
from .problems import DEFAULT_PROBLEM_BASE
from .scope import NO_PRINCIPAL_ERRORS, SHARED_KEYS, scope_text, scoped_key
from .stored import decode_body, stored_document

PROBLEM_BASE = DEFAULT_PROBLEM_BASE
REPLAY_HEADERS = ("Location", "ETag")
MAX_BODY_BYTES = 1024 * 1024
SEALED = ("request.state.db was used after the response was settled: the request's transaction "
          "ends with its response. Do the work before answering.")


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


def _is_pool(db):
    return hasattr(db, "acquire") or hasattr(db, "connection")


def _takes_request(function):
    """Whether db is a function of the request (one required positional
    parameter) rather than a connection factory (none)."""
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return False
    required = [p for p in parameters if p.default is p.empty
                and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(required) == 1


async def _resolve_db(db, request):
    """The pool or factory of this request: db itself, or what db(request)
    returns."""
    if _is_pool(db) or not _takes_request(db):
        return db
    resolved = db(request)
    # An asyncpg Pool is awaitable too (awaiting it gives None once it is ready).
    if not _is_pool(resolved) and inspect.isawaitable(resolved):
        resolved = await resolved
    if resolved is None:
        raise RuntimeError("db(request) returned None: create the pool before the application serves requests "
                           "(in its lifespan), e.g. app.state.pool = await asyncpg.create_pool()")
    if not _is_pool(resolved) and not callable(resolved):
        raise TypeError(f"db(request) returned {type(resolved).__name__}: return an asyncpg Pool, a psycopg_pool "
                        "AsyncConnectionPool or an async function returning a connection")
    return resolved


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


class _Answer(Exception):
    """Leaves FastAPI's handler with an answer; the transaction has ended."""

    def __init__(self, response):
        super().__init__()
        self.response = response


async def _read_stream(response, limit):
    chunks, size = [], 0
    async for chunk in response.body_iterator:
        chunk = chunk.encode(response.charset) if isinstance(chunk, str) else bytes(chunk)
        size += len(chunk)
        if size > limit:
            raise _TooLarge()
        chunks.append(chunk)
    return b"".join(chunks)


_BUFFER_FREE_EXTENSIONS = ("http.response.pathsend", "http.response.zerocopy")


def _buffer_scope(scope):
    """The request's scope for a response run into a buffer: without Range
    (the whole representation is what a retry replays) and without the
    server's extensions that send a body other than as
    http.response.body messages."""
    headers = [(name, value) for name, value in scope.get("headers") or ()
               if name.lower() not in (b"range", b"if-range")]
    extensions = {name: value for name, value in (scope.get("extensions") or {}).items()
                  if name not in _BUFFER_FREE_EXTENSIONS}
    return {**scope, "headers": headers, "extensions": extensions}


async def _read_sent(response, request, limit):
    """A response without a body (FileResponse, a response class of its
    own): run as the ASGI app it is, into a buffer; its background tasks
    are kept for the response sent after the commit. The status and headers
    are the ones it sent (FileResponse adds its stat headers then)."""
    start, chunks, size = {}, [], 0

    async def receive():
        await anyio.sleep_forever()  # no disconnect: the client waits for the commit

    async def send(message):
        nonlocal size
        if message["type"] == "http.response.start":
            start.update(message)
        elif message["type"] == "http.response.body":
            chunk = bytes(message.get("body", b""))
            size += len(chunk)
            if size > limit:
                raise _TooLarge()
            chunks.append(chunk)

    background, response.background = getattr(response, "background", None), None
    try:
        await response(_buffer_scope(request.scope), receive, send)
    finally:
        response.background = background
    if "status" not in start:
        raise RuntimeError(f"{type(response).__name__} sent no http.response.start")
    return start["status"], list(start.get("headers") or []), b"".join(chunks)


async def _read(response, request, limit):
    """The response's status, raw headers and body, read to its end here,
    inside the transaction (a streaming response's iterator included)."""
    if hasattr(response, "body_iterator"):
        body = await _read_stream(response, limit)
    elif hasattr(response, "body"):
        body = bytes(response.body)
        if len(body) > limit:
            raise _TooLarge()
    else:
        return await _read_sent(response, request, limit)
    return response.status_code, list(response.raw_headers), body


def _whole(status, raw_headers, body, background):
    """The response sent after the commit: its body in one piece, the same
    status, headers and background tasks."""
    whole = Response(body, status_code=status)
    whole.raw_headers = [(name, value) for name, value in raw_headers if name.lower() != b"content-length"]
    whole.raw_headers.append((b"content-length", str(len(body)).encode("latin1")))
    whole.background = background
    return whole


def _is_dependency(scope):
    """A FastAPI Depends(...) (checked without importing FastAPI)."""
    return type(scope).__module__.startswith("fastapi") and hasattr(scope, "dependency")


class _Settings:
    def __init__(self, db, scope, required, replay_headers, retry_after, store_validation_errors,
                 validation_statuses, wait_timeout, max_body_bytes, problem_base, ttl):
        if db is None or not (_is_pool(db) or callable(db)):
            raise TypeError("db must be an asyncpg Pool, a psycopg_pool AsyncConnectionPool, an async function "
                            "returning a connection, or a function of the request returning one of those (a pool "
                            "made at startup: db=lambda request: request.app.state.pool)")
        if scope is not SHARED_KEYS and not callable(scope) and not _is_dependency(scope):
            raise TypeError("scope must name the principal of a request, as in scope=lambda request: "
                            "request.user.identity, so that one client's keys never reach another's responses; "
                            "scope=SHARED_KEYS shares the keys between every client")
        if wait_timeout is not None:
            _wait_timeout_setting(wait_timeout)
        if ttl is not None:
            _ttl_setting(ttl)  # a bad value fails where the route is defined, not at its first request
        self.db, self.scope, self.required = db, scope, required
        self.scope_dependency = _is_dependency(scope)
        self.replay_headers = ("Content-Type", *replay_headers)
        self.retry_after, self.store_validation_errors = retry_after, store_validation_errors
        self.validation_statuses, self.wait_timeout = validation_statuses, wait_timeout
        self.max_body_bytes, self.problem_base, self.ttl = max_body_bytes, problem_base, ttl

    def problem(self, status, type_, title, detail, headers=None):
        return problem(status, type_, title, detail, self.problem_base, headers)

    def problem_for(self, error):
        if isinstance(error, KeyInProgress):
            return self.problem(409, "request-in-progress", "A request with this Idempotency-Key is still being "
                                "processed", f"Retry the same request with the same key after {self.retry_after} s.",
                                {"Retry-After": str(self.retry_after)})
        if isinstance(error, KeyGone):
            return self.problem(410, "request-already-ran", "This request already ran; its response is no longer "
                                "kept", "A request with this Idempotency-Key was processed before and its response "
                                "has expired; it is not run again.")
        if isinstance(error, KeyReused):
            return self.problem(422, "idempotency-key-reused", "Idempotency-Key reused with a different request",
                                "This key was used for another request; use a new key for a new request.")
        return self.problem(400, "invalid-idempotency-key", "Invalid Idempotency-Key", str(error))

    def principal_required(self):
        return self.problem(401, "principal-required", "Request without a principal",
                            "This route keeps the Idempotency-Keys of each client apart and could not tell who sent "
                            "this request.")

    def stored_headers(self, raw_headers):
        headers = Headers(raw=raw_headers)
        return {name: headers[name] for name in self.replay_headers if name in headers}


def _settings(db, scope, required=True, replay_headers=REPLAY_HEADERS, retry_after=1, store_validation_errors=False,
              validation_statuses=DEFAULT_VALIDATION_STATUSES, wait_timeout=None, max_body_bytes=MAX_BODY_BYTES,
              problem_base=PROBLEM_BASE, ttl=None):
    return _Settings(db, scope, required, replay_headers, retry_after, store_validation_errors, validation_statuses,
                     wait_timeout, max_body_bytes, problem_base, ttl)


_CLAIM_EVENTS = {KeyInProgress: ("conflict", logging.INFO), KeyGone: ("gone", logging.INFO),
                 KeyReused: ("mismatch", logging.WARNING)}


async def _claim(settings, conn, request, key, request_hash):
    """Claims key. None when the endpoint is to run; otherwise the answer,
    with the transaction ended."""
    try:
        claimed = await aio.claim(conn, key, request_hash, settings.wait_timeout, settings.ttl)
    except IdempotencyError as error:
        await aio.rollback(conn)
        event, level = _CLAIM_EVENTS.get(type(error), ("invalid-key", logging.INFO))
        answer = settings.problem_for(error)
        log_event(level, event, request.method, request.url.path, key, answer.status_code)
        return answer
    if not claimed.replayed:
        return None
    await aio.commit(conn)
    answer = replay(claimed.response)
    log_event(logging.INFO, "replayed", request.method, request.url.path, key, answer.status_code)
    return answer


async def _principal(scope, request):
    """The principal's text, or None with why there is none."""
    try:
        principal = scope(request)
        if inspect.isawaitable(principal):
            principal = await principal
    except NO_PRINCIPAL_ERRORS as error:
        return None, f"the scope function raised {type(error).__name__}"
    text = scope_text(principal)
    return text, None if text is not None else "the scope function returned no principal"


class _Pending:
    """A request's claim: the connection, the key (scoped already, or the
    client's when a FastAPI dependency names the principal) and the
    fingerprint; key is the database key once claimed."""

    def __init__(self, conn, client_key, request_hash):
        self.conn, self.client_key, self.request_hash, self.key = conn, client_key, request_hash, None


async def _refusal(settings, request):
    """The answer to a request refused before its transaction (a missing or
    malformed key, no principal), or None; and the key to claim."""
    method, path = request.method, request.url.path
    header = read_key(request)
    if header.error is not None:
        log_event(logging.INFO, "invalid-key", method, path, status=400, reason=header.error)
        return settings.problem(400, "invalid-idempotency-key", "Invalid Idempotency-Key", header.error), None
    if header.missing and settings.required:
        log_event(logging.INFO, "invalid-key", method, path, status=400, reason="no Idempotency-Key header")
        return settings.problem(400, "missing-idempotency-key", "Missing Idempotency-Key header",
                                "Send a unique Idempotency-Key with this request and repeat it on retries."), None
    key = header.key
    if key is not None and settings.scope is not SHARED_KEYS and not settings.scope_dependency:
        principal, why = await _principal(settings.scope, request)
        if principal is None:
            log_event(logging.INFO, "principal-required", method, path, status=401, reason=why)
            return settings.principal_required(), None
        key = scoped_key(principal, key)
    return None, key


async def _handle(settings, handler, request):
    refusal, key = await _refusal(settings, request)
    if refusal is not None:
        return refusal
    request_hash = request_fingerprint(request, await request.body())
    method, path = request.method, request.url.path

    async with _connection(await _resolve_db(settings.db, request)) as conn:
        await aio.begin(conn)
        ended = False
        handle = Sealable(conn, "request.state.db")
        try:
            pending = _Pending(conn, key, request_hash)
            if settings.scope_dependency:
                request.state.idempotency_pending = pending  # the claim dependency scopes and claims the key
            elif key is not None:
                answer = await _claim(settings, conn, request, key, request_hash)
                if answer is not None:
                    ended = True
                    return answer
                pending.key = key
            request.state.db = handle
            try:
                response = await handler(request)
                status, raw_headers, body = await _read(response, request, settings.max_body_bytes)
            except _Answer as answer:
                ended = True
                return answer.response
            except _TooLarge:
                await aio.rollback(conn)
                ended = True
                log_event(logging.WARNING, "not-stored", method, path, pending.key, 500,
                          f"the response is larger than max_body_bytes ({settings.max_body_bytes})")
                return settings.problem(500, "response-too-large", "Response too large to store",
                                        f"The response is larger than {settings.max_body_bytes} bytes and cannot be "
                                        "stored for replay; nothing was committed.")
            except BaseException as error:
                if pending.key is not None:
                    log_event(logging.INFO, "not-stored", method, path, pending.key,
                              reason=f"the endpoint raised {type(error).__name__}")
                raise
            key = pending.key  # None: a request without a key (required=False)
            handle.seal(SEALED)
            if is_stored(status, settings.store_validation_errors, settings.validation_statuses):
                if key is not None:
                    await aio.complete(conn, key, stored_document(status, settings.stored_headers(raw_headers),
                                                                  body))
                await aio.commit(conn)
                if key is not None:
                    log_event(logging.DEBUG, "stored", method, path, key, status)
            else:
                await aio.rollback(conn)
                if key is not None:
                    log_event(logging.INFO, "not-stored", method, path, key, status, not_stored_reason(status))
            ended = True
            return _whole(status, raw_headers, body, getattr(response, "background", None))
        finally:
            handle.seal(SEALED)
            if not ended:
                try:
                    await aio.rollback(conn)
                except Exception:
                    pass


def idempotent(endpoint=None, *, db=None, scope=None, **options):
    """Decorates a Starlette endpoint (async def endpoint(request)); options
    as in idempotency_pg.django's decorator (required, replay_headers,
    retry_after, store_validation_errors, validation_statuses, wait_timeout,
    ttl, max_body_bytes, problem_base), plus db and scope (both required)."""
    if endpoint is None:
        return functools.partial(idempotent, db=db, scope=scope, **options)
    settings = _settings(db, scope, **options)
    if settings.scope_dependency:
        raise TypeError("scope=Depends(...) is for FastAPI routes (idempotent_route); a Starlette endpoint's scope "
                        "is a function of the request")

    @functools.wraps(endpoint)
    async def wrapper(request):
        return await _handle(settings, endpoint, request)

    return wrapper


_PROBLEM_SCHEMA = {"type": "object", "description": "RFC 9457 problem details",
                   "properties": {"type": {"type": "string"}, "title": {"type": "string"},
                                  "status": {"type": "integer"}, "detail": {"type": "string"}}}


def _openapi_extra(settings):
    """The operation's Idempotency-Key parameter and problem responses (a
    new dict per route: FastAPI merges it into the operation)."""
    def answer(description, **extra):
        return {"description": description,
                "content": {"application/problem+json": {"schema": dict(_PROBLEM_SCHEMA)}}, **extra}

    responses = {
        "400": answer("Missing or invalid Idempotency-Key (problem missing-idempotency-key, invalid-idempotency-key)"),
        "409": answer("A request with this Idempotency-Key is still being processed (problem request-in-progress); "
                      "retry after Retry-After seconds",
                      headers={"Retry-After": {"schema": {"type": "integer"}}}),
        "410": answer("The request already ran and its response is no longer kept (problem request-already-ran)"),
        "422": answer("The Idempotency-Key was used with another request (problem idempotency-key-reused), or the "
                      "request failed validation"),
    }
    if settings.scope is not SHARED_KEYS:
        responses["401"] = answer("A key without a principal (problem principal-required)")
    parameter = {"name": "Idempotency-Key", "in": "header", "required": bool(settings.required),
                 "description": "A unique key for this request, repeated on its retries: a retry gets the first "
                                "response, with Idempotent-Replayed: true",
                 "schema": {"type": "string", "minLength": 1, "maxLength": 255}}
    return {"parameters": [parameter], "responses": responses}


def _merge(base, extra):
    for name, value in (extra or {}).items():
        if isinstance(base.get(name), dict) and isinstance(value, dict):
            _merge(base[name], value)
        elif isinstance(base.get(name), list) and isinstance(value, list):
            base[name] = base[name] + value
        else:
            base[name] = value
    return base


def _claim_dependency(settings, depends):
    """The dependency a FastAPI route with scope=Depends(...) runs first:
    given the principal FastAPI solved (once, shared with the route's own
    uses of the dependency), it scopes the key and claims it."""

    async def idempotency_claim(request: Request, principal: Any = depends):
        pending = getattr(request.state, "idempotency_pending", None)
        if pending is None or pending.client_key is None:
            return
        text = scope_text(principal)
        if text is None:
            await aio.rollback(pending.conn)
            log_event(logging.INFO, "principal-required", request.method, request.url.path, status=401,
                      reason="the scope dependency returned no principal")
            raise _Answer(settings.principal_required())
        pending.key = scoped_key(text, pending.client_key)
        answer = await _claim(settings, pending.conn, request, pending.key, pending.request_hash)
        if answer is not None:
            raise _Answer(answer)

    return idempotency_claim


def idempotent_route(*, db, scope, **options):
    """A FastAPI route class: APIRouter(route_class=idempotent_route(...))
    or @app.post(..., route_class_override=...). Its operations declare the
    Idempotency-Key header and the problem responses in the OpenAPI
    schema. scope may be Depends(dependency): the principal is what the
    dependency returns, solved once with the route's own dependencies."""
    from fastapi import Depends
    from fastapi.dependencies.utils import get_parameterless_sub_dependant
    from fastapi.routing import APIRoute

    settings = _settings(db, scope, **options)
    claim_dependency = _claim_dependency(settings, scope) if settings.scope_dependency else None

    class IdempotentRoute(APIRoute):
        def __init__(self, path, endpoint, **kwargs):
            # include_router makes the route again from this one's openapi_extra: merged once.
            extra = kwargs.get("openapi_extra") or {}
            if not any(parameter.get("name") == "Idempotency-Key" for parameter in extra.get("parameters", ())):
                kwargs["openapi_extra"] = _merge(_openapi_extra(settings), extra)
            super().__init__(path, endpoint, **kwargs)
            if claim_dependency is not None:
                # First: the claim precedes every other dependency's work.
                self.dependant.dependencies.insert(0, get_parameterless_sub_dependant(
                    depends=Depends(claim_dependency), path=self.path_format))

        def get_route_handler(self):
            handler = super().get_route_handler()

            async def idempotent_handler(request):
                return await _handle(settings, handler, request)

            return idempotent_handler

    return IdempotentRoute


__all__ = ["idempotent", "idempotent_route", "transaction", "replay", "problem", "read_key", "request_fingerprint",
           "SHARED_KEYS", "NO_PRINCIPAL_ERRORS", "DEFAULT_PROBLEM_BASE"]
