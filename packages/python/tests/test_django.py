"""The Django decorator against a real database, through Django's test
Client and the middleware of a fresh project: every rule of the README, and
each bug of the copied decorator it replaces as a regression test."""
import base64
import datetime
import json
import logging
import threading
import time
import unittest
import uuid

import djsite
from django.db import connection, connections
from django.test import Client, override_settings
from expiring import wait_until_gone
from idempotency_pg import key_ref, scoped_key
from idempotency_pg.django import idempotent

PROBLEM_BASE = "urn:idempotency:problem:"  # the documented default (idempotency_pg.problems)
# The same document as the Node and Go packages'.
GONE_PROBLEM = {"type": PROBLEM_BASE + "request-already-ran",
                "title": "This request already ran; its response is no longer kept", "status": 410,
                "detail": "A request with this Idempotency-Key was processed before and its response has expired; "
                          "it is not run again."}


def latin1_of_utf8(text):
    """What a WSGI server puts in META for text sent as UTF-8 bytes."""
    return text.encode("utf-8").decode("latin1")


def wait_for(condition, what, timeout=15):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def count(text):
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM py_notes WHERE text = %s", [text])
        return cursor.fetchone()[0]


def key_state(key):
    with connection.cursor() as cursor:
        cursor.execute("SELECT state FROM idempotency.lookup(%s)", [key])
        return cursor.fetchone()[0]


def stored_response(key):
    with connection.cursor() as cursor:
        cursor.execute("SELECT response::text FROM idempotency.lookup(%s)", [key])
        return json.loads(cursor.fetchone()[0])


