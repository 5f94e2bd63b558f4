"""A Django site for the tests and for the cross-package service: settings
as `django-admin startproject` writes them (CSRF middleware included), on
the database of PGHOST/PGPORT/PGDATABASE/PGUSER, and views behind
@idempotent. `python djsite.py PORT` serves it on 127.0.0.1:PORT."""
import functools
import logging
import os
import sys

import django
from django.conf import settings

if not settings.configured:
    settings.configure(
        DEBUG=False,
        SECRET_KEY="tests-only-not-secret",
        ALLOWED_HOSTS=["127.0.0.1", "localhost", "testserver"],
        INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "django.contrib.sessions"],
        # The MIDDLEWARE of a fresh `django-admin startproject`.
        MIDDLEWARE=[
            "django.middleware.security.SecurityMiddleware",
            "django.contrib.sessions.middleware.SessionMiddleware",
            "django.middleware.common.CommonMiddleware",
            "django.middleware.csrf.CsrfViewMiddleware",
            "django.contrib.auth.middleware.AuthenticationMiddleware",
            f"{__name__}.HeaderUser",  # tests only: X-Test-User authenticates
            "django.middleware.clickjacking.XFrameOptionsMiddleware",
        ],
        ROOT_URLCONF=__name__,
        USE_TZ=True,
        DATABASES={"default": {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": os.environ.get("PGDATABASE", ""),
            "USER": os.environ.get("PGUSER", ""),
            "HOST": os.environ.get("PGHOST", ""),
            "PORT": os.environ.get("PGPORT", ""),
        }},
        LOGGING_CONFIG=None,
    )
    django.setup()
    # Views that fail on purpose: their 500s are what the tests check.
    logging.getLogger("django.request").addHandler(logging.NullHandler())
    logging.getLogger("django.request").propagate = False
    logging.getLogger("idempotency_pg").addHandler(logging.NullHandler())  # refusals the tests cause

from django.db import connection, transaction  # noqa: E402
from django.http import HttpResponse, JsonResponse, StreamingHttpResponse  # noqa: E402
from django.urls import path  # noqa: E402
from django.views.decorators.csrf import csrf_exempt  # noqa: E402
from django.views.decorators.http import require_POST  # noqa: E402

from expiring import SHORT_TTL  # noqa: E402
from idempotency_pg.django import SHARED_KEYS, idempotent  # noqa: E402

HELD = {}  # text -> threading.Event a view waits for


class _TestUser:
    is_authenticated = True

    def __init__(self, pk):
        self.pk = pk


class HeaderUser:
    """Tests only: a request with X-Test-User: <id> is that user's (what a
    token authentication sets as request.user)."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        user_id = request.headers.get("X-Test-User")
        if user_id:
            request.user = _TestUser(int(user_id))
        return self.get_response(request)


def by_client(request):
    """The scope of the cross-package routes: the X-Client header, as the
    Node service reads it."""
    return request.headers.get("X-Client")


def create_tables():
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE IF NOT EXISTS py_notes (id bigserial PRIMARY KEY, text text NOT NULL)")
        cursor.execute("CREATE TABLE IF NOT EXISTS cross_orders (id bigserial PRIMARY KEY, item text NOT NULL,"
                       " quantity int NOT NULL)")


def insert_note(text):
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO py_notes (text) VALUES (%s) RETURNING id", [text])
        return cursor.fetchone()[0]


def body_of(request):
    import json
    return json.loads(request.body)


@csrf_exempt
@require_POST
@idempotent(scope=SHARED_KEYS)
def notes(request):
    data = body_of(request)
    note_id = insert_note(data["text"])
    if data["text"] in HELD:
        HELD[data["text"]].wait(30)
    response = JsonResponse({"id": note_id, "text": data["text"]}, status=201)
    response["Location"] = f"/notes/{note_id}"
    response["ETag"] = f'"note-{note_id}"'
    return response


@csrf_exempt
@idempotent(scope=SHARED_KEYS, wait_timeout="10s")
def notes_waiting(request):
    data = body_of(request)
    insert_note(data["text"])
    return JsonResponse({"text": data["text"]}, status=201)


@csrf_exempt
@idempotent(scope=SHARED_KEYS)
def status(request):
    data = body_of(request)
    insert_note(data["text"])
    return JsonResponse({"status": data["status"]}, status=data["status"])


@csrf_exempt
@idempotent(scope=SHARED_KEYS, store_validation_errors=True)
def status_validation_stored(request):
    data = body_of(request)
    insert_note(data["text"])
    return JsonResponse({"status": data["status"]}, status=data["status"])


class Declined(Exception):
    status = 402


@csrf_exempt
@idempotent(scope=SHARED_KEYS)
def throws(request):
    from django.http import Http404
    data = body_of(request)
    insert_note(data["text"])
    if data.get("kind") == "404":
        raise Http404("no such thing")
    raise Declined("insufficient funds")


@csrf_exempt
@idempotent(scope=SHARED_KEYS)
def view_db_error(request):
    data = body_of(request)
    insert_note(data["text"])
    with connection.cursor() as cursor:
        cursor.execute(f"DO $$ BEGIN RAISE EXCEPTION 'the view''s own error' USING ERRCODE = '{data['code']}'; END $$")
    return JsonResponse({})


@csrf_exempt
@idempotent(scope=SHARED_KEYS)
def body(request):
    import base64
    data = body_of(request)
    insert_note(data["text"])
    return HttpResponse(base64.b64decode(data["base64"]), content_type=data["type"])


@csrf_exempt
@idempotent(scope=SHARED_KEYS, max_body_bytes=64 * 1024)
def stream(request):
    data = body_of(request)

    def lines():
        # Runs while the decorator reads the response: in the transaction.
        insert_note(data["text"])
        for i in range(data["lines"]):
            yield f"{i},{'x' * 100}\n".encode()

    return StreamingHttpResponse(lines(), content_type="text/csv")


@require_POST
@idempotent(scope=SHARED_KEYS)
def csrf_protected(request):
    insert_note(body_of(request)["text"])
    return JsonResponse({}, status=201)


@csrf_exempt
@idempotent(scope=SHARED_KEYS, required=False)
def optional(request):
    insert_note(body_of(request)["text"])
    return JsonResponse({}, status=201)


@csrf_exempt
@require_POST
@idempotent(scope=by_client)
def cross_orders(request):
    """The Django side of the cross-package test: the same route as the
    Node service's."""
    data = body_of(request)
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO cross_orders (item, quantity) VALUES (%s, %s) RETURNING id",
                       [data["item"], data["quantity"]])
        order_id = cursor.fetchone()[0]
    response = JsonResponse({"order_id": order_id, "served_by": "django"}, status=201)
    response["Location"] = f"/api/orders/{order_id}"
    return response


