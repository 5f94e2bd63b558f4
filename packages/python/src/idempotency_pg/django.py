"""A Django view decorator that makes a view safe to retry with an
Idempotency-Key header.

    from django.views.decorators.csrf import csrf_exempt
    from idempotency_pg.django import idempotent

    @csrf_exempt          # an API called with tokens, not a cookie-session form
    @require_POST
    @idempotent           # each user's keys are their own (scope=user_scope)
    def create_payment(request):
        payment = Payment.objects.create(...)    # in the request's transaction
        return JsonResponse({"id": payment.pk}, status=201)

For a request with a key the decorator opens transaction.atomic(), claims the
key through the ORM's connection and runs the view inside that transaction.
When the view returns, the response is stored with the key (if the storing
policy says so) and the transaction commits; a response that is not stored,
and any exception the view raises, roll it back. Only the claim's own errors
become 409/422/400 answers: the view's errors, database errors included,
stay the view's.

Keys are scoped to the request's principal (idempotency_pg.scope): by
default request.user's primary key, so that one user's key never replays
another's response; an anonymous request is refused with 401
principal-required, as is one whose scope function raises one of
NO_PRINCIPAL_ERRORS. scope=lambda request: ... names another principal (an
API client, a tenant); scope=SHARED_KEYS shares the view's keys between
every client.

Every outcome is logged under the logger "idempotency_pg"
(idempotency_pg.log)."""
import functools
import logging

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import DEFAULT_DB_ALIAS, connections, transaction
from django.http import HttpResponse, JsonResponse

from .db import claim, complete, _ttl_setting, _wait_timeout_setting
from .errors import IdempotencyError, InvalidKey, KeyGone, KeyInProgress, KeyReused
from .fingerprint import wsgi_fingerprint
from .key import read_key
from .log import log_event, not_stored_reason
from .policy import DEFAULT_VALIDATION_STATUSES, is_stored
from .problems import DEFAULT_PROBLEM_BASE
from .scope import NO_PRINCIPAL_ERRORS, SHARED_KEYS, scope_text, scoped_key
from .stored import decode_body, stored_document

PROBLEM_BASE = DEFAULT_PROBLEM_BASE
REPLAY_HEADERS = ("Location", "ETag")
MAX_BODY_BYTES = 1024 * 1024


def problem(status, type_, title, detail, problem_base=PROBLEM_BASE, headers=None):
    response = JsonResponse({"type": problem_base + type_, "title": title, "status": status, "detail": detail},
                            status=status, content_type="application/problem+json")
    for name, value in (headers or {}).items():
        response[name] = value
    return response


def replay(document):
    """The response of a stored document, with Idempotent-Replayed: true."""
    if not isinstance(document, dict) or not isinstance(document.get("status"), int):
        raise TypeError("the stored response of this key is not an HTTP response document")
    response = HttpResponse(decode_body(document), status=document["status"])
    headers = document.get("headers") or {}
    if not any(name.lower() == "content-type" for name in headers):
        del response["Content-Type"]
    for name, value in headers.items():
        response[name] = ", ".join(value) if isinstance(value, list) else value
    response["Idempotent-Replayed"] = "true"
    return response


def user_scope(request):
    """The default scope: the primary key of the authenticated request.user;
    None (refused with 401) for an anonymous user."""
    user = getattr(request, "user", None)
    if user is None:
        raise ImproperlyConfigured(
            "@idempotent scopes keys to request.user by default, and this request has none: add "
            "django.contrib.auth's AuthenticationMiddleware, or pass scope=lambda request: ... (the request's "
            "principal), or scope=SHARED_KEYS to share the view's keys between every client")
    if not user.is_authenticated:
        return None
    return user.pk if isinstance(user.pk, int) else str(user.pk)


def principal_required(problem_base=PROBLEM_BASE):
    return problem(401, "principal-required", "Request without a principal",
                   "This route keeps the Idempotency-Keys of each client apart and could not tell who sent "
                   "this request.", problem_base)


class _TooLarge(Exception):
    pass