def sessions(condition, *params):
    """This database's sessions in pg_stat_activity that meet `condition`."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND " + condition,
                       params)
        return cursor.fetchone()[0]


class DecoratorTests(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        djsite.create_tables()

    def setUp(self):
        self.client = Client(raise_request_exception=False)

    def post(self, path, key, data, client=None, **extra):
        if key is not None:
            extra["HTTP_IDEMPOTENCY_KEY"] = key
        return (client or self.client).post(path, json.dumps(data), content_type="application/json", **extra)

    def assert_problem(self, response, status, type_):
        self.assertEqual(response.status_code, status)
        self.assertEqual(response["Content-Type"], "application/problem+json")
        self.assertEqual(response.json()["type"], PROBLEM_BASE + type_)

    def test_retry_replays_status_body_content_type_and_headers_with_their_casing(self):
        key = str(uuid.uuid4())
        first = self.post("/notes", key, {"text": key})
        self.assertEqual(first.status_code, 201)
        self.assertFalse(first.has_header("Idempotent-Replayed"))
        retry = self.post("/notes", key, {"text": key})
        self.assertEqual(retry.status_code, 201)
        self.assertEqual(retry["Idempotent-Replayed"], "true")
        self.assertEqual(retry.content, first.content)
        self.assertEqual(retry["Content-Type"], "application/json")
        self.assertEqual(retry["Location"], first["Location"])
        self.assertEqual(retry["ETag"], first["ETag"])
        names = [name for name, _ in retry.items()]
        self.assertIn("ETag", names)
        self.assertIn("Location", names)
        self.assertEqual(count(key), 1)
        self.assertEqual(sorted(stored_response(key)["headers"]), ["Content-Type", "ETag", "Location"])

    def test_a_views_ttl_is_its_keys_ttl(self):
        for path, ttl in (("/week-notes", datetime.timedelta(days=7)), ("/notes", datetime.timedelta(hours=24))):
            key = str(uuid.uuid4())
            self.assertEqual(self.post(path, key, {"text": key}).status_code, 201)
            with connection.cursor() as cursor:
                cursor.execute("SELECT state, expires_at - created_at FROM idempotency.lookup(%s)", [key])
                self.assertEqual(cursor.fetchone(), ("done", ttl), path)
        for bad in (0, -5, "", True, [1]):
            with self.assertRaises((TypeError, ValueError), msg=repr(bad)):
                idempotent(lambda request: None, ttl=bad)

    def test_a_scope_that_raises_for_a_missing_principal_is_401(self):
        for path in ("/header-scoped-notes", "/auth-scoped-notes"):
            text = f"no principal {uuid.uuid4()}"
            self.assert_problem(self.post(path, str(uuid.uuid4()), {"text": text}), 401, "principal-required")
            self.assertEqual(count(text), 0)
        text = f"a principal {uuid.uuid4()}"
        self.assertEqual(self.post("/header-scoped-notes", str(uuid.uuid4()), {"text": text},
                                   HTTP_X_CLIENT="alice").status_code, 201)
        self.assertEqual(count(text), 1)

    def test_every_outcome_is_logged_with_the_key_hashed(self):
        key, text = f"raw-key-{uuid.uuid4()}", f"secret body {uuid.uuid4()}"
        with self.assertLogs("idempotency_pg", logging.DEBUG) as logs:
            self.post("/notes", key, {"text": text})
            self.post("/notes", key, {"text": text})
            self.post("/notes", key, {"text": text + " other"})
            self.post("/status", str(uuid.uuid4()), {"text": text, "status": 429})
            self.post("/throws", str(uuid.uuid4()), {"text": text})
            self.post("/notes", "caf\xc3\xa9", {"text": text})
            self.post("/header-scoped-notes", str(uuid.uuid4()), {"text": text})
        events = [(record.idempotency_event, record.idempotency_status, record.levelname) for record in logs.records]
        self.assertEqual(events, [("stored", 201, "DEBUG"), ("replayed", 201, "INFO"), ("mismatch", 422, "WARNING"),
                                  ("not-stored", 429, "INFO"), ("not-stored", None, "INFO"),
                                  ("invalid-key", 400, "INFO"), ("principal-required", 401, "INFO")])
        self.assertEqual({record.idempotency_key_ref for record in logs.records[:3]}, {key_ref(key)})
        self.assertIn("Declined", logs.records[4].idempotency_reason)
        self.assertIn("KeyError", logs.records[6].idempotency_reason)
        for line in logs.output:
            self.assertNotIn("raw-key", line)
            self.assertNotIn("secret body", line)

    def test_problem_types_default_to_the_documented_urn_and_follow_the_projects_setting(self):
        self.assert_problem(self.post("/notes", None, {"text": "x"}), 400, "missing-idempotency-key")
        with override_settings(IDEMPOTENCY_PROBLEM_BASE="https://api.example.com/problems/"):
            answer = self.post("/notes", None, {"text": "x"})
        self.assertEqual(answer.json()["type"], "https://api.example.com/problems/missing-idempotency-key")

    def test_an_exception_after_writing_commits_nothing(self):
        for kind in ("402", "404"):
            key = str(uuid.uuid4())
            text = f"throws {kind} {key}"
            answer = self.post("/throws", key, {"text": text, "kind": kind})
            self.assertEqual(answer.status_code, 500 if kind == "402" else 404)
            self.assertEqual(count(text), 0)
            self.assertEqual(key_state(key), "absent")

    def test_statuses_never_stored_roll_back(self):
        for status in (408, 409, 425, 429, 500, 503):
            key = str(uuid.uuid4())
            text = f"status {status} {key}"
            self.assertEqual(self.post("/status-validation-stored", key, {"text": text, "status": status})
                             .status_code, status)
            self.assertEqual(count(text), 0, status)
            self.assertEqual(key_state(key), "absent", status)

    def test_validation_failures_are_not_stored_by_default(self):
        for status in (400, 422):
            key = str(uuid.uuid4())
            self.assertEqual(self.post("/status", key, {"text": f"typo {key}", "status": status}).status_code, status)
            self.assertEqual(count(f"typo {key}"), 0)
            fixed = self.post("/status", key, {"text": f"fixed {key}", "status": 201})
            self.assertEqual(fixed.status_code, 201)
            self.assertFalse(fixed.has_header("Idempotent-Replayed"))
            self.assertEqual(count(f"fixed {key}"), 1)

    def test_validation_failures_are_stored_when_the_view_asks(self):
        for status in (400, 422):
            key = str(uuid.uuid4())
            text = f"stored {status} {key}"
            self.post("/status-validation-stored", key, {"text": text, "status": status})
            retry = self.post("/status-validation-stored", key, {"text": text, "status": status})
            self.assertEqual(retry.status_code, status)
            self.assertEqual(retry["Idempotent-Replayed"], "true")
            self.assertEqual(count(text), 1)

    def test_other_statuses_are_stored_with_their_work(self):
        for status in (402, 404, 201, 302):
            key = str(uuid.uuid4())
            text = f"kept {status} {key}"
            self.post("/status", key, {"text": text, "status": status})
            retry = self.post("/status", key, {"text": text, "status": status})
            self.assertEqual(retry.status_code, status)
            self.assertEqual(retry["Idempotent-Replayed"], "true")
            self.assertEqual(count(text), 1)

    def test_the_views_own_database_errors_stay_the_views(self):
        for code in ("22023", "IK409", "IK410", "IK422"):
            key = str(uuid.uuid4())
            text = f"db error {code} {key}"
            answer = self.post("/view-db-error", key, {"text": text, "code": code})
            self.assertEqual(answer.status_code, 500, code)
            self.assertNotEqual(answer.get("Content-Type"), "application/problem+json")
            self.assertEqual(count(text), 0)

    def test_a_retry_after_the_response_expired_is_410_and_runs_nothing_another_body_is_422(self):
        key = str(uuid.uuid4())
        text = f"gone {key}"
        alice = {"HTTP_X_CLIENT": "alice"}
        self.assertEqual(self.post("/short-lived-notes", key, {"text": text}, **alice).status_code, 201)
        wait_until_gone(key_state, scoped_key("alice", key))
        retry = self.post("/short-lived-notes", key, {"text": text}, **alice)
        self.assert_problem(retry, 410, "request-already-ran")
        self.assertEqual(retry.json(), GONE_PROBLEM)
        self.assertFalse(retry.has_header("Idempotent-Replayed"))
        self.assertEqual(count(text), 1, "the view did not run again")
        other = self.post("/short-lived-notes", key, {"text": f"{text} other"}, **alice)
        self.assert_problem(other, 422, "idempotency-key-reused")
        self.assertEqual(count(f"{text} other"), 0)
        # Another client's same key is another key: its request runs.
        self.assertEqual(self.post("/short-lived-notes", key, {"text": text}, HTTP_X_CLIENT="bob").status_code, 201)
        self.assertEqual(count(text), 2)

    def test_bodies_replay_byte_for_byte_with_their_content_type(self):
        cases = [
            ("application/octet-stream", bytes([0x25, 0x50, 0xFF, 0xFE, 0x41]), True),
            ("application/pdf", bytes([0x25, 0x50, 0x44, 0x46, 0x00, 0x01, 0x00]), True),
            ("text/plain", bytes([0x61, 0x80, 0x62]), True),
            ("text/plain; charset=utf-8", b"\xef\xbb\xbfhi", False),
            ("text/html; charset=utf-8", "<p>naïve – ✓ 😀</p>".encode(), False),
            ("text/plain", b"", False),
        ]
        for content_type, data, binary in cases:
            key = str(uuid.uuid4())
            request = {"text": key, "type": content_type, "base64": base64.b64encode(data).decode()}
            first = self.post("/body", key, request)
            self.assertEqual(first.content, data)
            retry = self.post("/body", key, request)
            self.assertEqual(retry["Idempotent-Replayed"], "true")
            self.assertEqual(retry.content, data)
            self.assertEqual(retry["Content-Type"], content_type)
            self.assertEqual(stored_response(key).get("body_encoding"), "base64" if binary else None)
            self.assertEqual(count(key), 1)

    def test_a_streaming_response_is_read_in_the_transaction_stored_and_replayed(self):
        key = str(uuid.uuid4())
        text = f"stream {key}"
        first = self.post("/stream", key, {"text": text, "lines": 200})
        self.assertEqual(first.status_code, 200)
        self.assertFalse(first.streaming)
        self.assertEqual(first.content.count(b"\n"), 200)
        retry = self.post("/stream", key, {"text": text, "lines": 200})
        self.assertEqual(retry["Idempotent-Replayed"], "true")
        self.assertEqual(retry.content, first.content)
        self.assertEqual(retry["Content-Type"], "text/csv")
        self.assertEqual(count(text), 1)

    def test_a_streaming_response_over_the_limit_is_refused_and_commits_nothing(self):
        key = str(uuid.uuid4())
        text = f"big stream {key}"
        answer = self.post("/stream", key, {"text": text, "lines": 1000})
        self.assert_problem(answer, 500, "response-too-large")
        self.assertEqual(count(text), 0)
        self.assertEqual(key_state(key), "absent")

    def test_quoted_and_bare_keys_are_the_same_key(self):
        key = f"k-{uuid.uuid4()}"
        self.assertEqual(self.post("/notes", f'"{key}"', {"text": key}).status_code, 201)
        self.assertEqual(self.post("/notes", key, {"text": key})["Idempotent-Replayed"], "true")
        escaped = f"e-{uuid.uuid4()}"
        self.assertEqual(self.post("/notes", f'"{escaped}\\"q\\\\"', {"text": escaped}).status_code, 201)
        self.assertEqual(key_state(f'{escaped}"q\\'), "done")

    def test_non_ascii_keys_are_refused_never_mangled(self):
        for value in (latin1_of_utf8("é" * 100), latin1_of_utf8("é" * 50), latin1_of_utf8('"clé"'), "\xe9t\xe9"):
            text = f"non-ascii {uuid.uuid4()}"
            answer = self.post("/notes", value, {"text": text})
            self.assert_problem(answer, 400, "invalid-idempotency-key")
            self.assertIn("non-ASCII", answer.json()["detail"])
            self.assertEqual(count(text), 0)

    def test_control_characters_bad_quoting_and_lengths_are_refused(self):
        for value, detail in (("a\x01b", "control"), ('"a\x7fb"', "control"), ("a\tb", "control"),
                              ('"abc', "closing quote"), ('"a\\bc"', "backslash"), ('""', "1 to 255"),
                              ("k" * 256, "1 to 255")):
            answer = self.post("/notes", value, {"text": "never"})
            self.assert_problem(answer, 400, "invalid-idempotency-key")
            self.assertIn(detail, answer.json()["detail"])
        longest = ("k" * 219) + str(uuid.uuid4())
        self.assertEqual(self.post("/notes", longest, {"text": longest}).status_code, 201)

    def test_missing_key(self):
        self.assert_problem(self.post("/notes", None, {"text": "never"}), 400, "missing-idempotency-key")
        text = f"optional {uuid.uuid4()}"
        self.assertEqual(self.post("/optional", None, {"text": text}).status_code, 201)
        self.assertEqual(count(text), 1)

    def test_fingerprint_canonical_json_and_changed_requests(self):
        key = str(uuid.uuid4())
        text = f"fp {key}"
        first = self.client.post("/notes", f'{{"text": "{text}", "n": 1}}', content_type="application/json",
                                 HTTP_IDEMPOTENCY_KEY=key)
        self.assertEqual(first.status_code, 201)
        reordered = self.client.post("/notes", f'{{ "n":1.0, "text":"{text}" }}', content_type="application/json",
                                     HTTP_IDEMPOTENCY_KEY=key)
        self.assertEqual(reordered["Idempotent-Replayed"], "true")
        self.assert_problem(self.post("/notes", key, {"text": text, "n": 2}), 422, "idempotency-key-reused")
        self.assert_problem(self.client.post("/notes?x=1", f'{{"text": "{text}", "n": 1}}',
                                             content_type="application/json", HTTP_IDEMPOTENCY_KEY=key),
                            422, "idempotency-key-reused")
        self.assertEqual(count(text), 1)

    def test_csrf_the_documented_snippet_works_in_a_fresh_project(self):
        strict = Client(enforce_csrf_checks=True, raise_request_exception=False)
        text = f"csrf {uuid.uuid4()}"
        # @csrf_exempt, as the README's snippet has it: works.
        self.assertEqual(self.post("/notes", str(uuid.uuid4()), {"text": text}, client=strict).status_code, 201)
        # Without it, Django's CSRF middleware answers before the view runs.
        self.assertEqual(self.post("/csrf-protected", str(uuid.uuid4()), {"text": text}, client=strict).status_code,
                         403)
        self.assertEqual(count(text), 1)

    def test_duplicate_in_flight_is_409_and_wait_timeout_waits_and_replays(self):
        key = str(uuid.uuid4())
        text = f"held {key}"
        djsite.HELD[text] = threading.Event()
        first = {}

        def first_request():
            try:
                first["response"] = self.post("/notes", key, {"text": text}, client=Client())
            finally:
                connections.close_all()

        thread = threading.Thread(target=first_request)
        thread.start()
        try:
            # Its handler has inserted, so its claim came before: a session
            # merely idle in transaction may be between BEGIN and the claim.
            wait_for(lambda: sessions("state = 'idle in transaction' AND starts_with(query, %s)", "INSERT INTO py_notes") >= 1,
                     "the first request to hold its key")
            duplicate = self.post("/notes", key, {"text": text})
            self.assert_problem(duplicate, 409, "request-in-progress")
            self.assertEqual(duplicate["Retry-After"], "1")
        finally:
            djsite.HELD[text].set()
            thread.join(30)
        self.assertEqual(first["response"].status_code, 201)
        del djsite.HELD[text]

        # The waiting view: a duplicate waits for the first, then replays it.
        wait_key = str(uuid.uuid4())
        wait_text = f"wait {wait_key}"
        import psycopg2
        holder = psycopg2.connect("")
        results = {}

        def request(name):
            try:
                results[name] = self.post("/notes-waiting", wait_key, {"text": wait_text}, client=Client())
            finally:
                connections.close_all()

        threads = [threading.Thread(target=request, args=(name,)) for name in ("one", "two")]
        try:
            with holder.cursor() as cursor:
                cursor.execute("LOCK TABLE py_notes IN SHARE MODE")
            threads[0].start()
            wait_for(lambda: sessions("wait_event_type = 'Lock'") == 1, "the first request to wait for the table")
            threads[1].start()
            wait_for(lambda: sessions("wait_event_type = 'Lock'") == 2, "the duplicate to wait for the key")
        finally:
            holder.commit()
            holder.close()
            for thread in threads:
                thread.join(30)
        statuses = sorted(response.status_code for response in results.values())
        self.assertEqual(statuses, [201, 201])
        self.assertEqual(results["two"]["Idempotent-Replayed"], "true")
        self.assertEqual(results["two"].content, results["one"].content)
        self.assertEqual(count(wait_text), 1)


if __name__ == "__main__":
    unittest.main()