@csrf_exempt
@require_POST
@idempotent(scope=by_client)
def cross_binary(request):
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO cross_orders (item, quantity) VALUES ('binary', 1)")
    return HttpResponse(bytes([0x25, 0x50, 0xFF, 0xFE, 0x00, 0x41]), content_type="application/octet-stream")


@csrf_exempt
@require_POST
@idempotent
def user_notes(request):
    """Keys scoped by the default: request.user."""
    data = body_of(request)
    note_id = insert_note(data["text"])
    return JsonResponse({"id": note_id, "text": data["text"], "user": request.user.pk}, status=201)


@csrf_exempt
@require_POST
@idempotent(scope=by_client)
def client_notes(request):
    data = body_of(request)
    note_id = insert_note(data["text"])
    return JsonResponse({"id": note_id, "text": data["text"]}, status=201)


def short_lived(view):
    """Tests only: the keys the view claims get expiring.SHORT_TTL, set
    LOCAL in a transaction around the decorator's (so that it holds through
    PgBouncer's transaction pooling too)."""

    @functools.wraps(view)
    def wrapper(request, *args, **kwargs):
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SELECT set_config('idempotency.ttl', %s, true)", [SHORT_TTL])
            return view(request, *args, **kwargs)

    return wrapper


@csrf_exempt
@require_POST
@short_lived
@idempotent(scope=by_client)
def short_lived_notes(request):
    data = body_of(request)
    note_id = insert_note(data["text"])
    return JsonResponse({"id": note_id, "text": data["text"]}, status=201)


@csrf_exempt
@require_POST
@idempotent(scope=SHARED_KEYS, ttl="7 days")
def week_notes(request):
    return JsonResponse({"id": insert_note(body_of(request)["text"])}, status=201)


@csrf_exempt
@require_POST
@idempotent(scope=lambda request: request.META["HTTP_X_CLIENT"])
def header_scoped_notes(request):
    return JsonResponse({"id": insert_note(body_of(request)["text"])}, status=201)


@csrf_exempt
@require_POST
@idempotent(scope=lambda request: request.auth.client_id)
def auth_scoped_notes(request):
    return JsonResponse({"id": insert_note(body_of(request)["text"])}, status=201)


urlpatterns = [
    path("week-notes", week_notes),
    path("header-scoped-notes", header_scoped_notes),
    path("auth-scoped-notes", auth_scoped_notes),
    path("short-lived-notes", short_lived_notes),
    path("user-notes", user_notes),
    path("client-notes", client_notes),
    path("notes", notes),
    path("notes-waiting", notes_waiting),
    path("status", status),
    path("status-validation-stored", status_validation_stored),
    path("throws", throws),
    path("view-db-error", view_db_error),
    path("body", body),
    path("stream", stream),
    path("csrf-protected", csrf_protected),
    path("optional", optional),
    path("api/orders", cross_orders),
    path("api/binary", cross_binary),
]


def serve(port):
    """Serves the site with wsgiref, one thread per request."""
    from socketserver import ThreadingMixIn
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

    from django.core.wsgi import get_wsgi_application

    class Server(ThreadingMixIn, WSGIServer):
        daemon_threads = True

    class QuietHandler(WSGIRequestHandler):
        def log_message(self, *args):
            pass

    create_tables()
    server = make_server("127.0.0.1", port, get_wsgi_application(), server_class=Server, handler_class=QuietHandler)
    print(f"listening on http://127.0.0.1:{server.server_port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    serve(int(sys.argv[1]))