def _read_body(response, limit):
    """The body's bytes; a streaming response is read to its end here,
    inside the transaction."""
    if not response.streaming:
        body = response.content
        if len(body) > limit:
            raise _TooLarge()
        return body
    chunks, size = [], 0
    try:
        for chunk in response.streaming_content:
            size += len(chunk)
            if size > limit:
                raise _TooLarge()
            chunks.append(bytes(chunk))
    finally:
        # The iterator's own closers, not response.close(): that sends
        # request_finished, which closes the database connection mid-transaction.
        for close in getattr(response, "_resource_closers", ()):
            close()
    return b"".join(chunks)


def _buffered(response, body):
    """A streaming response made whole: same status and headers."""
    if not response.streaming:
        return response
    whole = HttpResponse(body, status=response.status_code)
    del whole["Content-Type"]
    for name, value in response.items():
        whole[name] = value
    for name, value in response.cookies.items():
        whole.cookies[name] = value
    return whole


def _replayable_headers(response, wanted):
    return {name: value for name, value in response.items() if name.lower() in wanted}


class _Refused(Exception):
    """Leaves the atomic block (rolling it back) with an answer."""

    def __init__(self, response):
        super().__init__()
        self.response = response


def _problem_base(problem_base):
    """The view's problem_base, else the project's IDEMPOTENCY_PROBLEM_BASE
    setting, else the default."""
    if problem_base is not None:
        return problem_base
    return getattr(settings, "IDEMPOTENCY_PROBLEM_BASE", None) or DEFAULT_PROBLEM_BASE


def _principal(scope, request):
    """The principal's text, or None with why there is none."""
    try:
        principal = scope(request)
    except NO_PRINCIPAL_ERRORS as error:
        return None, f"the scope function raised {type(error).__name__}"
    text = scope_text(principal)
    return text, None if text is not None else "the scope function returned no principal"


_CLAIM_EVENTS = {KeyInProgress: ("conflict", logging.INFO), KeyGone: ("gone", logging.INFO),
                 KeyReused: ("mismatch", logging.WARNING)}


