"""A competing consumer of the `transfers` queue in Python: the same work as
consumer.js, through idempotency_pg.consumer with pika (python3-pika) and
psycopg2: claim, apply, store the answer, COMMIT, reply, then ack.

    AMQP_URL=amqp://... PGHOST=... PGDATABASE=... PGUSER=... \\
      PYTHONPATH=packages/python/src /usr/bin/python3 consumer.py [--prefetch N] [--batch N]

--batch N (or STORM_BATCH=N): batch mode, N messages per transaction
(Consumer's batch_size), with a prefetch of 2N.

Prints one JSON line per event, as consumer.js does. Exits 0 on SIGTERM
once the delivery in hand is settled, 3 when the broker connection is lost.

For the fault storm (storm.js) only:
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
committed = 0  # deliveries committed, for STORM_KILL_AT


def log(**line):
    os.write(1, (json.dumps({"pid": os.getpid(), "t": int(time.time() * 1000), **line}) + "\n").encode())


def apply_transfer(cursor, payload, delivery):
    message_id = delivery.properties.message_id
    if payload.get("poison"):
        raise ValueError(f"message {message_id} cannot be applied: {payload['poison']}")
    cursor.execute("SELECT public.apply_transfer(%s, %s, %s)::text", [message_id, payload["account"], payload["amount"]])
    return json.loads(cursor.fetchone()[0])


def on_event(event):
    global committed
    delivery, kind = event["delivery"], event["type"]
    message_id = delivery.properties.message_id if delivery is not None else None
    if kind == "committed":
        log(event="committed", id=message_id, outcome=event["outcome"])
        committed += 1
        if KILL_POINT == "after-commit" and committed == KILL_AT:
            log(event="kill", point="after-commit", id=message_id)
            os.kill(os.getpid(), signal.SIGKILL)
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
    Consumer(conn, channel, QUEUE, apply_transfer, dead_letter={"exchange": "", "routing_key": DEAD_LETTERS},
             is_stored_error=lambda error: getattr(error, "pgcode", None) == "P0001", max_attempts=3,
             on_event=on_event, batch_size=batch).consume()
    signal.signal(signal.SIGTERM, lambda *_: connection.add_callback_threadsafe(channel.stop_consuming))
    log(event="consuming", prefetch=prefetch, batch=batch, consumer="python")
    try:
        channel.start_consuming()
    except (pika.exceptions.AMQPConnectionError, pika.exceptions.AMQPChannelError) as error:
        log(event="connection-closed", error=repr(error))
        sys.exit(3)
    connection.close()  # unacked deliveries go back to the queue
    log(event="stopped")


if __name__ == "__main__":
    main()
