"""Every Python block of docs/frameworks.md, run as written: each block
follows a marker line `<!-- python-snippet: NAME -->`, and NAME's test
below runs it (a block without a marker, or a marker without a test,
fails). The FastAPI application is served by uvicorn from the tests'
environment with the documented command."""
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import types
import unittest
import urllib.error
import urllib.request
import uuid

import djsite
from django.db import connection
from django.test import RequestFactory
from idempotency_pg import scoped_key

DOCS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "docs", "frameworks.md")
MARKER = re.compile(r"<!-- python-snippet: ([a-z_]+) -->\n```python\n(.*?)```\n", re.S)


def snippets():
    with open(DOCS, encoding="utf-8") as file:
        text = file.read()
    found = dict(MARKER.findall(text))
    return found, text.count("```python")


def create_tables():
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE IF NOT EXISTS accounts (id text PRIMARY KEY, balance bigint NOT NULL)")
        cursor.execute("CREATE TABLE IF NOT EXISTS charges (id bigserial PRIMARY KEY, account text NOT NULL,"
                       " amount bigint NOT NULL)")


def open_account(account, balance):
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO accounts VALUES (%s, %s)", [account, balance])


def account(account_id):
    """(balance, number of charges)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT balance, (SELECT count(*) FROM charges WHERE account = a.id) FROM accounts a"
                       " WHERE id = %s", [account_id])
        return cursor.fetchone()


def kept_for(key):
    with connection.cursor() as cursor:
        cursor.execute("SELECT expires_at - created_at FROM idempotency.lookup(%s)", [key])
        return cursor.fetchone()[0]


def free_port():
    base = int(os.environ.get("TEST_PORT_BASE") or 0)
    if base:
        return base + 45
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def post(url, body, headers):
    request = urllib.request.Request(url, json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json", **headers})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()


class DocSnippetTests(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.snippets, cls.blocks = snippets()
        create_tables()

    def test_every_python_block_is_marked_and_run_here(self):
        self.assertEqual(len(self.snippets), self.blocks, "a ```python block without its marker")
        for name in self.snippets:
            self.assertTrue(hasattr(self, f"run_{name}"), f"no test runs the snippet {name}")

    def test_snippets(self):
        for name, code in self.snippets.items():
            with self.subTest(name):
                getattr(self, f"run_{name}")(code)

    def run_django_view(self, code):
        module = types.ModuleType("doc_django_view")
        exec(compile(code, f"{DOCS}:django_view", "exec"), module.__dict__)
        user = djsite._TestUser(int(uuid.uuid4().int % 1_000_000_000))
        open_account(str(user.pk), 10_000)
        key = str(uuid.uuid4())

        def charge(amount):
            request = RequestFactory().post("/charges", json.dumps({"amount": amount}),
                                            content_type="application/json", HTTP_IDEMPOTENCY_KEY=key)
            request.user = user
            return module.create_charge(request)

        first, retry = charge(300), charge(300)
        self.assertEqual((first.status_code, json.loads(first.content)["balance"]), (201, 9_700))
        self.assertEqual((retry.content, retry["Idempotent-Replayed"]), (first.content, "true"))
        self.assertEqual(charge(500).status_code, 422)
        self.assertEqual(account(str(user.pk)), (9_700, 1))
        self.assertEqual(kept_for(scoped_key(user.pk, key)).days, 7)

    def run_fastapi_app(self, code):
        directory = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, directory)
        with open(os.path.join(directory, "app.py"), "w", encoding="utf-8") as file:
            file.write(code)
        user = f"user-{uuid.uuid4()}"
        open_account(user, 10_000)
        port = free_port()
        # The documented command, from this environment's python (the venv's, under packages/run-tests).
        server = subprocess.Popen([sys.executable, "-m", "uvicorn", "app:app", "--port", str(port)], cwd=directory,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.addCleanup(server.stdout.close)
        self.addCleanup(server.wait, 30)
        self.addCleanup(server.terminate)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(url + "/openapi.json", timeout=5) as response:
                    openapi = json.load(response)
                break
            except (urllib.error.URLError, ConnectionError):
                if server.poll() is not None or time.monotonic() > deadline:
                    self.fail(f"uvicorn did not start: {server.stdout.read().decode(errors='replace')}")
                time.sleep(0.2)
        operation = openapi["paths"]["/charges"]["post"]
        self.assertIn("Idempotency-Key", [parameter["name"] for parameter in operation["parameters"]])
        key, bearer = str(uuid.uuid4()), {"Authorization": f"Bearer {user}"}
        first = post(url + "/charges", {"amount": 300}, {"Idempotency-Key": key, **bearer})
        retry = post(url + "/charges", {"amount": 300}, {"Idempotency-Key": key, **bearer})
        self.assertEqual((first[0], json.loads(first[2])["balance"]), (201, 9_700))
        self.assertEqual((retry[0], retry[2], retry[1].get("idempotent-replayed")), (201, first[2], "true"))
        nobody = post(url + "/charges", {"amount": 300}, {"Idempotency-Key": str(uuid.uuid4())})
        self.assertEqual((nobody[0], json.loads(nobody[2])["type"]),
                         (401, "urn:idempotency:problem:principal-required"))
        self.assertEqual(account(user), (9_700, 1))
        self.assertEqual(kept_for(scoped_key(user, key)).days, 7)


if __name__ == "__main__":
    unittest.main()