def idempotent(view=None, *, scope=user_scope, required=True, replay_headers=REPLAY_HEADERS, retry_after=1,
               store_validation_errors=False, validation_statuses=DEFAULT_VALIDATION_STATUSES,
               wait_timeout=None, max_body_bytes=MAX_BODY_BYTES, problem_base=None, using=None, ttl=None):
    """Decorates a view; usable bare (@idempotent) or with options:

    scope                    the request's principal: a function of the
                             request returning a str or an int (default
                             user_scope: request.user's primary key); None
                             or '' refuses the request with 401.
                             SHARED_KEYS shares the keys between clients
    required                 answer 400 without a key (default True); False
                             runs key-less requests in a plain transaction
                             under the same policy, storing nothing
    replay_headers           response headers stored and replayed besides
                             Content-Type (default Location and ETag)
    retry_after              seconds in the Retry-After of a 409 (default 1)
    store_validation_errors  store 400/422 answers (default False)
    validation_statuses      what counts as a validation failure
    wait_timeout             idempotency.wait_timeout for the claim: seconds,
                             or a text such as '2s'; a duplicate waits for
                             the first request, then replays it
    ttl                      idempotency.ttl for the claim: how long the
                             key and its response are kept (seconds, a
                             timedelta, or a text such as '7 days')
    max_body_bytes           largest response stored (default 1 MiB); a
                             larger one is refused with 500
    problem_base             prefix of the problem documents' type URIs
                             (default: the IDEMPOTENCY_PROBLEM_BASE setting,
                             else urn:idempotency:problem:)
    using                    the database alias (default 'default')
    """
    options = dict(scope=scope, required=required, replay_headers=replay_headers, retry_after=retry_after,
                   store_validation_errors=store_validation_errors, validation_statuses=validation_statuses,
                   wait_timeout=wait_timeout, max_body_bytes=max_body_bytes, problem_base=problem_base, using=using,
                   ttl=ttl)
    if view is None:
        return functools.partial(idempotent, **options)
    if scope is not SHARED_KEYS and not callable(scope):
        raise TypeError("scope must be a function of the request (its principal) or SHARED_KEYS")
    if wait_timeout is not None:
        _wait_timeout_setting(wait_timeout)  # a bad value fails at import, not at the first request
    if ttl is not None:
        _ttl_setting(ttl)
    wanted = {"content-type", *(name.lower() for name in replay_headers)}
    alias = using or DEFAULT_DB_ALIAS

    def problem_for(error, base):
        if isinstance(error, KeyInProgress):
            return problem(409, "request-in-progress", "A request with this Idempotency-Key is still being processed",
                           f"Retry the same request with the same key after {retry_after} s.", base,
                           {"Retry-After": str(retry_after)})
        if isinstance(error, KeyGone):
            return problem(410, "request-already-ran", "This request already ran; its response is no longer kept",
                           "A request with this Idempotency-Key was processed before and its response has expired; "
                           "it is not run again.", base)
        if isinstance(error, KeyReused):
            return problem(422, "idempotency-key-reused", "Idempotency-Key reused with a different request",
                           "This key was used for another request; use a new key for a new request.", base)
        return problem(400, "invalid-idempotency-key", "Invalid Idempotency-Key", str(error), base)

    def run(request, args, kwargs, key, request_hash, base):
        method, path = request.method, request.path
        with transaction.atomic(using=alias):
            if key is not None:
                try:
                    with connections[alias].cursor() as cursor:
                        claimed = claim(cursor, key, request_hash, wait_timeout, ttl)
                except IdempotencyError as error:
                    answer = problem_for(error, base)
                    event, level = _CLAIM_EVENTS.get(type(error), ("invalid-key", logging.INFO))
                    log_event(level, event, method, path, key, answer.status_code)
                    raise _Refused(answer) from error
                if claimed.replayed:
                    answer = replay(claimed.response)
                    log_event(logging.INFO, "replayed", method, path, key, answer.status_code)
                    return answer
            try:
                response = view(request, *args, **kwargs)
            except BaseException as error:
                if key is not None:
                    log_event(logging.INFO, "not-stored", method, path, key,
                              reason=f"the view raised {type(error).__name__}")
                raise
            try:
                body = _read_body(response, max_body_bytes)
            except _TooLarge:
                log_event(logging.WARNING, "not-stored", method, path, key, 500,
                          f"the response is larger than max_body_bytes ({max_body_bytes})")
                raise _Refused(problem(
                    500, "response-too-large", "Response too large to store",
                    f"The response is larger than {max_body_bytes} bytes and cannot be stored for replay; "
                    "nothing was committed.", base))
            response = _buffered(response, body)
            if not is_stored(response.status_code, store_validation_errors, validation_statuses):
                transaction.set_rollback(True, using=alias)
                if key is not None:
                    log_event(logging.INFO, "not-stored", method, path, key, response.status_code,
                              not_stored_reason(response.status_code))
            elif key is not None:
                with connections[alias].cursor() as cursor:
                    complete(cursor, key, stored_document(
                        response.status_code, _replayable_headers(response, wanted), body))
                log_event(logging.DEBUG, "stored", method, path, key, response.status_code)
            return response

    @functools.wraps(view)
    def wrapper(request, *args, **kwargs):
        base = _problem_base(problem_base)
        header = read_key(request.META)
        if header.error is not None:
            log_event(logging.INFO, "invalid-key", request.method, request.path, status=400, reason=header.error)
            return problem(400, "invalid-idempotency-key", "Invalid Idempotency-Key", header.error, base)
        if header.missing and required:
            log_event(logging.INFO, "invalid-key", request.method, request.path, status=400,
                      reason="no Idempotency-Key header")
            return problem(400, "missing-idempotency-key", "Missing Idempotency-Key header",
                           "Send a unique Idempotency-Key with this request and repeat it on retries.", base)
        key = header.key
        if key is not None and scope is not SHARED_KEYS:
            principal, why = _principal(scope, request)
            if principal is None:
                log_event(logging.INFO, "principal-required", request.method, request.path, status=401, reason=why)
                return principal_required(base)
            key = scoped_key(principal, key)
        request_hash = wsgi_fingerprint(request.META, request.body)
        try:
            return run(request, args, kwargs, key, request_hash, base)
        except _Refused as refused:
            return refused.response

    return wrapper


__all__ = ["idempotent", "replay", "problem", "user_scope", "principal_required", "SHARED_KEYS", "InvalidKey",
           "KeyGone", "KeyInProgress", "KeyReused", "NO_PRINCIPAL_ERRORS", "DEFAULT_PROBLEM_BASE"]
