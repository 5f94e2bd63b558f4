"""idempotency_pg.consumer against a real database (psycopg2 and psycopg 3)
and a recording stand-in for a pika channel: the ack comes after the commit,
a redelivery replays, IK409 requeues, IK422 and poison messages are
dead-lettered with a reason, a stored error is replied. (examples/rabbitmq
runs a pika consumer against a real RabbitMQ node in the broker suite.)"""
import hashlib
import json
import types
import unittest
import uuid

import psycopg
import psycopg2

from expiring import SHORT_TTL, wait_until_gone
from idempotency_pg import claim
from idempotency_pg.consumer import Consumer, Delivery

DRIVERS = {"psycopg2": lambda: psycopg2.connect(""), "psycopg": lambda: psycopg.connect("")}


def setUpModule():
    with psycopg.connect("", autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS py_consumer_effects (message_id text NOT NULL, amount int NOT NULL)")


def effects(message_id):
    with psycopg.connect("") as conn:
        return conn.execute("SELECT count(*) FROM py_consumer_effects WHERE message_id = %s",
                            [message_id]).fetchone()[0]


def key_state(key):
    with psycopg.connect("") as conn:
        return conn.execute("SELECT state FROM idempotency.lookup(%s)", [key]).fetchone()[0]


class Properties(types.SimpleNamespace):
    """What pika.BasicProperties carries; absent fields are None."""
    def __getattr__(self, name):
        return None


class FakeChannel:
    def __init__(self):
        self.log = []
        self.closed = False
        self.on_ack = None

    def _check(self):
        if self.closed:
            raise RuntimeError("Channel is closed")

    def basic_ack(self, tag):
        self._check()
        self.log.append(("ack", tag, self.on_ack() if self.on_ack else None))

    def basic_nack(self, tag, requeue=True):
        self._check()
        self.log.append(("nack", tag, requeue))

    def basic_publish(self, exchange, routing_key, body, properties):
        self._check()
        self.log.append(("publish", exchange, routing_key, body, properties))


tags = iter(range(1, 1 << 30))


def delivery(message_id, payload, redelivered=False, body=None, **properties):
    method = types.SimpleNamespace(delivery_tag=next(tags), redelivered=redelivered)
    props = Properties(message_id=message_id, headers=properties.pop("headers", {}), delivery_mode=2, **properties)
    return Delivery(method, props, body if body is not None else json.dumps(payload).encode())


class StoredError(Exception):
    code = "P0001"


class SerializationFailure(Exception):
    sqlstate = "40001"


def handler(cursor, payload, message):
    cursor.execute("INSERT INTO py_consumer_effects VALUES (%s, %s)", [message.properties.message_id,
                                                                       payload["amount"]])
    if payload.get("refuse"):
        raise StoredError("insufficient funds")
    if payload.get("fail"):
        raise ValueError("cannot apply")
    if payload.get("serialization"):
        raise SerializationFailure("could not serialize access")
    return {"applied": message.properties.message_id, "amount": payload["amount"]}


def give_short_ttl(conn):
    """The keys conn's transactions claim from now on live SHORT_TTL."""
    with conn.cursor() as cursor:
        cursor.execute("SELECT set_config('idempotency.ttl', %s, false)", [SHORT_TTL])
    conn.commit()


class ConsumerTests(unittest.TestCase):
    def each_driver(self):
        for name, connect in DRIVERS.items():
            with self.subTest(driver=name):
                conn = connect()
                try:
                    yield conn
                finally:
                    conn.close()

    def consumer(self, conn, channel, **options):
        events = []
        settings = dict(dead_letter={"exchange": "", "routing_key": "jobs.dead"}, max_attempts=3,
                        backoff=lambda attempt: 0, sleep=lambda seconds: None, on_event=events.append,
                        properties_class=Properties, is_stored_error=lambda e: getattr(e, "code", None) == "P0001")
        settings.update(options)
        return Consumer(conn, channel, "jobs", handler, **settings), events

    def test_ack_after_commit_and_redelivery_replays(self):
        for conn in self.each_driver():
            channel = FakeChannel()
            message_id = str(uuid.uuid4())
            channel.on_ack = lambda: effects(message_id)
            consumer, events = self.consumer(conn, channel)
            first = delivery(message_id, {"amount": 5}, reply_to="replies", correlation_id="c-1")
            consumer.on_message(first)
            consumer.on_message(Delivery(types.SimpleNamespace(delivery_tag=next(tags), redelivered=True),
                                         first.properties, first.body))
            self.assertEqual(effects(message_id), 1)
            ops = [entry[0] for entry in channel.log]
            self.assertEqual(ops, ["publish", "ack", "publish", "ack"])
            acks = [entry for entry in channel.log if entry[0] == "ack"]
            self.assertEqual([ack[2] for ack in acks], [1, 1], "the effect was committed at each ack")
            replies = [entry for entry in channel.log if entry[0] == "publish"]
            self.assertEqual(replies[0][2], "replies")
            self.assertEqual(replies[0][3], replies[1][3])
            with psycopg.connect("") as observer:
                stored = observer.execute("SELECT response::text FROM idempotency.lookup(%s)", [message_id]).fetchone()[0]
            self.assertEqual(replies[0][3], stored.encode(), "the reply is the stored answer's jsonb text")
            self.assertEqual(replies[0][4].correlation_id, "c-1")
            self.assertEqual([r[4].headers["x-idempotency-replayed"] for r in replies], [False, True])
            self.assertEqual([e["outcome"] for e in events if e["type"] == "acked"], ["ran", "replayed"])

    def test_ik422_is_dead_lettered_with_the_reason(self):
        for conn in self.each_driver():
            channel = FakeChannel()
            consumer, _ = self.consumer(conn, channel)
            message_id = str(uuid.uuid4())
            consumer.on_message(delivery(message_id, {"amount": 1}))
            consumer.on_message(delivery(message_id, {"amount": 2}))
            self.assertEqual(effects(message_id), 1)
            dead = [entry for entry in channel.log if entry[0] == "publish"][0]
            self.assertEqual(dead[2], "jobs.dead")
            self.assertEqual(dead[4].headers["x-idempotency-code"], "IK422")
            self.assertTrue(dead[4].headers["x-idempotency-reason"])
            self.assertEqual(json.loads(dead[3])["amount"], 2)
            self.assertEqual(channel.log[-1][0], "ack")

    def test_ik410_a_message_whose_answer_expired_is_acked_without_running_another_payload_is_ik422(self):
        for conn in self.each_driver():
            give_short_ttl(conn)
            channel = FakeChannel()
            consumer, events = self.consumer(conn, channel)
            message_id = str(uuid.uuid4())
            first = delivery(message_id, {"amount": 4}, reply_to="replies", correlation_id=message_id)
            consumer.on_message(first)
            wait_until_gone(key_state, message_id)
            del channel.log[:]
            consumer.on_message(Delivery(types.SimpleNamespace(delivery_tag=next(tags), redelivered=True),
                                         first.properties, first.body))
            self.assertEqual([entry[0] for entry in channel.log], ["ack"], "acked, nothing replied or requeued")
            self.assertEqual([(e["key"], e["outcome"]) for e in events if e["type"] == "acked"],
                             [(message_id, "ran"), (message_id, "gone")])
            self.assertEqual(effects(message_id), 1, "the handler did not run again")
            consumer.on_message(delivery(message_id, {"amount": 5}))
            dead = [entry for entry in channel.log if entry[0] == "publish"][0]
            self.assertEqual(dead[4].headers["x-idempotency-code"], "IK422")
            self.assertEqual(effects(message_id), 1)

    def test_ik409_is_requeued(self):
        for conn in self.each_driver():
            channel = FakeChannel()
            consumer, _ = self.consumer(conn, channel)
            message_id = str(uuid.uuid4())
            with psycopg.connect("") as holder:
                claim(holder.cursor(), message_id, None)
                message = delivery(message_id, {"amount": 1})
                consumer.on_message(message)
                holder.rollback()
            self.assertEqual(channel.log, [("nack", message.method.delivery_tag, True)])
            self.assertEqual(effects(message_id), 0)

    def test_stored_error_is_undone_replied_and_replayed(self):
        for conn in self.each_driver():
            channel = FakeChannel()
            consumer, events = self.consumer(conn, channel)
            message_id = str(uuid.uuid4())
            message = delivery(message_id, {"amount": 7, "refuse": True}, reply_to="replies", correlation_id="c")
            consumer.on_message(message)
            consumer.on_message(message)
            self.assertEqual(effects(message_id), 0)
            replies = [json.loads(entry[3]) for entry in channel.log if entry[0] == "publish"]
            self.assertEqual(replies[0], {"error": {"sqlstate": "P0001", "message": "insufficient funds",
                                                    "detail": None, "hint": None}})
            self.assertEqual(replies[1], replies[0])
            self.assertEqual([e["outcome"] for e in events if e["type"] == "acked"],
                             ["stored_error", "replayed_error"])

    def test_a_stored_error_beaten_by_another_delivery_replays_its_answer(self):
        """The stored error is written under a new claim after the rollback:
        an answer another delivery committed in between is the key's one
        answer, replayed."""
        for conn in self.each_driver():
            message_id = str(uuid.uuid4())
            message = delivery(message_id, {"amount": 7, "refuse": True})

            def store_other_answer():
                with psycopg.connect("") as other:
                    other.execute("SELECT replayed FROM idempotency.claim(%s, %s)",
                                  [message_id, hashlib.sha256(message.body).hexdigest()])
                    other.execute("INSERT INTO py_consumer_effects VALUES (%s, 1)", [message_id])
                    other.execute("SELECT idempotency.complete(%s, '{\"other\": true}')", [message_id])

            recording = AfterRollback(conn, store_other_answer)
            consumer, events = self.consumer(recording, FakeChannel())
            consumer.on_message(message)
            self.assertEqual(recording.sent.count("ROLLBACK"), 1, recording.sent)
            self.assertEqual([(e["outcome"], e["response"]) for e in events if e["type"] == "committed"],
                             [("replayed", {"other": True})])
            self.assertEqual(effects(message_id), 1, "only the other delivery's work")

    def test_poison_is_retried_then_dead_lettered(self):
        for conn in self.each_driver():
            channel = FakeChannel()
            consumer, _ = self.consumer(conn, channel)
            message_id = str(uuid.uuid4())
            consumer.on_message(delivery(message_id, {"amount": 1, "fail": True}))
            retry = channel.log[0]
            self.assertEqual((retry[0], retry[2], retry[4].headers["x-idempotency-attempts"]), ("publish", "jobs", 1))
            self.assertEqual(channel.log[1][0], "ack")
            channel.log.clear()
            consumer.on_message(delivery(message_id, {"amount": 1, "fail": True},
                                         headers={"x-idempotency-attempts": 2}))
            dead = channel.log[0]
            self.assertEqual(dead[2], "jobs.dead")
            self.assertEqual(dead[4].headers["x-idempotency-code"], "handler-error")
            self.assertIn("cannot apply", dead[4].headers["x-idempotency-reason"])
            self.assertEqual(effects(message_id), 0)

    def test_closed_channel_after_commit_then_redelivery(self):
        for conn in self.each_driver():
            channel = FakeChannel()
            consumer, events = self.consumer(conn, channel)
            message_id = str(uuid.uuid4())
            message = delivery(message_id, {"amount": 3})
            channel.closed = True
            consumer.on_message(message)
            self.assertTrue(any(e["type"] == "committed" for e in events))
            self.assertTrue(any(e["type"] == "error" for e in events))
            channel.closed = False
            consumer.on_message(message)
            self.assertEqual(effects(message_id), 1)
            self.assertEqual([e["outcome"] for e in events if e["type"] == "acked"], ["replayed"])

    def test_unparsable_and_keyless_are_dead_lettered(self):
        for conn in self.each_driver():
            channel = FakeChannel()
            consumer, _ = self.consumer(conn, channel)
            consumer.on_message(delivery(None, {"amount": 1}))
            consumer.on_message(delivery(str(uuid.uuid4()), None, body=b"{not json"))
            codes = [entry[4].headers["x-idempotency-code"] for entry in channel.log if entry[0] == "publish"]
            self.assertEqual(codes, ["no-key", "unparsable"])

    def test_a_key_no_claim_accepts_is_dead_lettered_never_requeued(self):
        for conn in self.each_driver():
            channel = FakeChannel()
            consumer, events = self.consumer(conn, channel)
            bad = ["k" * 256, "\u00e9" * 128, f"a\u0000{uuid.uuid4()}"]  # 256 bytes, 256 bytes as UTF-8, a NUL
            for key in bad:
                consumer.on_message(delivery(key, {"amount": 1}))
            longest = str(uuid.uuid4()).ljust(255, "k")
            consumer.on_message(delivery(longest, {"amount": 1}))
            codes = [entry[4].headers["x-idempotency-code"] for entry in channel.log if entry[0] == "publish"]
            self.assertEqual(codes, ["invalid-key"] * 3)
            self.assertFalse([entry for entry in channel.log if entry[0] == "nack"], "nothing requeued")
            self.assertEqual([(e["key"], e["outcome"]) for e in events if e["type"] == "acked"], [(longest, "ran")])
            # In a batch: that message alone; the others commit.
            fine = [str(uuid.uuid4()), str(uuid.uuid4())]
            consumer.on_batch([delivery(fine[0], {"amount": 1}), delivery("k" * 256, {"amount": 1}),
                               delivery(fine[1], {"amount": 1})])
            self.assertEqual([effects(i) for i in fine], [1, 1])
            codes = [entry[4].headers["x-idempotency-code"] for entry in channel.log if entry[0] == "publish"]
            self.assertEqual(codes, ["invalid-key"] * 4)

    def test_transient_database_error_requeues_without_an_attempt(self):
        for conn in self.each_driver():
            channel = FakeChannel()
            consumer, _ = self.consumer(conn, channel)
            message_id = str(uuid.uuid4())
            message = delivery(message_id, {"amount": 1, "serialization": True})
            consumer.on_message(message)
            self.assertEqual(channel.log, [("nack", message.method.delivery_tag, True)])
            self.assertEqual(effects(message_id), 0)

    def test_a_new_message_costs_three_round_trips_a_replay_two(self):
        for conn in self.each_driver():
            recording = RoundTrips(conn)
            consumer, events = self.consumer(recording, FakeChannel())
            message_id = str(uuid.uuid4())
            consumer.on_message(delivery(message_id, {"amount": 2}))
            sent = recording.sent
            self.assertEqual(len(sent), 3, sent)
            self.assertRegex(sent[0], r"^BEGIN; SELECT idempotency\.claim\([^;]*\)$")
            self.assertIn("INSERT INTO py_consumer_effects", sent[1])
            self.assertRegex(sent[2], r"^SELECT idempotency\.complete\(.*; COMMIT; ")
            sent.clear()
            consumer.on_message(delivery(message_id, {"amount": 2}, redelivered=True))
            self.assertEqual(len(sent), 2, f"a replay: BEGIN with the claim, then COMMIT: {sent}")
            self.assertEqual(effects(message_id), 1)
            self.assertEqual([e["outcome"] for e in events if e["type"] == "acked"], ["ran", "replayed"])
            self.assertFalse(conn.autocommit, "the connection is given back as it came")

    def test_a_connection_in_autocommit_or_in_a_transaction_applies_once_too(self):
        for conn in self.each_driver():
            consumer, events = self.consumer(conn, FakeChannel())
            ids = [str(uuid.uuid4()), str(uuid.uuid4())]
            conn.autocommit = True
            consumer.on_message(delivery(ids[0], {"amount": 1}))
            self.assertTrue(conn.autocommit)
            conn.autocommit = False
            with conn.cursor() as cursor:
                cursor.execute("SELECT 1")  # a transaction left open: the consumer's commit ends it
            consumer.on_message(delivery(ids[1], {"amount": 1}))
            self.assertEqual(conn.info.transaction_status, 0, "idle afterwards")
            self.assertEqual([effects(i) for i in ids], [1, 1])
            self.assertEqual([e["outcome"] for e in events if e["type"] == "acked"], ["ran", "ran"])

    def test_a_stored_error_in_the_callers_transaction_keeps_the_callers_earlier_work(self):
        for conn in self.each_driver():
            consumer, events = self.consumer(conn, FakeChannel())
            earlier, message_id = str(uuid.uuid4()), str(uuid.uuid4())
            conn.autocommit = False
            with conn.cursor() as cursor:
                cursor.execute("INSERT INTO py_consumer_effects VALUES (%s, 1)", [earlier])
            consumer.on_message(delivery(message_id, {"amount": 7, "refuse": True}))
            self.assertEqual(conn.info.transaction_status, 0, "idle afterwards")
            self.assertEqual((effects(earlier), effects(message_id)), (1, 0))
            self.assertEqual([e["outcome"] for e in events if e["type"] == "acked"], ["stored_error"])

    def test_a_key_and_an_answer_with_quotes_and_backslashes_go_through_the_literals_unchanged(self):
        for conn in self.each_driver():
            channel = FakeChannel()
            consumer, events = self.consumer(conn, channel)
            message_id = f"it's a \\ key \u00e9 {uuid.uuid4()}"
            answer = {"text": "O'Brien \\ \"quoted\" \u00e9 E'\\''"}
            consumer.handler = lambda cursor, payload, message: answer
            consumer.on_message(delivery(message_id, {"amount": 1}))
            consumer.on_message(delivery(message_id, {"amount": 1}, redelivered=True))
            self.assertEqual([e["outcome"] for e in events if e["type"] == "acked"], ["ran", "replayed"])
            self.assertEqual(key_state(message_id), "done")
            with psycopg.connect("") as observer:
                stored = observer.execute("SELECT response FROM idempotency.lookup(%s)", [message_id]).fetchone()[0]
            self.assertEqual(stored, answer)


class RoundTrips:
    """A connection that records each message it sends the server: every
    execute, and the BEGIN the driver sends before one when the connection
    is idle and not in autocommit, and its COMMIT and ROLLBACK."""

    def __init__(self, conn):
        object.__setattr__(self, "_conn", conn)
        object.__setattr__(self, "sent", [])

    def __getattr__(self, name):
        return getattr(self._conn, name)

    def __setattr__(self, name, value):
        setattr(self._conn, name, value)

    def _in_driver_transaction(self):
        return not self._conn.autocommit and self._conn.info.transaction_status != 0  # not idle

    def cursor(self):
        return RecordingCursor(self, self._conn.cursor())

    def commit(self):
        if self._in_driver_transaction():
            self.sent.append("COMMIT")
        self._conn.commit()

    def rollback(self):
        if self._in_driver_transaction():
            self.sent.append("ROLLBACK")
        self._conn.rollback()


class RecordingCursor:
    def __init__(self, recording, cursor):
        self._recording, self._cursor = recording, cursor

    def __getattr__(self, name):
        return getattr(self._cursor, name)

    def execute(self, query, params=None):
        conn = self._recording._conn
        if not conn.autocommit and conn.info.transaction_status == 0:
            self._recording.sent.append("BEGIN")
        self._recording.sent.append(query)
        return self._cursor.execute(query, params)


class AfterRollback(RoundTrips):
    """A recorded connection that calls then() after its first ROLLBACK."""

    def __init__(self, conn, then):
        super().__init__(conn)
        object.__setattr__(self, "then", then)

    def cursor(self):
        recording = self

        class Cursor(RecordingCursor):
            def execute(self, query, params=None):
                result = super().execute(query, params)
                if query == "ROLLBACK" and recording.then is not None:
                    then, recording.__dict__["then"] = recording.then, None
                    then()
                return result

        return Cursor(self, self._conn.cursor())


def writers(message_ids):
    """How many transactions wrote the effects of these messages."""
    with psycopg.connect("") as conn:
        return conn.execute("SELECT count(DISTINCT xmin::text) FROM py_consumer_effects WHERE message_id = ANY(%s)",
                            [message_ids]).fetchone()[0]


class BatchChannel(FakeChannel):
    """A FakeChannel that records basic_qos, as consume() calls it in batch mode."""

    def basic_qos(self, prefetch_count):
        self.log.append(("qos", prefetch_count))

    def basic_consume(self, queue, callback, auto_ack):
        self.callback = callback
        return "tag"


class BatchConsumerTests(unittest.TestCase):
    """Batch mode: one transaction per batch, each delivery settled as alone."""

    each_driver = ConsumerTests.each_driver

    def consumer(self, conn, channel, **options):
        return ConsumerTests.consumer(self, conn, channel, batch_size=options.pop("batch_size", 4), **options)

    def test_a_batch_costs_a_round_trip_per_handler_and_two_more(self):
        for conn in self.each_driver():
            recording = RoundTrips(conn)
            consumer, events = self.consumer(recording, BatchChannel())
            ids = [f"it's \\ {uuid.uuid4()}" for _ in range(3)]
            consumer.on_batch([delivery(i, {"amount": 1}) for i in ids])
            sent = recording.sent
            self.assertEqual(len(sent), 5, sent)
            self.assertRegex(sent[0], r"^BEGIN; SELECT .* FROM idempotency\.claim_batch\(")
            self.assertEqual(["INSERT INTO py_consumer_effects" in statement for statement in sent[1:4]], [True] * 3)
            self.assertRegex(sent[4], r"^SELECT idempotency\.complete_batch\(.*; COMMIT; ")
            self.assertEqual([effects(i) for i in ids], [1, 1, 1])
            sent.clear()
            consumer.on_batch([delivery(i, {"amount": 1}, redelivered=True) for i in ids])
            self.assertEqual(len(sent), 2, f"replays: BEGIN with claim_batch, then complete_batch with COMMIT: {sent}")
            self.assertEqual([e["outcome"] for e in events if e["type"] == "acked"], ["ran"] * 3 + ["replayed"] * 3)
            self.assertFalse(conn.autocommit, "the connection is given back as it came")

    def test_one_transaction_per_batch_and_a_redelivered_batch_replays(self):
        for conn in self.each_driver():
            channel = BatchChannel()
            consumer, events = self.consumer(conn, channel)
            consumer.consume()
            self.assertEqual(channel.log.pop(0), ("qos", 8), "the next batch gathers while one commits")
            ids = [str(uuid.uuid4()) for _ in range(4)]
            channel.on_ack = lambda: [effects(i) for i in ids]
            batch = [delivery(i, {"amount": n}, reply_to="replies", correlation_id=i) for n, i in enumerate(ids)]
            for message in batch:  # the fourth fills the batch
                channel.callback(channel, message.method, message.properties, message.body)
            self.assertEqual([effects(i) for i in ids], [1, 1, 1, 1])
            self.assertEqual(writers(ids), 1, "one transaction wrote the whole batch")
            acks = [entry for entry in channel.log if entry[0] == "ack"]
            self.assertEqual([ack[2] for ack in acks], [[1, 1, 1, 1]] * 4, "every effect was committed at each ack")
            types_seen = [e["type"] for e in events]
            self.assertLess(max(n for n, t in enumerate(types_seen) if t == "committing"), types_seen.index("committed"))
            self.assertLess(max(n for n, t in enumerate(types_seen) if t == "committed"), types_seen.index("acked"),
                            "the whole batch is committed before any of it is acked")
            first = sorted(entry[3] for entry in channel.log if entry[0] == "publish")
            channel.log.clear()
            consumer.on_batch([Delivery(types.SimpleNamespace(delivery_tag=next(tags), redelivered=True),
                                        m.properties, m.body) for m in batch])
            self.assertEqual([effects(i) for i in ids], [1, 1, 1, 1], "a redelivered batch does not run again")
            self.assertEqual(sorted(entry[3] for entry in channel.log if entry[0] == "publish"), first)
            self.assertEqual([e["outcome"] for e in events if e["type"] == "acked"], ["ran"] * 4 + ["replayed"] * 4)

    def test_a_failing_handler_is_settled_alone_and_the_rest_commits_without_its_writes(self):
        for conn in self.each_driver():
            channel = FakeChannel()
            consumer, events = self.consumer(conn, channel)
            ids = [str(uuid.uuid4()) for _ in range(4)]
            consumer.on_batch([delivery(ids[0], {"amount": 1}), delivery(ids[1], {"amount": 2, "fail": True}),
                               delivery(ids[2], {"amount": 3, "refuse": True}),
                               delivery(ids[3], {"amount": 4, "serialization": True})])
            self.assertEqual([effects(i) for i in ids], [1, 0, 0, 0])
            retry = [entry for entry in channel.log if entry[0] == "publish" and entry[2] == "jobs"]
            self.assertEqual([(r[4].message_id, r[4].headers["x-idempotency-attempts"]) for r in retry], [(ids[1], 1)])
            self.assertEqual({e["delivery"].properties.message_id: e["outcome"] for e in events if e["type"] == "acked"
                              and "outcome" in e}, {ids[0]: "ran", ids[2]: "stored_error"})
            self.assertEqual([entry[1:] for entry in channel.log if entry[0] == "nack"],
                             [(consumer_tag(events, ids[3]), True)])

    def test_refusals_and_poison_in_a_batch_are_settled_as_alone(self):
        for conn in self.each_driver():
            channel = FakeChannel()
            consumer, events = self.consumer(conn, channel)
            held, reused, twice, fine = (str(uuid.uuid4()) for _ in range(4))
            consumer.on_batch([delivery(reused, {"amount": 1})])
            with psycopg.connect("") as holder:
                claim(holder.cursor(), held, None)
                consumer.on_batch([delivery(held, {"amount": 1}), delivery(reused, {"amount": 2}),
                                   delivery(twice, {"amount": 3}), delivery(twice, {"amount": 3}),
                                   delivery(str(uuid.uuid4()), None, body=b"{not json"),
                                   delivery(fine, {"amount": 4})])
                holder.rollback()
            self.assertEqual([effects(i) for i in (held, reused, twice, fine)], [0, 1, 1, 1])
            requeued = sorted((e["key"], e["error"].sqlstate if hasattr(e["error"], "sqlstate") else e["error"].code)
                              for e in events if e["type"] == "requeued")
            self.assertEqual(requeued, sorted([(held, "IK409"), (twice, "IK508")]))
            codes = sorted(entry[4].headers["x-idempotency-code"] for entry in channel.log if entry[0] == "publish")
            self.assertEqual(codes, ["IK422", "unparsable"])

    def test_a_message_whose_answer_expired_is_acked_without_running_the_rest_of_its_batch_runs(self):
        for conn in self.each_driver():
            give_short_ttl(conn)
            channel = FakeChannel()
            consumer, events = self.consumer(conn, channel)
            gone, fresh = str(uuid.uuid4()), str(uuid.uuid4())
            consumer.on_batch([delivery(gone, {"amount": 4})])
            wait_until_gone(key_state, gone)
            consumer.on_batch([delivery(gone, {"amount": 4}), delivery(fresh, {"amount": 5})])
            self.assertEqual([effects(gone), effects(fresh)], [1, 1], "the gone message did not run again")
            self.assertEqual([(e["key"], e["outcome"]) for e in events if e["type"] == "acked"],
                             [(gone, "ran"), (gone, "gone"), (fresh, "ran")])
            self.assertEqual([entry for entry in channel.log if entry[0] == "nack"], [], "nothing requeued")

    def test_a_database_error_requeues_the_whole_batch(self):
        for conn in self.each_driver():
            channel = FakeChannel()
            consumer, _ = self.consumer(conn, channel, wait_timeout="forever")
            ids = [str(uuid.uuid4()) for _ in range(2)]
            consumer.on_batch([delivery(i, {"amount": 1}) for i in ids])
            self.assertEqual([effects(i) for i in ids], [0, 0])
            self.assertEqual([entry[0] for entry in channel.log], ["nack", "nack"])

    def test_batch_size_must_be_a_whole_number(self):
        for conn in self.each_driver():
            with self.assertRaises(ValueError):
                Consumer(conn, FakeChannel(), "jobs", handler, batch_size=0)


def consumer_tag(events, message_id):
    return next(e["delivery"].method.delivery_tag for e in events
                if e["type"] == "delivered" and e["delivery"].properties.message_id == message_id)


if __name__ == "__main__":
    unittest.main()
