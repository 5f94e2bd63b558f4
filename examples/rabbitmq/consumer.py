"""A competing consumer of the `transfers` queue in Python: the same work as
consumer.js, through idempotency_pg.consumer with pika (python3-pika) and
psycopg2: claim, apply, store the answer, COMMIT, reply, then ack.

    AMQP_URL=amqp://... PGHOST=... PGDATABASE=... PGUSER=... \\
      PYTHONPATH=packages/python/src /usr/bin/python3 consumer.py [--plain|--textbook] [--prefetch N] [--batch N]

--plain, --textbook: as consumer.js's, for the benchmark: the same work
without the extension, with no deduplication (--plain) or with the textbook
inbox (--textbook: the message id inserted into public.processed_messages
with ON CONFLICT DO NOTHING in the work's transaction; a message whose id is
there already is acked without its work and without a reply).
--batch N (or STORM_BATCH=N): batch mode, N messages per transaction
(Consumer's batch_size), with a prefetch of 2N.

Prints one JSON line per event, as consumer.js does. Exits 0 on SIGTERM
once the delivery in hand is settled, 3 when the broker connection is lost.

For the fault storm (storm.js) and the textbook's redelivery check only:
  STORM_KILL_POINT=after-commit STORM_KILL_AT=n
      SIGKILL itself at the n-th delivery committed, before its reply and ack
"""
import json
import os
import signal
import sys
import time

import pika
import psycopg2

from idempotency_pg.consumer import Consumer

QUEUE, DEAD_LETTERS, REPLIES = "transfers", "transfers.dead", "transfers.replies"
KILL_POINT = os.environ.get("STORM_KILL_POINT")
KILL_AT = int(os.environ.get("STORM_KILL_AT") or 0)
BATCH = int(sys.argv[sys.argv.index("--batch") + 1]) if "--batch" in sys.argv else int(
    os.environ.get("STORM_BATCH") or 1)
PLAIN, TEXTBOOK = "--plain" in sys.argv, "--textbook" in sys.argv
TRANSIENT_CLASSES = ("08", "40", "53", "57", "58")  # requeued by the consumers without the extension
committed = 0  # deliveries committed, for STORM_KILL_AT


def log(**line):
    os.write(1, (json.dumps({"pid": os.getpid(), "t": int(time.time() * 1000), **line}) + "\n").encode())


def apply_transfer(cursor, payload, delivery):
    message_id = delivery.properties.message_id
    if payload.get("poison"):
        raise ValueError(f"message {message_id} cannot be applied: {payload['poison']}")
    cursor.execute("SELECT public.apply_transfer(%s, %s, %s)::text", [message_id, payload["account"], payload["amount"]])
    return json.loads(cursor.fetchone()[0])


def after_commit(message_id):
    global committed
    committed += 1
    if KILL_POINT == "after-commit" and committed == KILL_AT:
        log(event="kill", point="after-commit", id=message_id)
        os.kill(os.getpid(), signal.SIGKILL)


def on_event(event):
    delivery, kind = event["delivery"], event["type"]
    message_id = delivery.properties.message_id if delivery is not None else None
    if kind == "committed":
        if KILL_POINT:  # logged in storms only, as consumer.js does
            log(event="committed", id=message_id, outcome=event["outcome"])
        after_commit(message_id)
    elif kind == "acked":
        log(event="acked", id=message_id, outcome=event["outcome"], redelivered=bool(delivery.method.redelivered),
            consumer="python", **({"batch": BATCH} if BATCH > 1 else {}))
    elif kind == "dead-lettered":
        log(event="dead-lettered", id=message_id, code=event["code"], reason=event["reason"])
    elif kind in ("requeued", "retried"):
        log(event=kind, id=message_id, attempts=event["attempts"], code=getattr(event["error"], "code", None),
            error=str(event["error"]))
    elif kind == "error":
        log(event="settle-failed", id=message_id, error=str(event["error"]))


