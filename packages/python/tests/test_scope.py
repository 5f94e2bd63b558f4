"""Keys scoped to the request's principal: the shared rule (against
packages/shared/scope-vectors.json, which the Node package's tests read
too), and the Django decorator keeping one user's or API client's keys
apart from another's on the same pool role."""
import json
import os
import unittest
import uuid

import djsite
from django.core.exceptions import ImproperlyConfigured
from django.http import JsonResponse
from django.test import Client, RequestFactory

from idempotency_pg import SHARED_KEYS, scoped_key
from idempotency_pg.django import idempotent
from test_django import PROBLEM_BASE, count, key_state, stored_response

SHARED = os.environ.get("SHARED_DIR", os.path.join(os.path.dirname(__file__), "..", "..", "shared"))


class RuleTests(unittest.TestCase):
    def test_shared_vectors(self):
        with open(os.path.join(SHARED, "scope-vectors.json"), encoding="utf-8") as file:
            vectors = json.load(file)
        self.assertGreaterEqual(len(vectors), 8)
        for vector in vectors:
            self.assertEqual(scoped_key(vector["scope"], vector["key"]), vector["database_key"], vector["name"])

    def test_bounds_and_forms(self):
        for length in (1, 220, 221, 255):
            derived = scoped_key("alice", "k" * length)
            self.assertLessEqual(len(derived.encode("utf-8")), 255)
            self.assertEqual(derived[33], ":" if length <= 220 else "#")
        self.assertNotEqual(scoped_key("alice", "k"), scoped_key("bob", "k"))
        self.assertEqual(scoped_key(7, "k"), scoped_key("7", "k"))
        self.assertEqual(scoped_key(SHARED_KEYS, "k"), "k")

    def test_refused_scopes(self):
        for scope in (None, ""):
            with self.assertRaises(TypeError):
                scoped_key(scope, "k")
        for scope in (1.5, True, b"alice", object()):
            with self.assertRaises(TypeError, msg=repr(scope)):
                scoped_key(scope, "k")


class DjangoScopeTests(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        djsite.create_tables()

    def setUp(self):
        self.client = Client(raise_request_exception=False)

    def post(self, path, key, data, **extra):
        return self.client.post(path, json.dumps(data), content_type="application/json", HTTP_IDEMPOTENCY_KEY=key,
                                **extra)

    def test_another_user_with_the_same_key_and_body_gets_a_run_of_their_own(self):
        key, text = str(uuid.uuid4()), f"alice and bob {uuid.uuid4()}"
        alice = self.post("/user-notes", key, {"text": text}, HTTP_X_TEST_USER="1")
        self.assertEqual(alice.status_code, 201)
        bob = self.post("/user-notes", key, {"text": text}, HTTP_X_TEST_USER="2")
        self.assertEqual(bob.status_code, 201)
        self.assertFalse(bob.has_header("Idempotent-Replayed"))
        self.assertEqual(bob.json()["user"], 2)
        self.assertNotEqual(bob.json()["id"], alice.json()["id"])
        self.assertEqual(count(text), 2)
        retry = self.post("/user-notes", key, {"text": text}, HTTP_X_TEST_USER="1")
        self.assertEqual(retry["Idempotent-Replayed"], "true")
        self.assertEqual(retry.content, alice.content)
        # The database holds each user's key under its derived form only.
        self.assertEqual(json.loads(stored_response(scoped_key(1, key))["body"]), alice.json())
        self.assertEqual(json.loads(stored_response(scoped_key(2, key))["body"]), bob.json())
        self.assertEqual(key_state(key), "absent")

    def test_another_users_key_with_another_body_reveals_nothing(self):
        key, text = str(uuid.uuid4()), f"probe {uuid.uuid4()}"
        self.assertEqual(self.post("/user-notes", key, {"text": text}, HTTP_X_TEST_USER="1").status_code, 201)
        probe = self.post("/user-notes", key, {"text": text + " other"}, HTTP_X_TEST_USER="3")
        self.assertEqual(probe.status_code, 201)  # not 422: Bob's key is his own
        self.assertEqual(count(text + " other"), 1)
        # The same user with another body still gets 422.
        reused = self.post("/user-notes", key, {"text": text + " other"}, HTTP_X_TEST_USER="1")
        self.assertEqual(reused.status_code, 422)

    def test_an_anonymous_request_is_refused_with_401(self):
        text = f"anonymous {uuid.uuid4()}"
        answer = self.post("/user-notes", str(uuid.uuid4()), {"text": text})
        self.assertEqual(answer.status_code, 401)
        self.assertEqual(answer.json()["type"], PROBLEM_BASE + "principal-required")
        self.assertEqual(count(text), 0)

    def test_a_request_without_request_user_is_a_configuration_error(self):
        view = idempotent(lambda request: JsonResponse({}, status=201))
        request = RequestFactory().post("/x", "{}", content_type="application/json", HTTP_IDEMPOTENCY_KEY="k")
        with self.assertRaises(ImproperlyConfigured):
            view(request)

    def test_scope_must_be_a_function_or_shared_keys(self):
        for scope in (None, "alice", 42):
            with self.assertRaises(TypeError, msg=repr(scope)):
                idempotent(scope=scope)(lambda request: JsonResponse({}))

    def test_a_scope_function_keeps_clients_apart_and_long_keys_are_hashed(self):
        key = "L" * 219 + str(uuid.uuid4())[:36]  # 255 bytes
        text = f"client {uuid.uuid4()}"
        first = self.post("/client-notes", key, {"text": text}, HTTP_X_CLIENT="acme")
        self.assertEqual(first.status_code, 201)
        self.assertEqual(self.post("/client-notes", key, {"text": text}, HTTP_X_CLIENT="acme")["Idempotent-Replayed"],
                         "true")
        self.assertEqual(self.post("/client-notes", key, {"text": text}, HTTP_X_CLIENT="globex").status_code, 201)
        self.assertEqual(count(text), 2)
        self.assertIn("#", scoped_key("acme", key))
        self.assertEqual(key_state(scoped_key("acme", key)), "done")
        self.assertEqual(self.post("/client-notes", str(uuid.uuid4()), {"text": text}).status_code, 401)

    def test_shared_keys_are_the_clients_keys(self):
        key, text = str(uuid.uuid4()), f"shared {uuid.uuid4()}"
        self.assertEqual(self.post("/notes", key, {"text": text}, HTTP_X_TEST_USER="1").status_code, 201)
        self.assertEqual(self.post("/notes", key, {"text": text}, HTTP_X_TEST_USER="2")["Idempotent-Replayed"], "true")
        self.assertEqual(key_state(key), "done")


if __name__ == "__main__":
    unittest.main()
