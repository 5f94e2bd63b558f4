"""A competing consumer of the `transfers` queue in Python: the same work as
consumer.js, through idempotency_pg.consumer with pika (python3-pika) and
psycopg2: claim, apply, store the answer, COMMIT, reply, then ack.

    AMQP_URL=amqp://... PGHOST=... PGDATABASE=... PGUSER=... \\
      PYTHONPATH=packages/python/src /usr/bin/python3 consumer.py [--prefetch N]

Prints one JSON line per event, as consumer.js does. Exits 0 on SIGTERM
once the delivery in hand is settled, 3 when the broker connection is lost.
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


def log(**line):
    os.write(1, (json.dumps({"pid": os.getpid(), "t": int(time.time() * 1000), **line}) + "\n").encode())


def apply_transfer(cursor, payload, delivery):
    message_id = delivery.properties.message_id
    if payload.get("poison"):
        raise ValueError(f"message {message_id} cannot be applied: {payload['poison']}")
    cursor.execute("SELECT public.apply_transfer(%s, %s, %s)::text", [message_id, payload["account"], payload["amount"]])
    return json.loads(cursor.fetchone()[0])


def on_event(event):
    delivery, kind = event["delivery"], event["type"]
    message_id = delivery.properties.message_id if delivery is not None else None
    if kind == "acked":
        log(event="acked", id=message_id, outcome=event["outcome"], redelivered=bool(delivery.method.redelivered),
            consumer="python")
    elif kind == "dead-lettered":
        log(event="dead-lettered", id=message_id, code=event["code"], reason=event["reason"])
    elif kind in ("requeued", "retried"):
        log(event=kind, id=message_id, attempts=event["attempts"], error=str(event["error"]))
    elif kind == "error":
        log(event="settle-failed", id=message_id, error=str(event["error"]))


def main():
    prefetch = int(sys.argv[sys.argv.index("--prefetch") + 1]) if "--prefetch" in sys.argv else 16
    conn = psycopg2.connect("")
    connection = pika.BlockingConnection(pika.URLParameters(os.environ["AMQP_URL"]))
    channel = connection.channel()
    channel.confirm_delivery()  # replies, retries and dead letters are confirmed before the ack
    for queue in (QUEUE, DEAD_LETTERS, REPLIES):
        channel.queue_declare(queue, durable=True)
    channel.basic_qos(prefetch_count=prefetch)
    Consumer(conn, channel, QUEUE, apply_transfer, dead_letter={"exchange": "", "routing_key": DEAD_LETTERS},
             is_stored_error=lambda error: getattr(error, "pgcode", None) == "P0001", max_attempts=3,
             on_event=on_event).consume()
    signal.signal(signal.SIGTERM, lambda *_: connection.add_callback_threadsafe(channel.stop_consuming))
    log(event="consuming", prefetch=prefetch, consumer="python")
    try:
        channel.start_consuming()
    except (pika.exceptions.AMQPConnectionError, pika.exceptions.AMQPChannelError) as error:
        log(event="connection-closed", error=repr(error))
        sys.exit(3)
    connection.close()  # unacked deliveries go back to the queue
    log(event="stopped")


if __name__ == "__main__":
    main()
