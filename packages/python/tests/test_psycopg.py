"""The psycopg helpers against a real database, with psycopg2 and psycopg 3:
claim, complete and release in the caller's transaction, with_idempotency,
and the claim's errors (only the claim's) mapped."""
import datetime
import threading
import time
import unittest
import uuid

import psycopg
import psycopg2

from expiring import SHORT_TTL, wait_until_gone
from idempotency_pg import (InvalidKey, KeyGone, KeyInProgress, KeyReused, SealedError, claim, complete, release,
                            with_idempotency)
from idempotency_pg.errors import sqlstate_of

DRIVERS = {"psycopg2": lambda: psycopg2.connect(""), "psycopg": lambda: psycopg.connect("")}


def setUpModule():
    with psycopg.connect("", autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS py_jobs (text text NOT NULL)")


def key_state(key):
    with psycopg.connect("") as conn:
        return conn.execute("SELECT state FROM idempotency.lookup(%s)", [key]).fetchone()[0]


def count(text):
    with psycopg.connect("") as conn:
        return conn.execute("SELECT count(*) FROM py_jobs WHERE text = %s", [text]).fetchone()[0]


class HelperTests(unittest.TestCase):
    def each_driver(self):
        for name, connect in DRIVERS.items():
            with self.subTest(driver=name):
                conn = connect()
                try:
                    yield conn
                finally:
                    conn.close()

    def test_claim_complete_commit_then_replay(self):
        for conn in self.each_driver():
            key = str(uuid.uuid4())
            cursor = conn.cursor()
            first = claim(cursor, key, "hash-1")
            self.assertFalse(first.replayed)
            cursor.execute("INSERT INTO py_jobs VALUES (%s)", [key])
            complete(cursor, key, {"done": key, "text": "é"})
            conn.commit()
            again = claim(cursor, key, "hash-1")
            self.assertTrue(again.replayed)
            self.assertEqual(again.response, {"done": key, "text": "é"})
            self.assertIsNotNone(again.created_at)
            with self.assertRaises(KeyReused) as raised:
                claim(cursor, key, "hash-2")
            self.assertEqual(raised.exception.status, 422)
            conn.rollback()
            self.assertEqual(count(key), 1)

    def test_a_ttl_is_the_claimed_keys_ttl(self):
        def kept_for(key):
            with psycopg.connect("") as conn:
                return conn.execute("SELECT expires_at - created_at FROM idempotency.lookup(%s)", [key]).fetchone()[0]

        for conn in self.each_driver():
            key = str(uuid.uuid4())
            cursor = conn.cursor()
            claim(cursor, key, "hash", wait_timeout=1, ttl="2 hours")
            complete(cursor, key, {})
            conn.commit()
            self.assertEqual(kept_for(key), datetime.timedelta(hours=2))
            key = str(uuid.uuid4())
            with_idempotency(conn, key, lambda cursor: {}, ttl=datetime.timedelta(minutes=5))
            self.assertEqual(kept_for(key), datetime.timedelta(minutes=5))
            with self.assertRaises(ValueError):
                claim(cursor, str(uuid.uuid4()), "hash", ttl=0)
            conn.rollback()

    def test_release_commits_other_work(self):
        for conn in self.each_driver():
            key = str(uuid.uuid4())
            cursor = conn.cursor()
            claim(cursor, key)
            cursor.execute("INSERT INTO py_jobs VALUES (%s)", [key])
            release(cursor, key)
            conn.commit()
            self.assertEqual(count(key), 1)

    def test_claim_errors_and_wait_timeout(self):
        for conn in self.each_driver():
            key = str(uuid.uuid4())
            holder = psycopg.connect("")
            try:
                claim(holder.cursor(), key, "h")
                with self.assertRaises(KeyInProgress) as raised:
                    claim(conn.cursor(), key, "h")
                self.assertEqual(raised.exception.status, 409)
                conn.rollback()
                with self.assertRaises(Exception) as raised:
                    claim(conn.cursor(), str(uuid.uuid4()), "h", wait_timeout="2 parsecs")
                self.assertNotIsInstance(raised.exception, InvalidKey, "a bad wait timeout is not an invalid key")
                conn.rollback()
                for bad in ("", "k" * 256):
                    with self.assertRaises(InvalidKey):
                        claim(conn.cursor(), bad, "h")
                    conn.rollback()

                result = {}
                waiter = threading.Thread(target=lambda: result.update(c=claim(conn.cursor(), key, "h", wait_timeout=10)))
                waiter.start()
                time.sleep(0.3)
                complete(holder.cursor(), key, {"by": "holder"})
                holder.commit()
                waiter.join(30)
                self.assertTrue(result["c"].replayed)
                self.assertEqual(result["c"].response, {"by": "holder"})
                conn.rollback()
            finally:
                holder.close()

    def test_other_errors_are_not_mapped(self):
        for conn in self.each_driver():
            cursor = conn.cursor()
            cursor.execute("CREATE TEMP TABLE IF NOT EXISTS x (a int)")
            conn.commit()
            for code in ("IK409", "IK410"):
                with self.assertRaises(Exception) as raised:
                    with_idempotency(conn, str(uuid.uuid4()), lambda c: c.execute(
                        f"DO $$ BEGIN RAISE EXCEPTION 'own' USING ERRCODE = '{code}'; END $$"))
                self.assertNotIsInstance(raised.exception, (KeyInProgress, KeyGone), code)
                self.assertEqual(sqlstate_of(raised.exception), code)

    def test_a_request_whose_response_expired_is_key_gone_and_runs_nothing(self):
        for conn in self.each_driver():
            key = str(uuid.uuid4())
            cursor = conn.cursor()
            cursor.execute("SELECT set_config('idempotency.ttl', %s, true)", [SHORT_TTL])
            claim(cursor, key, "h")
            cursor.execute("INSERT INTO py_jobs VALUES (%s)", [key])
            complete(cursor, key, {"done": key})
            conn.commit()
            wait_until_gone(key_state, key)
            with self.assertRaises(KeyGone) as raised:
                claim(cursor, key, "h")
            self.assertEqual(raised.exception.status, 410)
            self.assertEqual(sqlstate_of(raised.exception.__cause__), "IK410")
            conn.rollback()
            with self.assertRaises(KeyReused):
                claim(cursor, key, "another request")
            conn.rollback()
            runs = []
            with self.assertRaises(KeyGone):
                with_idempotency(conn, key, runs.append, request_hash="h")
            self.assertEqual(runs, [])
            self.assertEqual(count(key), 1)

    def test_with_idempotency(self):
        for conn in self.each_driver():
            for autocommit in (False, True):
                conn.autocommit = autocommit
                key = str(uuid.uuid4())
                runs = []

                def work(cursor):
                    runs.append(1)
                    cursor.execute("INSERT INTO py_jobs VALUES (%s)", [key])
                    return {"runs": len(runs)}

                self.assertEqual(with_idempotency(conn, key, work, request_hash="m"), (False, {"runs": 1}))
                self.assertEqual(with_idempotency(conn, key, work, request_hash="m"), (True, {"runs": 1}))
                self.assertEqual(count(key), 1)

                failing = str(uuid.uuid4())

                def fails(cursor):
                    cursor.execute("INSERT INTO py_jobs VALUES (%s)", [failing])
                    raise RuntimeError("consumer failed")

                with self.assertRaises(RuntimeError):
                    with_idempotency(conn, failing, fails)
                self.assertEqual(count(failing), 0)
                self.assertEqual(with_idempotency(conn, failing, lambda cursor: "ok"), (False, "ok"))

                kept = []
                with_idempotency(conn, str(uuid.uuid4()), kept.append)
                with self.assertRaises(SealedError):
                    kept[0].execute("SELECT 1")
            conn.autocommit = False


if __name__ == "__main__":
    unittest.main()
