"""A view decorator that makes a Django view safe to retry with an
Idempotency-Key header, on top of idempotency.claim and idempotency.complete.

    @require_POST
    @idempotent
    def create_payment(request):
        ...                       # ORM writes, in the request's transaction
        return JsonResponse(payment, status=201)

For a request with a key the decorator opens ``transaction.atomic()``, claims
the key through the ORM's connection and runs the view inside that
transaction. The view's response (status, the chosen headers, body) is stored
with idempotency.complete before the transaction commits; a retry with the
same key gets it again, with ``Idempotent-Replayed: true``. 5xx responses and
exceptions roll the transaction back and store nothing, so a retry runs the
view again.

Errors map to HTTP by SQLSTATE only: IK409 (the key is in progress in
another transaction) is 409 with Retry-After, IK422 (the key was used for
another request) is 422; both are RFC 9457 problem documents.
"""
import functools
import hashlib
import json

from django.db import DatabaseError, connection, transaction
from django.http import HttpResponse, JsonResponse

MAX_KEY_BYTES = 255
STORED_HEADERS = ("Content-Type", "Location")
RETRY_AFTER_SECONDS = 1
PROBLEM_BASE = "https://idempotency.example/problems/"

KEY_IN_PROGRESS = "IK409"
KEY_REUSED = "IK422"
INVALID_KEY = "22023"  # empty, or longer than 255 bytes


def problem(status, type_, title, detail, headers=None):
    response = JsonResponse(
        {"type": PROBLEM_BASE + type_, "title": title, "status": status, "detail": detail},
        status=status,
        content_type="application/problem+json",
    )
    for name, value in (headers or {}).items():
        response[name] = value
    return response


def invalid_key():
    return problem(400, "invalid-idempotency-key", "Invalid Idempotency-Key",
                   f"An Idempotency-Key must be 1 to {MAX_KEY_BYTES} bytes long.")


def request_hash(request):
    """What makes two requests "the same request" for a key: method, path
    with its query, and the body's bytes."""
    digest = hashlib.sha256(f"{request.method}\n{request.get_full_path()}\n".encode())
    digest.update(request.body)
    return digest.hexdigest()


def claim(key, request_hash):
    """Claims key for this transaction: (False, None) to run the view, or
    (True, stored response) to replay. The response is read as text: Django
    leaves jsonb undecoded on its connections."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT replayed, response::text FROM idempotency.claim(%s, %s)",
                       [key, request_hash])
        replayed, response = cursor.fetchone()
        return replayed, json.loads(response) if replayed else None


def complete(key, stored):
    with connection.cursor() as cursor:
        cursor.execute("SELECT idempotency.complete(%s, %s::jsonb)", [key, json.dumps(stored)])


def capture(response, stored_headers):
    """The parts of a response that are stored and replayed. The body is
    stored as text: views behind the decorator answer JSON, HTML or text."""
    if response.streaming:
        raise TypeError("a streaming response cannot be stored for replay")
    return {
        "status": response.status_code,
        "headers": {name.lower(): response[name] for name in stored_headers if response.has_header(name)},
        "body": response.content.decode(response.charset),
    }


def replay(stored):
    response = HttpResponse(stored["body"], status=stored["status"])
    if "content-type" not in stored["headers"]:
        del response["Content-Type"]
    for name, value in stored["headers"].items():
        response[name] = value
    response["Idempotent-Replayed"] = "true"
    return response


def problem_for(error, retry_after):
    """The answer to a database error raised by the claim, or None."""
    code = getattr(error.__cause__, "pgcode", None)
    if code == KEY_IN_PROGRESS:
        return problem(409, "request-in-progress",
                       "A request with this Idempotency-Key is still being processed",
                       f"Retry the same request with the same key after {retry_after} s.",
                       {"Retry-After": str(retry_after)})
    if code == KEY_REUSED:
        return problem(422, "idempotency-key-reused", "Idempotency-Key reused with a different request",
                       "This key was used for another request; use a new key for a new request.")
    if code == INVALID_KEY:
        return invalid_key()
    return None


def run_in_transaction(view, request, args, kwargs, key, stored_headers):
    with transaction.atomic():
        if key is not None:
            replayed, stored = claim(key, request_hash(request))
            if replayed:
                return replay(stored)
        response = view(request, *args, **kwargs)
        if response.status_code >= 500:
            transaction.set_rollback(True)
        elif key is not None:
            complete(key, capture(response, stored_headers))
        return response


def idempotent(view=None, *, required=True, stored_headers=STORED_HEADERS,
               retry_after=RETRY_AFTER_SECONDS):
    """Decorates a view; usable bare (@idempotent) or with options:

    required        answer 400 when the header is missing (default True);
                    when False, a request without a key runs in a plain
                    transaction and nothing is stored
    stored_headers  response headers stored and replayed besides status and
                    body (default Content-Type and Location)
    retry_after     seconds a client should wait after a 409 (default 1)
    """
    if view is None:
        return functools.partial(idempotent, required=required, stored_headers=stored_headers,
                                 retry_after=retry_after)

    @functools.wraps(view)
    def wrapper(request, *args, **kwargs):
        key = request.headers.get("Idempotency-Key")
        if key is None and required:
            return problem(400, "missing-idempotency-key", "Missing Idempotency-Key header",
                           "Send a unique Idempotency-Key with this request and repeat it on retries.")
        if key is not None and not 1 <= len(key.encode()) <= MAX_KEY_BYTES:
            return invalid_key()
        try:
            return run_in_transaction(view, request, args, kwargs, key, stored_headers)
        except DatabaseError as error:
            answer = problem_for(error, retry_after)
            if answer is None:
                raise
            return answer

    return wrapper
