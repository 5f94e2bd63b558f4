"""The Starlette endpoint decorator and the FastAPI route class against a
real database, over asyncpg and psycopg 3's async connections, called
in-process as an ASGI server calls them; and the async helpers."""
import asyncio
import base64
import datetime
import json
import logging
import os
import tempfile
import unittest
import urllib.parse
import uuid
from contextlib import asynccontextmanager

import asyncpg
import psycopg
from fastapi import APIRouter, Depends, FastAPI, Header, HTTPException
from pydantic import BaseModel
from starlette.applications import Starlette
from starlette.authentication import AuthCredentials, AuthenticationBackend, SimpleUser
from starlette.background import BackgroundTask
from starlette.middleware import Middleware
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, StreamingResponse
from starlette.routing import Route

from expiring import SHORT_TTL
from idempotency_pg import SHARED_KEYS, SealedError, fingerprint, key_ref, scoped_key
from idempotency_pg import aio
from idempotency_pg.starlette import idempotent, idempotent_route, request_fingerprint, transaction

PROBLEM_BASE = "urn:idempotency:problem:"  # the documented default (idempotency_pg.problems)
# The same document as the Node and Go packages'.
GONE_PROBLEM = {"type": PROBLEM_BASE + "request-already-ran",
                "title": "This request already ran; its response is no longer kept", "status": 410,
                "detail": "A request with this Idempotency-Key was processed before and its response has expired; "
                          "it is not run again."}
# Refusals the tests cause on purpose are logged at WARNING; kept off stderr.
logging.getLogger("idempotency_pg").addHandler(logging.NullHandler())
SHARED = os.environ.get("SHARED_DIR", os.path.join(os.path.dirname(__file__), "..", "..", "shared"))


def dsn():
    """Both drivers read PGHOST, PGPORT, PGDATABASE and PGUSER."""
    return ""


class Answer:
    def __init__(self, status, headers, body):
        self.status, self.headers, self.body = status, headers, body

    def header(self, name):
        return next((value for key, value in self.headers if key.lower() == name.lower()), None)

    def json(self):
        return json.loads(self.body)


async def call(app, path, key=None, data=None, headers=(), method="POST", body=None, extensions=None):
    """One request through the ASGI app, as a server makes it."""
    body = json.dumps(data).encode() if body is None else body
    target, _, query = path.partition("?")
    header_list = [("content-type", "application/json"), *headers]
    if key is not None:
        header_list.append(("idempotency-key", key))
    header_list.append(("content-length", str(len(body))))
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
             "path": urllib.parse.unquote(target), "raw_path": target.encode("latin1"),
             "query_string": query.encode("latin1"), "root_path": "",
             "headers": [(name.lower().encode("latin1"), value.encode("latin1")) for name, value in header_list],
             "client": ("127.0.0.1", 40000), "server": ("127.0.0.1", 80), "app": None}
    scope.pop("app")
    if extensions is not None:
        scope["extensions"] = extensions
    received = False

    async def receive():
        nonlocal received
        if not received:
            received = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.sleep(3600)

    messages = []

    async def send(message):
        messages.append(message)

    try:
        await app(scope, receive, send)
    except Exception:  # Starlette re-raises after its 500 answer
        if not messages:
            raise
    start = messages[0]
    return Answer(start["status"], [(k.decode("latin1"), v.decode("latin1")) for k, v in start["headers"]],
                  b"".join(message.get("body", b"") for message in messages[1:]))


@asynccontextmanager
async def lifespan_of(app):
    """The app's lifespan, started and shut down as an ASGI server does."""
    inbox, outbox = asyncio.Queue(), asyncio.Queue()
    await inbox.put({"type": "lifespan.startup"})
    task = asyncio.create_task(app({"type": "lifespan", "asgi": {"version": "3.0"}}, inbox.get, outbox.put))
    started = await outbox.get()
    assert started["type"] == "lifespan.startup.complete", started
    try:
        yield
    finally:
        await inbox.put({"type": "lifespan.shutdown"})
        await outbox.get()
        await task


class BearerUser(AuthenticationBackend):
    """Starlette's authentication: Authorization: Bearer <user>; without
    it request.user is an UnauthenticatedUser, whose identity raises."""

    async def authenticate(self, conn):
        authorization = conn.headers.get("authorization", "")
        if authorization.startswith("Bearer "):
            return AuthCredentials(["authenticated"]), User(authorization[len("Bearer "):])
        return None


