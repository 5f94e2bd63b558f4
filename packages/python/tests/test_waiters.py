"""Many duplicates of one request on a Starlette endpoint with wait_timeout,
sent while the first holds its key: every one waits for it and, once it
commits, replays its answer at once; none is answered 409 when its wait runs
out."""
import asyncio
import time
import unittest
import uuid

import asyncpg
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

from asgi_tests import call
from idempotency_pg import SHARED_KEYS
from idempotency_pg.starlette import idempotent

DUPLICATES = 20
WAIT = "20s"
PROMPT_SECONDS = 5  # far below the wait: a bound, not a measure of speed


class WaitersTests(unittest.IsolatedAsyncioTestCase):
    async def asyncSetUp(self):
        # A connection for the first request and every duplicate.
        self.pool = await asyncpg.create_pool(min_size=1, max_size=DUPLICATES + 4)
        await self.pool.execute("CREATE TABLE IF NOT EXISTS py_waiter_notes (text text NOT NULL)")
        self.held = {}  # text -> event the first request's endpoint waits for

        @idempotent(db=self.pool, scope=SHARED_KEYS, wait_timeout=WAIT)
        async def notes(request):
            text = (await request.json())["text"]
            await request.state.db.execute("INSERT INTO py_waiter_notes (text) VALUES ($1)", text)
            if text in self.held:
                await self.held[text].wait()
            return JSONResponse({"text": text}, status_code=201)

        self.app = Starlette(routes=[Route("/notes", notes, methods=["POST"])])

    async def asyncTearDown(self):
        await self.pool.close()

    async def wait_for(self, condition, what, timeout=15):
        deadline = time.monotonic() + timeout
        while not await condition():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}")
            await asyncio.sleep(0.02)

    async def test_duplicates_waiting_for_the_first_all_replay_once_it_commits(self):
        key, text = str(uuid.uuid4()), f"held {uuid.uuid4()}"
        self.held[text] = asyncio.Event()
        first = asyncio.ensure_future(call(self.app, "/notes", key, {"text": text}))
        await self.wait_for(
            lambda: self.pool.fetchval("SELECT state = 'in_progress' FROM idempotency.lookup($1)", key),
            "the first request to hold its key")

        async def duplicate():
            answer = await call(self.app, "/notes", key, {"text": text})
            return answer, time.monotonic()

        duplicates = [asyncio.ensure_future(duplicate()) for _ in range(DUPLICATES)]

        async def all_waiting():
            return await self.pool.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND datname = current_database()") == DUPLICATES

        await self.wait_for(all_waiting, f"the {DUPLICATES} duplicates to wait for the key")
        self.held[text].set()
        answered = await first
        committed_at = time.monotonic()
        self.assertEqual(answered.status, 201)

        answers = await asyncio.gather(*duplicates)
        self.assertEqual([answer.status for answer, _ in answers], [201] * DUPLICATES)
        for answer, _ in answers:
            self.assertEqual(answer.header("Idempotent-Replayed"), "true")
            self.assertEqual(answer.body, answered.body)
        latest = max(at for _, at in answers) - committed_at
        self.assertLess(latest, PROMPT_SECONDS, "the last duplicate answered long after the first")
        self.assertEqual(await self.pool.fetchval("SELECT count(*) FROM py_waiter_notes WHERE text = $1", text), 1)