class WithoutExtension:
    """--plain and --textbook: deliveries applied in transactions of up to
    batch messages (gathered as Consumer gathers them), then replied
    (confirmed) and acked; a failed transaction's deliveries are requeued
    when the error is transient, else dead-lettered."""

    def __init__(self, conn, channel, batch, textbook):
        self.conn, self.channel, self.batch, self.textbook = conn, channel, batch, textbook
        self.gathered, self.timer = [], None

    def on_delivery(self, channel, method, properties, body):
        self.gathered.append((method, properties, body))
        if len(self.gathered) >= self.batch:
            self.flush()
        elif self.timer is None:
            self.timer = channel.connection.call_later(0.01, self.flush)

    def flush(self):
        if self.timer is not None:
            self.channel.connection.remove_timeout(self.timer)
            self.timer = None
        deliveries, self.gathered = self.gathered, []
        if deliveries:
            self.apply(deliveries)

    def first_seen(self, cursor, ids):
        """The textbook inbox: the ids not in public.processed_messages yet,
        inserted now in this transaction (a concurrent transaction inserting
        one of them makes this wait for its COMMIT or ROLLBACK)."""
        if len(ids) == 1:
            cursor.execute("INSERT INTO public.processed_messages (message_id) VALUES (%s) ON CONFLICT DO NOTHING",
                           ids)
            return set(ids) if cursor.rowcount == 1 else set()
        cursor.execute("INSERT INTO public.processed_messages (message_id) SELECT unnest(%s::text[])"
                       " ON CONFLICT DO NOTHING RETURNING message_id", [ids])
        return {row[0] for row in cursor.fetchall()}

    def apply(self, deliveries):
        ids = [properties.message_id for _, properties, _ in deliveries]
        answers = []
        try:
            with self.conn.cursor() as cursor:
                fresh = self.first_seen(cursor, ids) if self.textbook else None
                for method, properties, body in deliveries:
                    is_new = fresh is None or properties.message_id in fresh
                    if is_new and fresh is not None:
                        fresh.discard(properties.message_id)  # a second copy in the batch is a duplicate too
                    answers.append(apply_transfer(cursor, json.loads(body), Delivery(method, properties))
                                   if is_new else None)
            self.conn.commit()
        except Exception as error:  # noqa: BLE001 -- settled below
            self.conn.rollback()
            code = getattr(error, "pgcode", None)
            requeue = (code or "")[:2] in TRANSIENT_CLASSES
            for method, properties, _ in deliveries:
                self.channel.basic_nack(method.delivery_tag, requeue=requeue)
                log(event="requeued" if requeue else "dead-lettered", id=properties.message_id, code=code,
                    reason=str(error))
            return
        for message_id in ids:
            after_commit(message_id)
        for (method, properties, _), answer in zip(deliveries, answers):
            if answer is not None and properties.reply_to:
                self.channel.basic_publish("", properties.reply_to, json.dumps(answer).encode(), pika.BasicProperties(
                    correlation_id=properties.correlation_id, content_type="application/json", delivery_mode=2))
        for (method, properties, _), answer in zip(deliveries, answers):
            self.channel.basic_ack(method.delivery_tag)
            log(event="acked", id=properties.message_id, outcome="duplicate" if answer is None else "ran",
                redelivered=bool(method.redelivered), consumer="python",
                **({"batch": self.batch} if self.batch > 1 else {}))


class Delivery:
    """What apply_transfer reads of a delivery: its properties."""
    __slots__ = ("method", "properties")

    def __init__(self, method, properties):
        self.method, self.properties = method, properties


def main():
    if KILL_POINT not in (None, "", "after-commit"):
        sys.exit(f"consumer.py: STORM_KILL_POINT={KILL_POINT} is not supported (after-commit only)")
    batch = BATCH
    prefetch = int(sys.argv[sys.argv.index("--prefetch") + 1]) if "--prefetch" in sys.argv else (
        2 * batch if batch > 1 else 16)
    conn = psycopg2.connect("")
    connection = pika.BlockingConnection(pika.URLParameters(os.environ["AMQP_URL"]))
    channel = connection.channel()
    channel.confirm_delivery()  # replies, retries and dead letters are confirmed before the ack
    for queue in (QUEUE, DEAD_LETTERS, REPLIES):
        channel.queue_declare(queue, durable=True)
    # Before consuming: a prefetch set afterwards does not apply to the consumer.
    channel.basic_qos(prefetch_count=prefetch)
    if PLAIN or TEXTBOOK:
        channel.basic_consume(QUEUE, WithoutExtension(conn, channel, batch, TEXTBOOK).on_delivery, auto_ack=False)
    else:
        Consumer(conn, channel, QUEUE, apply_transfer, dead_letter={"exchange": "", "routing_key": DEAD_LETTERS},
                 is_stored_error=lambda error: getattr(error, "pgcode", None) == "P0001", max_attempts=3,
                 on_event=on_event, batch_size=batch).consume()
    signal.signal(signal.SIGTERM, lambda *_: connection.add_callback_threadsafe(channel.stop_consuming))
    log(event="consuming", prefetch=prefetch, batch=batch, plain=PLAIN, textbook=TEXTBOOK, consumer="python")
    try:
        channel.start_consuming()
    except (pika.exceptions.AMQPConnectionError, pika.exceptions.AMQPChannelError) as error:
        log(event="connection-closed", error=repr(error))
        sys.exit(3)
    connection.close()  # unacked deliveries go back to the queue
    log(event="stopped")


if __name__ == "__main__":
    main()