class User(SimpleUser):
    @property
    def identity(self):
        return self.username


class AsgiTests(unittest.IsolatedAsyncioTestCase):
    async def asyncSetUp(self):
        self.pool = await asyncpg.create_pool(min_size=1, max_size=4)
        await self.pool.execute("CREATE TABLE IF NOT EXISTS asgi_notes (id bigserial PRIMARY KEY, text text NOT NULL)")
        self.events = {}
        self.app = self.starlette_app()

    async def asyncTearDown(self):
        await self.pool.close()

    async def count(self, text):
        return await self.pool.fetchval("SELECT count(*) FROM asgi_notes WHERE text = $1", text)

    async def state(self, key):
        return await self.pool.fetchval("SELECT state FROM idempotency.lookup($1)", key)

    def starlette_app(self):
        by_client = lambda request: request.headers.get("x-client")  # noqa: E731
        pool = self.pool

        async def insert(request, text):
            return await request.state.db.fetchval("INSERT INTO asgi_notes (text) VALUES ($1) RETURNING id", text)

        @idempotent(db=pool, scope=by_client)
        async def notes(request):
            data = await request.json()
            note_id = await insert(request, data["text"])
            return JSONResponse({"id": note_id, "text": data["text"]}, status_code=data.get("status", 201),
                                headers={"Location": f"/notes/{note_id}", "X-Other": "not stored"})

        @idempotent(db=pool, scope=by_client)
        async def throws(request):
            await insert(request, (await request.json())["text"])
            raise RuntimeError("failed after writing")

        @idempotent(db=pool, scope=SHARED_KEYS, max_body_bytes=4096)
        async def stream(request):
            data = await request.json()

            async def lines():
                await request.state.db.execute("INSERT INTO asgi_notes (text) VALUES ($1)", data["text"])
                for i in range(data["lines"]):
                    yield f"{i},{'x' * 100}\n"

            return StreamingResponse(lines(), media_type="text/csv")

        events = self.events

        @idempotent(db=pool, scope=SHARED_KEYS)
        async def background(request):
            text = (await request.json())["text"]
            await insert(request, text)

            async def after():
                events["committed"] = await pool.fetchval("SELECT count(*) FROM asgi_notes WHERE text = $1", text)
                try:
                    await request.state.db.fetchval("SELECT 1")
                    events["sealed"] = False
                except SealedError:
                    events["sealed"] = True

            return JSONResponse({}, status_code=201, background=BackgroundTask(after))

        async def connect():
            return await psycopg.AsyncConnection.connect(dsn())

        @idempotent(db=connect, scope=by_client)
        async def pg_notes(request):
            data = await request.json()
            async with request.state.db.cursor() as cursor:
                await cursor.execute("INSERT INTO asgi_notes (text) VALUES (%s) RETURNING id", [data["text"]])
                (note_id,) = await cursor.fetchone()
            return JSONResponse({"id": note_id}, status_code=201)

        async def connect_short_lived():
            """A connection whose keys expire at once (and are remembered)."""
            return await asyncpg.connect(server_settings={"idempotency.ttl": SHORT_TTL})

        @idempotent(db=connect_short_lived, scope=by_client)
        async def short_lived_notes(request):
            data = await request.json()
            note_id = await insert(request, data["text"])
            return JSONResponse({"id": note_id, "text": data["text"]}, status_code=201)

        @idempotent(db=pool, scope=SHARED_KEYS)
        async def own_sql_error(request):
            code = (await request.json())["code"]
            await request.state.db.execute(
                f"DO $$ BEGIN RAISE EXCEPTION 'the endpoint''s own error' USING ERRCODE = '{code}'; END $$")
            return JSONResponse({})

        return Starlette(routes=[Route(path, endpoint, methods=["POST"]) for path, endpoint in (
            ("/notes", notes), ("/throws", throws), ("/stream", stream), ("/background", background),
            ("/pg-notes", pg_notes), ("/short-lived-notes", short_lived_notes), ("/own-sql-error", own_sql_error))])

    async def test_retry_replays_and_the_first_answer_has_no_replayed_header(self):
        key, text = str(uuid.uuid4()), f"asgi {uuid.uuid4()}"
        first = await call(self.app, "/notes", key, {"text": text}, [("X-Client", "alice")])
        self.assertEqual(first.status, 201)
        self.assertIsNone(first.header("Idempotent-Replayed"))
        retry = await call(self.app, "/notes", key, {"text": text}, [("X-Client", "alice")])
        self.assertEqual((retry.status, retry.body), (201, first.body))
        self.assertEqual(retry.header("Idempotent-Replayed"), "true")
        self.assertEqual(retry.header("Location"), first.header("Location"))
        self.assertEqual(retry.header("Content-Type"), "application/json")
        self.assertIsNone(retry.header("X-Other"))
        self.assertEqual(await self.count(text), 1)
        self.assertEqual(await self.state(scoped_key("alice", key)), "done")

    async def test_another_client_gets_its_own_run_and_no_422(self):
        key, text = str(uuid.uuid4()), f"asgi scope {uuid.uuid4()}"
        alice = await call(self.app, "/notes", key, {"text": text}, [("X-Client", "alice")])
        bob = await call(self.app, "/notes", key, {"text": text}, [("X-Client", "bob")])
        self.assertEqual(bob.status, 201)
        self.assertIsNone(bob.header("Idempotent-Replayed"))
        self.assertNotEqual(bob.json()["id"], alice.json()["id"])
        probe = await call(self.app, "/notes", key, {"text": text + " other"}, [("X-Client", "mallory")])
        self.assertEqual(probe.status, 201)
        reused = await call(self.app, "/notes", key, {"text": text + " other"}, [("X-Client", "alice")])
        self.assertEqual(reused.status, 422)
        self.assertEqual(reused.header("Content-Type"), "application/problem+json")
        self.assertEqual(reused.json()["type"], PROBLEM_BASE + "idempotency-key-reused")

    async def test_a_retry_after_the_response_expired_is_410_and_runs_nothing_another_body_is_422(self):
        key, text = str(uuid.uuid4()), f"asgi gone {uuid.uuid4()}"
        alice = [("X-Client", "alice")]
        self.assertEqual((await call(self.app, "/short-lived-notes", key, {"text": text}, alice)).status, 201)
        deadline = asyncio.get_running_loop().time() + 15
        while await self.state(scoped_key("alice", key)) != "gone":
            self.assertLess(asyncio.get_running_loop().time(), deadline, "the key to be gone")
            await asyncio.sleep(0.02)
        retry = await call(self.app, "/short-lived-notes", key, {"text": text}, alice)
        self.assertEqual(retry.status, 410)
        self.assertEqual(retry.header("Content-Type"), "application/problem+json")
        self.assertIsNone(retry.header("Idempotent-Replayed"))
        self.assertEqual(retry.json(), GONE_PROBLEM)
        self.assertEqual(await self.count(text), 1, "the endpoint did not run again")
        other = await call(self.app, "/short-lived-notes", key, {"text": text + " other"}, alice)
        self.assertEqual((other.status, other.json()["type"]), (422, PROBLEM_BASE + "idempotency-key-reused"))
        self.assertEqual(await self.count(text + " other"), 0)
        bob = await call(self.app, "/short-lived-notes", key, {"text": text}, [("X-Client", "bob")])
        self.assertEqual(bob.status, 201)
        self.assertEqual(await self.count(text), 2)

    async def test_the_endpoints_own_sql_errors_stay_the_endpoints(self):
        for code in ("IK409", "IK410", "IK422"):
            answer = await call(self.app, "/own-sql-error", str(uuid.uuid4()), {"code": code})
            self.assertEqual(answer.status, 500, code)
            self.assertNotEqual(answer.header("Content-Type"), "application/problem+json", code)

    async def test_refusals_before_the_endpoint_runs(self):
        text = f"refused {uuid.uuid4()}"
        nobody = await call(self.app, "/notes", str(uuid.uuid4()), {"text": text})
        self.assertEqual((nobody.status, nobody.json()["type"]), (401, PROBLEM_BASE + "principal-required"))
        missing = await call(self.app, "/notes", None, {"text": text}, [("X-Client", "alice")])
        self.assertEqual((missing.status, missing.json()["type"]), (400, PROBLEM_BASE + "missing-idempotency-key"))
        bad = await call(self.app, "/notes", "caf\xc3\xa9", {"text": text}, [("X-Client", "alice")])
        self.assertEqual((bad.status, bad.json()["type"]), (400, PROBLEM_BASE + "invalid-idempotency-key"))
        self.assertEqual(await self.count(text), 0)

    async def test_an_exception_and_a_5xx_roll_back(self):
        key, text = str(uuid.uuid4()), f"throws {uuid.uuid4()}"
        answer = await call(self.app, "/throws", key, {"text": text}, [("X-Client", "alice")])
        self.assertEqual(answer.status, 500)
        self.assertEqual(await self.count(text), 0)
        self.assertEqual(await self.state(scoped_key("alice", key)), "absent")
        key, text = str(uuid.uuid4()), f"503 {uuid.uuid4()}"
        for _ in range(2):
            answer = await call(self.app, "/notes", key, {"text": text, "status": 503}, [("X-Client", "alice")])
            self.assertEqual(answer.status, 503)
            self.assertIsNone(answer.header("Idempotent-Replayed"))
        self.assertEqual(await self.count(text), 0)

    async def test_a_streaming_response_is_read_in_the_transaction_stored_and_replayed(self):
        key, text = str(uuid.uuid4()), f"stream {uuid.uuid4()}"
        first = await call(self.app, "/stream", key, {"text": text, "lines": 20})
        self.assertEqual(first.status, 200)
        self.assertEqual(first.body.count(b"\n"), 20)
        retry = await call(self.app, "/stream", key, {"text": text, "lines": 20})
        self.assertEqual((retry.body, retry.header("Idempotent-Replayed")), (first.body, "true"))
        self.assertTrue(retry.header("Content-Type").startswith("text/csv"))
        self.assertEqual(await self.count(text), 1)
        big_key, big = str(uuid.uuid4()), f"big stream {uuid.uuid4()}"
        answer = await call(self.app, "/stream", big_key, {"text": big, "lines": 100})
        self.assertEqual((answer.status, answer.json()["type"]), (500, PROBLEM_BASE + "response-too-large"))
        self.assertEqual(await self.count(big), 0)
        self.assertEqual(await self.state(big_key), "absent")

    async def test_background_tasks_run_after_the_commit_with_the_connection_sealed(self):
        text = f"background {uuid.uuid4()}"
        answer = await call(self.app, "/background", str(uuid.uuid4()), {"text": text})
        self.assertEqual(answer.status, 201)
        self.assertEqual(self.events, {"committed": 1, "sealed": True})

    async def test_psycopg_async_connections(self):
        key, text = str(uuid.uuid4()), f"psycopg {uuid.uuid4()}"
        first = await call(self.app, "/pg-notes", key, {"text": text}, [("X-Client", "alice")])
        self.assertEqual(first.status, 201)
        retry = await call(self.app, "/pg-notes", key, {"text": text}, [("X-Client", "alice")])
        self.assertEqual((retry.body, retry.header("Idempotent-Replayed")), (first.body, "true"))
        other = await call(self.app, "/pg-notes", key, {"text": text}, [("X-Client", "bob")])
        self.assertIsNone(other.header("Idempotent-Replayed"))
        self.assertEqual(await self.count(text), 2)

    async def test_fastapi_response_model_serialized_in_the_transaction(self):
        class Note(BaseModel):
            id: int
            text: str

        class NewNote(BaseModel):
            text: str
            fail: bool = False

        router = APIRouter(route_class=idempotent_route(db=self.pool, scope=lambda request: request.headers.get(
            "x-client")))

        @router.post("/items", status_code=201, response_model=Note)
        async def create(note: NewNote, db=Depends(transaction)):
            note_id = await db.fetchval("INSERT INTO asgi_notes (text) VALUES ($1) RETURNING id", note.text)
            if note.fail:
                raise HTTPException(status_code=402, detail="declined")
            return {"id": note_id, "text": note.text, "secret": "not in the model"}

        app = FastAPI()
        app.include_router(router)
        key, text = str(uuid.uuid4()), f"fastapi {uuid.uuid4()}"
        first = await call(app, "/items", key, {"text": text}, [("X-Client", "alice")])
        self.assertEqual(first.status, 201)
        self.assertEqual(set(first.json()), {"id", "text"})
        retry = await call(app, "/items", key, {"text": text}, [("X-Client", "alice")])
        self.assertEqual((retry.body, retry.header("Idempotent-Replayed")), (first.body, "true"))
        stored = json.loads(await self.pool.fetchval("SELECT response::text FROM idempotency.lookup($1)",
                                                     scoped_key("alice", key)))
        self.assertEqual(stored["body"].encode(), first.body)
        failed_text = f"declined {uuid.uuid4()}"
        failed = await call(app, "/items", str(uuid.uuid4()), {"text": failed_text, "fail": True},
                            [("X-Client", "alice")])
        self.assertEqual(failed.status, 402)
        self.assertEqual(await self.count(failed_text), 0)
        self.assertEqual(await self.count(text), 1)

    async def test_async_with_idempotency_runs_once(self):
        key, runs = f"message-{uuid.uuid4()}", []

        async def work(db):
            runs.append(1)
            return {"balance": (await aio.fetchrow(db, "SELECT %s::int", [9700]))[0]}

        async with self.pool.acquire() as conn:
            self.assertEqual(await aio.with_idempotency(conn, key, work), (False, {"balance": 9700}))
            self.assertEqual(await aio.with_idempotency(conn, key, work), (True, {"balance": 9700}))
        conn = await psycopg.AsyncConnection.connect(dsn())
        try:
            self.assertEqual(await aio.with_idempotency(conn, key + "-pg", work), (False, {"balance": 9700}))
            self.assertEqual(await aio.with_idempotency(conn, key + "-pg", work), (True, {"balance": 9700}))
        finally:
            await conn.close()
        self.assertEqual(len(runs), 2)

    async def lookup(self, key):
        return await self.pool.fetchrow("SELECT state, created_at, expires_at FROM idempotency.lookup($1)", key)

    async def test_fastapi_with_a_pool_made_in_the_lifespan(self):
        @asynccontextmanager
        async def lifespan(app):
            app.state.pool = await asyncpg.create_pool(min_size=1, max_size=2)
            yield
            await app.state.pool.close()

        router = APIRouter(route_class=idempotent_route(db=lambda request: request.app.state.pool,
                                                        scope=lambda request: request.headers["x-client"]))

        @router.post("/notes", status_code=201)
        async def create(request: Request, db=Depends(transaction)):
            text = (await request.json())["text"]
            return {"id": await db.fetchval("INSERT INTO asgi_notes (text) VALUES ($1) RETURNING id", text)}

        app = FastAPI()
        app.router.lifespan_context = lifespan
        app.include_router(router)
        key, text = str(uuid.uuid4()), f"lifespan {uuid.uuid4()}"
        async with lifespan_of(app):
            first = await call(app, "/notes", key, {"text": text}, [("X-Client", "alice")])
            retry = await call(app, "/notes", key, {"text": text}, [("X-Client", "alice")])
        self.assertEqual(first.status, 201, first.body)
        self.assertEqual((retry.status, retry.body, retry.header("Idempotent-Replayed")), (201, first.body, "true"))
        self.assertEqual(await self.count(text), 1)
        before_startup = await call(app, "/notes", str(uuid.uuid4()), {"text": text}, [("X-Client", "alice")])
        self.assertEqual(before_startup.status, 500, "no pool: db(request) returned None")
        with self.assertRaises(TypeError):
            idempotent_route(db=None, scope=SHARED_KEYS)
        with self.assertRaises(TypeError):
            idempotent_route(db="pool", scope=SHARED_KEYS)

    async def test_a_routes_ttl_is_its_keys_ttl(self):
        @idempotent(db=self.pool, scope=SHARED_KEYS, ttl="7 days")
        async def week(request):
            return JSONResponse({"kept": "a week"}, status_code=201)

        @idempotent(db=self.pool, scope=SHARED_KEYS, ttl=datetime.timedelta(minutes=90))
        async def ninety_minutes(request):
            return JSONResponse({"kept": "90 minutes"}, status_code=201)

        @idempotent(db=self.pool, scope=SHARED_KEYS)
        async def default(request):
            return JSONResponse({"kept": "the default"}, status_code=201)

        app = Starlette(routes=[Route("/week", week, methods=["POST"]), Route("/default", default, methods=["POST"]),
                                Route("/ninety", ninety_minutes, methods=["POST"])])
        for path, ttl in (("/week", datetime.timedelta(days=7)), ("/ninety", datetime.timedelta(minutes=90)),
                          ("/default", datetime.timedelta(hours=24))):
            key = str(uuid.uuid4())
            self.assertEqual((await call(app, path, key, {})).status, 201)
            row = await self.lookup(key)
            self.assertEqual((row["state"], row["expires_at"] - row["created_at"]), ("done", ttl), path)
        for bad in (0, -1, "", True, [1]):
            with self.assertRaises((TypeError, ValueError), msg=repr(bad)):
                idempotent(default, db=self.pool, scope=SHARED_KEYS, ttl=bad)

    async def test_every_outcome_is_logged_with_the_key_hashed(self):
        alice = [("X-Client", "alice")]
        key, text = f"raw-key-{uuid.uuid4()}", f"secret body {uuid.uuid4()}"
        ref = key_ref(scoped_key("alice", key))
        with self.assertLogs("idempotency_pg", logging.DEBUG) as logs:
            await call(self.app, "/notes", key, {"text": text}, alice)
            await call(self.app, "/notes", key, {"text": text}, alice)
            await call(self.app, "/notes", key, {"text": text + " other"}, alice)
            async with self.pool.acquire() as holder:
                busy = str(uuid.uuid4())
                await holder.execute("BEGIN")
                await holder.execute("SELECT idempotency.claim($1, NULL)", scoped_key("alice", busy))
                await call(self.app, "/notes", busy, {"text": text}, alice)
                await holder.execute("ROLLBACK")
            await call(self.app, "/notes", str(uuid.uuid4()), {"text": text, "status": 503}, alice)
            await call(self.app, "/throws", str(uuid.uuid4()), {"text": text}, alice)
            await call(self.app, "/notes", str(uuid.uuid4()), {"text": text})
        events = [(record.idempotency_event, record.idempotency_status, record.levelname) for record in logs.records]
        self.assertEqual(events, [("stored", 201, "DEBUG"), ("replayed", 201, "INFO"), ("mismatch", 422, "WARNING"),
                                  ("conflict", 409, "INFO"), ("not-stored", 503, "INFO"),
                                  ("not-stored", None, "INFO"), ("principal-required", 401, "INFO")])
        self.assertEqual({record.idempotency_key_ref for record in logs.records[:3]}, {ref})
        self.assertIn("5xx", logs.records[4].idempotency_reason)
        self.assertIn("RuntimeError", logs.records[5].idempotency_reason)
        self.assertIn(f"POST /notes key_ref={ref} status=201", logs.output[1])
        for line in logs.output:
            self.assertNotIn("raw-key", line)
            self.assertNotIn("secret body", line)
        gone = str(uuid.uuid4())
        await call(self.app, "/short-lived-notes", gone, {"text": text}, alice)
        while await self.state(scoped_key("alice", gone)) != "gone":
            await asyncio.sleep(0.02)
        with self.assertLogs("idempotency_pg", logging.INFO) as logs:
            await call(self.app, "/short-lived-notes", gone, {"text": text}, alice)
        self.assertEqual([(r.idempotency_event, r.idempotency_status) for r in logs.records], [("gone", 410)])

    async def test_a_file_response_is_stored_and_replayed_byte_identical(self):
        content = bytes(range(256)) * 300 + b"\x00 the end"
        with tempfile.NamedTemporaryFile(suffix=".bin", delete=False) as file:
            file.write(content)
        self.addCleanup(os.unlink, file.name)
        tasks = []

        @idempotent(db=self.pool, scope=SHARED_KEYS, replay_headers=("ETag", "Content-Disposition"))
        async def export(request):
            await request.state.db.execute("INSERT INTO asgi_notes (text) VALUES ($1)", (await request.json())["text"])
            return FileResponse(file.name, filename="export.bin", background=BackgroundTask(tasks.append, 1))

        @idempotent(db=self.pool, scope=SHARED_KEYS, max_body_bytes=1000)
        async def too_large(request):
            await request.state.db.execute("INSERT INTO asgi_notes (text) VALUES ($1)", (await request.json())["text"])
            return FileResponse(file.name)

        app = Starlette(routes=[Route("/export", export, methods=["POST"]),
                                Route("/too-large", too_large, methods=["POST"])])
        key, text = str(uuid.uuid4()), f"file {uuid.uuid4()}"
        first = await call(app, "/export", key, {"text": text})
        self.assertEqual((first.status, first.body), (200, content))
        self.assertEqual(tasks, [1], "the background task ran once, after the response")
        retry = await call(app, "/export", key, {"text": text})
        self.assertEqual((retry.status, retry.body, retry.header("Idempotent-Replayed")), (200, content, "true"))
        for name in ("Content-Type", "ETag", "Content-Disposition", "Content-Length"):
            self.assertEqual(retry.header(name), first.header(name), name)
        self.assertEqual(first.header("Content-Disposition"), 'attachment; filename="export.bin"')
        self.assertEqual(await self.count(text), 1)
        big_key, big = str(uuid.uuid4()), f"big file {uuid.uuid4()}"
        answer = await call(app, "/too-large", big_key, {"text": big})
        self.assertEqual((answer.status, answer.json()["type"]), (500, PROBLEM_BASE + "response-too-large"))
        self.assertEqual((await self.count(big), await self.state(big_key)), (0, "absent"))

    async def test_a_response_run_into_the_buffer_sends_the_whole_body_as_messages(self):
        class NewerFileResponse(FileResponse):
            """As later Starlette versions serve a file: a 206 for Range, and
            the path alone when the server offers http.response.pathsend."""

            async def __call__(self, scope, receive, send):
                if "http.response.pathsend" in scope.get("extensions", {}):
                    await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
                    await send({"type": "http.response.pathsend", "path": str(self.path)})
                elif any(name == b"range" for name, _ in scope["headers"]):
                    await send({"type": "http.response.start", "status": 206, "headers": self.raw_headers})
                    await send({"type": "http.response.body", "body": b"part"})
                else:
                    await super().__call__(scope, receive, send)

        content = b"the whole file\n" * 100
        with tempfile.NamedTemporaryFile(delete=False) as file:
            file.write(content)
        self.addCleanup(os.unlink, file.name)

        @idempotent(db=self.pool, scope=SHARED_KEYS)
        async def export(request):
            return NewerFileResponse(file.name)

        app = Starlette(routes=[Route("/export", export, methods=["POST"])])
        for extensions, headers in (({"http.response.pathsend": {}}, ()), (None, [("Range", "bytes=0-3")])):
            key = str(uuid.uuid4())
            first = await call(app, "/export", key, {}, headers, extensions=extensions)
            retry = await call(app, "/export", key, {})
            self.assertEqual((first.status, first.body), (200, content), extensions or headers)
            self.assertEqual((retry.status, retry.body, retry.header("Idempotent-Replayed")), (200, content, "true"))

    async def test_a_scope_that_raises_for_a_missing_principal_is_401(self):
        @idempotent(db=self.pool, scope=lambda request: request.user.identity)
        async def by_user(request):
            return JSONResponse({"user": request.user.identity}, status_code=201)

        @idempotent(db=self.pool, scope=lambda request: request.headers["x-client"])
        async def by_header(request):
            return JSONResponse({}, status_code=201)

        @idempotent(db=self.pool, scope=lambda request: request.state.client.id)
        async def by_state(request):
            return JSONResponse({}, status_code=201)

        @idempotent(db=self.pool, scope=lambda request: int("not a number"))
        async def broken(request):
            return JSONResponse({}, status_code=201)

        app = Starlette(routes=[Route(path, endpoint, methods=["POST"]) for path, endpoint in (
            ("/by-user", by_user), ("/by-header", by_header), ("/by-state", by_state), ("/broken", broken))],
            middleware=[Middleware(AuthenticationMiddleware, backend=BearerUser())])
        for path in ("/by-user", "/by-header", "/by-state"):
            nobody = await call(app, path, str(uuid.uuid4()), {})
            self.assertEqual((nobody.status, nobody.header("Content-Type")), (401, "application/problem+json"), path)
            self.assertEqual(nobody.json()["type"], PROBLEM_BASE + "principal-required")
        alice = await call(app, "/by-user", str(uuid.uuid4()), {}, [("Authorization", "Bearer alice")])
        self.assertEqual((alice.status, alice.json()), (201, {"user": "alice"}))
        self.assertEqual((await call(app, "/broken", str(uuid.uuid4()), {})).status, 500, "a fault stays a fault")

    def payments_app(self, calls):
        class Note(BaseModel):
            text: str

        def current_user(authorization: str = Header(None)):
            calls.append(authorization)
            return authorization[len("Bearer "):] if authorization else None

        router = APIRouter(route_class=idempotent_route(db=self.pool, scope=Depends(current_user)))

        @router.post("/notes", status_code=201, responses={402: {"description": "declined"}})
        async def create(note: Note, user=Depends(current_user), db=Depends(transaction)):
            note_id = await db.fetchval("INSERT INTO asgi_notes (text) VALUES ($1) RETURNING id", note.text)
            return {"id": note_id, "user": user}

        app = FastAPI()
        app.include_router(router)
        return app

    async def test_fastapi_scope_from_a_dependency_the_route_declares(self):
        calls = []
        app = self.payments_app(calls)
        key, text = str(uuid.uuid4()), f"depends {uuid.uuid4()}"
        alice = [("Authorization", "Bearer alice")]
        first = await call(app, "/notes", key, {"text": text}, alice)
        self.assertEqual((first.status, first.json()["user"]), (201, "alice"))
        self.assertEqual(calls, ["Bearer alice"], "the dependency ran once")
        retry = await call(app, "/notes", key, {"text": text}, alice)
        self.assertEqual((retry.body, retry.header("Idempotent-Replayed")), (first.body, "true"))
        self.assertEqual(await self.state(scoped_key("alice", key)), "done")
        bob = await call(app, "/notes", key, {"text": text}, [("Authorization", "Bearer bob")])
        self.assertEqual((bob.status, bob.json()["user"], bob.header("Idempotent-Replayed")), (201, "bob", None))
        nobody = await call(app, "/notes", key, {"text": text})
        self.assertEqual((nobody.status, nobody.json()["type"]), (401, PROBLEM_BASE + "principal-required"))
        self.assertEqual(await self.count(text), 2)
        with self.assertRaises(TypeError):
            idempotent(lambda request: None, db=self.pool, scope=Depends(lambda: "x"))

    async def test_fastapi_openapi_declares_the_header_and_the_problems(self):
        operation = self.payments_app([]).openapi()["paths"]["/notes"]["post"]
        header = [p for p in operation["parameters"] if p["name"] == "Idempotency-Key"]
        self.assertEqual(len(header), 1)
        self.assertEqual((header[0]["in"], header[0]["required"], header[0]["schema"]["maxLength"]),
                         ("header", True, 255))
        self.assertIn("authorization", [p["name"].lower() for p in operation["parameters"]])
        for status in ("400", "401", "409", "410", "422"):
            self.assertIn("application/problem+json", operation["responses"][status]["content"], status)
        self.assertIn("Retry-After", operation["responses"]["409"]["headers"])
        self.assertIn("application/json", operation["responses"]["422"]["content"], "FastAPI's validation error")
        self.assertIn("402", operation["responses"])
        shared = APIRouter(route_class=idempotent_route(db=self.pool, scope=SHARED_KEYS, required=False))

        @shared.post("/shared")
        async def shared_endpoint():
            return {}

        app = FastAPI()
        app.include_router(shared)
        operation = app.openapi()["paths"]["/shared"]["post"]
        self.assertNotIn("401", operation["responses"])
        self.assertEqual([(p["name"], p["required"]) for p in operation["parameters"]], [("Idempotency-Key", False)])

    def test_the_asgi_fingerprint_matches_the_shared_vectors(self):
        with open(os.path.join(SHARED, "fingerprint-vectors.json"), encoding="utf-8") as file:
            vectors = json.load(file)
        for vector in vectors:
            target = vector["target"].encode("utf-8")
            path, _, query = target.partition(b"?")
            headers = [] if vector["content_type"] is None else [(b"content-type",
                                                                   vector["content_type"].encode("latin1"))]
            request = Request({"type": "http", "method": vector["method"], "path": urllib.parse.unquote(
                path.decode("latin1")), "raw_path": path, "query_string": query, "headers": headers})
            body = base64.b64decode(vector["body_base64"])
            self.assertEqual(request_fingerprint(request, body), vector["fingerprint"], vector["name"])
            self.assertEqual(fingerprint(vector["method"], target, vector["content_type"], body), vector["fingerprint"])


if __name__ == "__main__":
    unittest.main()
