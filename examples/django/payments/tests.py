"""End-to-end tests of idempotency_pg's @idempotent decorator (packages/python)
through POST /payments.

TransactionTestCase, not TestCase: every request must really commit (or roll
back), and a second connection must see a key that a request holds."""
import json
import threading
import time
import uuid
from unittest import mock

from django.db import connection, connections
from django.test import Client, TransactionTestCase

from . import processor
from .models import Account, Payment

PROBLEM_BASE = "urn:idempotency:problem:"


def wait_for(condition, what, timeout=10):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


class IdempotentViewTests(TransactionTestCase):
    def setUp(self):
        # CSRF checks on, as in production: the view is @csrf_exempt.
        self.client = Client(raise_request_exception=False, enforce_csrf_checks=True)
        self.account = Account.objects.create(owner="Ada", balance_cents=10_000)

    def pay(self, key, amount=2_500, account=None, client=None):
        extra = {} if key is None else {"HTTP_IDEMPOTENCY_KEY": key}
        body = {"account_id": (account or self.account).pk, "amount_cents": amount}
        return (client or self.client).post("/payments", json.dumps(body),
                                            content_type="application/json", **extra)

    def balance(self):
        self.account.refresh_from_db()
        return self.account.balance_cents

    def payments(self):
        return list(Payment.objects.filter(account=self.account).values_list("status", flat=True))

    def assert_problem(self, response, status, type_):
        self.assertEqual(response.status_code, status)
        self.assertEqual(response["Content-Type"], "application/problem+json")
        self.assertEqual(response.json()["type"], PROBLEM_BASE + type_)

    def test_first_request_runs_the_view_and_commits(self):
        response = self.pay(str(uuid.uuid4()))

        self.assertEqual(response.status_code, 201)
        self.assertFalse(response.has_header("Idempotent-Replayed"))
        self.assertEqual(response.json()["balance_cents"], 7_500)
        self.assertEqual(self.balance(), 7_500)
        self.assertEqual(self.payments(), ["succeeded"])

    def test_retry_replays_status_headers_and_body(self):
        key = str(uuid.uuid4())
        first = self.pay(key)
        retry = self.pay(key)

        self.assertEqual(retry.status_code, 201)
        self.assertEqual(retry["Idempotent-Replayed"], "true")
        self.assertEqual(retry.content, first.content)
        self.assertEqual(retry["Content-Type"], "application/json")
        self.assertEqual(retry["Location"], first["Location"])
        self.assertEqual(self.balance(), 7_500)
        self.assertEqual(self.payments(), ["succeeded"])

        with connection.cursor() as cursor:
            cursor.execute("SELECT response::text FROM idempotency.lookup(%s)", [key])
            stored = json.loads(cursor.fetchone()[0])
        self.assertEqual(stored, {
            "status": 201,
            "headers": {"Content-Type": "application/json", "Location": first["Location"]},
            "body": first.content.decode(),
        })

    def test_concurrent_duplicate_is_409_with_retry_after(self):
        key = str(uuid.uuid4())
        # Holding the account's row lock keeps the first request inside the
        # view, after it claimed the key.
        # A connection of the driver Django uses (psycopg2 or psycopg 3),
        # outside Django's transaction handling.
        holder = connection.get_new_connection(connection.get_connection_params())
        first = {}

        def first_request():
            try:
                first["response"] = self.pay(key, client=Client())
            finally:
                connections.close_all()

        thread = threading.Thread(target=first_request)
        try:
            with holder.cursor() as cursor:
                cursor.execute("SELECT FROM payments_account WHERE id = %s FOR UPDATE", [self.account.pk])
            thread.start()
            wait_for(self.someone_waits_for_a_lock, "the first request to wait for the account")

            duplicate = self.pay(key)
            self.assert_problem(duplicate, 409, "request-in-progress")
            self.assertEqual(duplicate["Retry-After"], "1")
        finally:
            holder.commit()
            holder.close()
            thread.join(timeout=30)

        self.assertEqual(first["response"].status_code, 201)
        retry = self.pay(key)
        self.assertEqual(retry["Idempotent-Replayed"], "true")
        self.assertEqual(retry.content, first["response"].content)
        self.assertEqual(self.payments(), ["succeeded"])

    def someone_waits_for_a_lock(self):
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_stat_activity"
                           " WHERE datname = current_database() AND wait_event_type = 'Lock'")
            return cursor.fetchone()[0] > 0

    def test_changed_body_is_422_and_runs_nothing(self):
        key = str(uuid.uuid4())
        self.assertEqual(self.pay(key, amount=2_500).status_code, 201)

        self.assert_problem(self.pay(key, amount=3_000), 422, "idempotency-key-reused")
        self.assertEqual(self.balance(), 7_500)
        self.assertEqual(self.payments(), ["succeeded"])

    def test_4xx_answer_is_stored_with_its_effects_and_replayed(self):
        key = str(uuid.uuid4())
        declined = self.pay(key, amount=50_000)
        self.assertEqual(declined.status_code, 402)

        # Funds arrive; the retry still gets the stored answer.
        Account.objects.filter(pk=self.account.pk).update(balance_cents=100_000)
        retry = self.pay(key, amount=50_000)
        self.assertEqual(retry.status_code, 402)
        self.assertEqual(retry["Idempotent-Replayed"], "true")
        self.assertEqual(retry.content, declined.content)
        self.assertEqual(self.payments(), ["declined"])
        self.assertEqual(self.balance(), 100_000)

    def assert_not_stored_and_retry_runs_again(self, key):
        self.assertEqual(self.payments(), [])  # the view's writes rolled back
        self.assertEqual(self.balance(), 10_000)

        retry = self.pay(key)
        self.assertEqual(retry.status_code, 201)
        self.assertFalse(retry.has_header("Idempotent-Replayed"))
        self.assertEqual(self.payments(), ["succeeded"])
        self.assertEqual(self.balance(), 7_500)

    def test_5xx_response_is_not_stored_and_the_retry_runs_again(self):
        key = str(uuid.uuid4())
        with mock.patch("payments.processor.capture", side_effect=processor.Unavailable):
            unavailable = self.pay(key)
        self.assertEqual(unavailable.status_code, 503)
        self.assertEqual(unavailable["Retry-After"], "1")
        self.assert_not_stored_and_retry_runs_again(key)

    def test_exception_is_not_stored_and_the_retry_runs_again(self):
        key = str(uuid.uuid4())
        with mock.patch("payments.processor.capture", side_effect=RuntimeError("processor bug")):
            failed = self.pay(key)
        self.assertEqual(failed.status_code, 500)
        self.assert_not_stored_and_retry_runs_again(key)

    def test_missing_or_invalid_key_is_400_and_runs_nothing(self):
        self.assert_problem(self.pay(None), 400, "missing-idempotency-key")
        self.assert_problem(self.pay(""), 400, "invalid-idempotency-key")
        self.assert_problem(self.pay("k" * 256), 400, "invalid-idempotency-key")
        self.assertEqual(self.payments(), [])

        self.assertEqual(self.pay(str(uuid.uuid4()).ljust(255, "k")).status_code, 201)
