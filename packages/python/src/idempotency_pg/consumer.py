"""A message-broker consumer that applies each message once (the inbox
pattern on a real broker), for pika (RabbitMQ) and a psycopg2 or psycopg 3
connection: for every delivery, claim the message's key in the consumer's
own database transaction, run the handler there, store its answer with the
key, COMMIT, and only then acknowledge the delivery.

A delivery lost between the commit and the ack comes back (redelivered after
a crash, a closed channel or a broker restart); its claim replays the stored
answer instead of running the handler again, and it is acked.

    IK409 (another consumer holds the key right now)  -> requeued after a backoff
    IK410 (it ran; its answer is no longer kept)      -> acked without running, no reply
    IK422 (the key was used for another payload)      -> dead-lettered with the reason
    handler error chosen by is_stored_error           -> stored as the answer, acked
    other handler error                               -> retried max_attempts times, then dead-lettered
    the database's transient errors (08, 40, 53, 57, 58 classes) -> requeued after a backoff
    a reply_to on the message                         -> the stored answer (jsonb's text) is published
                                                         to it with the message's correlation_id

With batch_size > 1, deliveries are gathered into batches (up to
batch_size, or what arrived within batch_wait seconds of the first) and each
batch is one transaction: one idempotency.claim_batch for every key, the
handlers in turn, one idempotency.complete_batch, COMMIT, then the replies
and acks. A handler that fails rolls the batch back; that message is settled
as above and the rest of the batch runs again without it (a stored error is
kept as its answer for that run), so a batch that commits carries no failed
handler's writes.

The channel is a pika BlockingChannel; with confirm_delivery() on it, every
reply, retry and dead letter is confirmed by the broker before the ack.
pika itself is not a dependency: any object with its basic_consume,
basic_ack, basic_nack and basic_publish methods works.
"""
import contextlib
import hashlib
import json
import random
import re
import time

from .db import Sealable, _wait_timeout_setting
from .errors import InvalidKey, KeyGone, KeyInProgress, KeyReused, claim_error, sqlstate_of
from .key import MAX_KEY_BYTES

ATTEMPTS_HEADER = "x-idempotency-attempts"
REASON_HEADER = "x-idempotency-reason"
CODE_HEADER = "x-idempotency-code"
REPLAYED_HEADER = "x-idempotency-replayed"


class HandlerFailure(Exception):
    """The handler's own error, kept apart from the claim's and the database's."""


# SQLSTATE classes of errors that say nothing about the message: the
# connection (08), a serialization failure or deadlock (40), resources (53), a
# shutdown (57), the system (58). A handler that meets one is not failing: the
# message is requeued like any other transient failure, its attempts not
# counted.
TRANSIENT_CLASSES = frozenset({"08", "40", "53", "57", "58"})


def is_transient(error):
    code = sqlstate_of(error)
    return isinstance(code, str) and len(code) == 5 and code[:2] in TRANSIENT_CLASSES


def default_backoff(attempt):
    """Seconds before the attempt-th requeue or retry: exponential, with jitter."""
    ceiling = min(0.05 * 2 ** attempt, 5.0)
    return ceiling / 2 + random.random() * ceiling / 2


def error_document(error):
    """The document stored for an error: the shape idempotent_call stores for
    idempotency.store_errors."""
    diag = getattr(error, "diag", None)

    def field(name, diag_name):
        value = getattr(error, name, None)
        if value is None and diag is not None:
            value = getattr(diag, diag_name, None)
        return None if value is None else str(value)

    message = field("message", "message_primary")
    if message is None:
        message = str(error).strip() or None
    return {"error": {"sqlstate": sqlstate_of(error) or field("code", "sqlstate"), "message": message,
                      "detail": field("detail", "message_detail"), "hint": field("hint", "message_hint")}}


def is_error_document(value):
    return isinstance(value, dict) and len(value) == 1 and isinstance(value.get("error"), dict)


# A message costs the round trips of a consumer without idempotency (BEGIN,
# the handler's work, COMMIT): BEGIN goes with the claim in one message, and
# the complete with COMMIT in another. So the statements carry BEGIN and
# COMMIT themselves, the driver sending none (the connection in autocommit
# meanwhile), and their values as literals: the drivers send several
# statements in one message only without parameters. psycopg2 returns only
# the last statement's rows, so the row wanted comes last. No savepoint
# guards the handler's work: a stored error, the rare case, rolls the
# transaction back and stores the error under a new claim (_store_error),
# so the common case pays for no subtransaction. Inside a transaction the
# caller opened, a savepoint guards the work instead (WORK_SAVEPOINT): the
# caller's earlier statements stay.
WORK_SAVEPOINT = "idempotency_consumer_work"


def _literal(value):
    """An SQL literal of value (None or a text): an escape string, the same
    whatever standard_conforming_strings is."""
    if value is None:
        return "NULL"
    if "\0" in value:
        raise InvalidKey("the key or request hash has a NUL character, which PostgreSQL text cannot hold")
    return "E'" + value.replace("\\", "\\\\").replace("'", "''") + "'"


def _array_element(value):
    if value is None:
        return "NULL"
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _array(values, element_type):
    """An SQL array of values (None or texts) of element_type: one literal
    of the array's text form, each element in double quotes (with " and \\
    escaped), cast to the array type. The server reads it with the array's
    input function, for less than a constant per element in ARRAY[...]."""
    for value in values:
        if value is not None and "\0" in value:
            raise InvalidKey("a key or request hash has a NUL character, which PostgreSQL text cannot hold")
    return f"CAST({_literal('{' + ','.join(_array_element(value) for value in values) + '}')} AS {element_type}[])"


def _is_psycopg2(cursor):
    return type(cursor).__module__.startswith("psycopg2")


def _last_rows(cursor):
    """The rows of the last statement the cursor ran (psycopg 3 starts at the
    first result; psycopg2 keeps only the last, and its nextset raises)."""
    if not _is_psycopg2(cursor):
        nextset = getattr(cursor, "nextset", None)
        try:
            while nextset is not None and nextset():
                pass
        except Exception:  # noqa: BLE001 -- a driver without more results: it is at the last already
            pass
    return cursor.fetchall()


_JSONB_OID, _JSONB_ARRAY_OID = 3802, 3807
_jsonb_text_casters = None


def _jsonb_text_cursor(conn, cursor):
    """For a psycopg2 cursor, another cursor of conn that returns jsonb and
    jsonb[] as the server's text of them (jsonb_out's, the bytes every replay
    has) rather than parsed, so that the statements select the jsonb itself,
    not a cast to text that the server would plan and fold at every call.
    The handler's cursor keeps the driver's types. None for other drivers:
    their statements keep the cast."""
    global _jsonb_text_casters
    if not _is_psycopg2(cursor):
        return None
    if _jsonb_text_casters is None:
        from psycopg2 import extensions  # a psycopg2 cursor: psycopg2 is there
        text = extensions.new_type((_JSONB_OID,), "IDEMPOTENCY_JSONB_TEXT", lambda value, _: value)
        _jsonb_text_casters = (extensions.register_type, text, extensions.new_array_type(
            (_JSONB_ARRAY_OID,), "IDEMPOTENCY_JSONB_TEXT_ARRAY", text))
    register, text, array = _jsonb_text_casters
    raw = conn.cursor()
    register(text, raw)
    register(array, raw)
    return raw


@contextlib.contextmanager
def _statement_transaction(conn):
    """Yields a cursor and whether the statements send BEGIN and COMMIT
    themselves: conn in autocommit, or not in a transaction and switched to
    autocommit until the end. Inside a transaction the driver's are used
    (conn.commit()). Any error (or exit) inside rolls the transaction back
    before it propagates."""
    own = bool(getattr(conn, "autocommit", False))
    switched = False
    if not own:
        try:
            conn.autocommit = True  # the drivers send nothing for this
            own = switched = True
        except Exception:  # noqa: BLE001 -- in a transaction already: the driver's BEGIN and COMMIT
            pass
    cursor = conn.cursor()
    try:
        yield cursor, own
    except BaseException:
        try:
            if own:
                cursor.execute("ROLLBACK")  # in autocommit, psycopg2's rollback() sends nothing
            else:
                conn.rollback()
        except Exception:  # noqa: BLE001
            pass
        raise
    finally:
        try:
            cursor.close()
        except Exception:  # noqa: BLE001
            pass
        if switched:
            try:
                conn.autocommit = False
            except Exception:  # noqa: BLE001 -- a broken connection
                pass


# claim()'s row in a record's text form: "(f,,,)" for a key claimed now,
# "(t,<response>,...)" for a replay, the response's jsonb text in double
# quotes (with " and \ doubled) unless it has none of the characters that
# need them.
_CLAIM_RECORD = re.compile(r'\(([tf]),(?:"((?:[^"\\]|""|\\\\)*)"|([^,]*)),', re.DOTALL)
_RECORD_PAIR = re.compile(r'""|\\\\')


def _claim_from_record(record):
    """(replayed, the response's jsonb text or None) of claim()'s row: its
    text (psycopg2), or the tuple of its fields' texts psycopg 3 makes of a
    record."""
    if isinstance(record, tuple):
        return record[0] == "t", record[1]
    replayed, quoted, bare = _CLAIM_RECORD.match(record).groups()
    text = _RECORD_PAIR.sub(lambda pair: pair.group()[0], quoted) if quoted is not None else (bare or None)
    return replayed == "t", text


def _begin_and_claim(cursor, own, key, request_hash, wait_timeout):
    """BEGIN (when own) and the claim, with the stored response as jsonb's
    text: the reply is made of that text, so the first reply and every
    replay, from any client, are the same bytes. claim() is called in the
    select list, where the server plans it for less than as a table in
    FROM; its row comes back as a record's text. Returns (replayed, text)."""
    begin = "BEGIN; " if own else ""
    if wait_timeout is not None:
        # Apart from the claim: a wait timeout the server refuses (22023) is
        # not an invalid key.
        cursor.execute(f"{begin}SELECT pg_catalog.set_config('idempotency.wait_timeout', "
                       f"{_literal(_wait_timeout_setting(wait_timeout))}, true)")
        begin = ""
    # No cast to text: it would cost the server more than the claim's form saves.
    statements = f"{begin}SELECT idempotency.claim({_literal(key)}, {_literal(request_hash)})"
    try:
        cursor.execute(statements)
        [(record,)] = _last_rows(cursor)
    except Exception as error:
        mapped = claim_error(error)
        if mapped is None:
            raise
        raise mapped from error
    return _claim_from_record(record)


def _complete_and_commit(conn, cursor, own, key, response):
    """Stores the answer and commits; returns the answer as stored: jsonb's
    text (its key order, its spacing)."""
    given = _literal(None if response is None else json.dumps(response))
    raw = _jsonb_text_cursor(conn, cursor)
    if raw is not None:
        cursor = raw
    stored = f"SELECT {given}::jsonb" if raw is not None else f"SELECT {given}::jsonb::text"
    if not own:
        cursor.execute(f"SELECT idempotency.complete({_literal(key)}, {given}::jsonb); {stored}")
        [(text,)] = _last_rows(cursor)
        conn.commit()
        return text
    # After the COMMIT, the text of the answer comes back in the same message.
    cursor.execute(f"SELECT idempotency.complete({_literal(key)}, {given}::jsonb); COMMIT; {stored}")
    [(text,)] = _last_rows(cursor)
    return text


def _commit(conn, cursor, own):
    if own:
        cursor.execute("COMMIT")
    else:
        conn.commit()


def _rollback(conn, cursor, own):
    if own:
        cursor.execute("ROLLBACK")  # in autocommit, psycopg2's rollback() sends nothing
    else:
        conn.rollback()


def _replayed(conn, cursor, own, text):
    """The answer of a claim that found the key stored: the transaction ends."""
    _commit(conn, cursor, own)
    response = None if text is None else json.loads(text)
    return ("replayed_error" if is_error_document(response) else "replayed"), response, text


def _store_error(conn, cursor, own, key, request_hash, wait_timeout, error, before_commit):
    """The handler's error is the answer: its work is undone with the whole
    transaction, and the error stored under a new claim of the key. Another
    delivery of the key that ran meanwhile makes this a replay of its
    answer (or an IK409 while it runs): the key still gets one answer."""
    _rollback(conn, cursor, own)
    replayed, text = _begin_and_claim(cursor, own, key, request_hash, wait_timeout)
    if replayed:
        return _replayed(conn, cursor, own, text)
    if before_commit is not None:
        before_commit()
    text = _complete_and_commit(conn, cursor, own, key, error_document(error))
    return "stored_error", json.loads(text), text


def apply_once(conn, key, work, request_hash=None, wait_timeout=None, is_stored_error=None, before_commit=None):
    """Claims key, runs work(cursor) and stores its answer in one transaction
    on conn (psycopg2 or psycopg 3): three round trips for a new message
    (BEGIN with the claim, the work, the complete with COMMIT), two for a
    replay; a stored error rolls back and claims again (three more). Returns (outcome, response, text): outcome one of 'ran',
    'stored_error', 'replayed', 'replayed_error'; the answer as stored, and
    its jsonb text. Raises KeyInProgress, KeyReused, HandlerFailure (the
    work's error, its cause) or the database's error, after ROLLBACK."""
    with _statement_transaction(conn) as (cursor, own):
        replayed, text = _begin_and_claim(cursor, own, key, request_hash, wait_timeout)
        if replayed:
            return _replayed(conn, cursor, own, text)
        # Inside a transaction of the caller's, a stored error must undo the
        # handler's work only, never what the caller did before: a savepoint.
        guarded = not own and is_stored_error is not None
        if guarded:
            cursor.execute(f"SAVEPOINT {WORK_SAVEPOINT}")
        handle = Sealable(cursor)
        stored_error = None
        try:
            response = work(handle)
        except Exception as error:
            if is_transient(error):
                raise
            if is_stored_error is None or not is_stored_error(error):
                raise HandlerFailure(str(error)) from error
            stored_error = error
        finally:
            handle.seal(f"the transaction of message key {key!r} has ended; use the cursor only inside the handler")
        if stored_error is not None and guarded:
            cursor.execute(f"ROLLBACK TO SAVEPOINT {WORK_SAVEPOINT}")
            if before_commit is not None:
                before_commit()
            text = _complete_and_commit(conn, cursor, own, key, error_document(stored_error))
            return "stored_error", json.loads(text), text
        if stored_error is not None:
            return _store_error(conn, cursor, own, key, request_hash, wait_timeout, stored_error, before_commit)
        if before_commit is not None:
            before_commit()
        text = _complete_and_commit(conn, cursor, own, key, response)
        return "ran", None if text is None else json.loads(text), text


class KeyRefused(Exception):
    """A key claim_batch refused, as the error claim() raises for it: its
    SQLSTATE (IK409, IK422, IK508, ...) and message."""

    def __init__(self, sqlstate, message):
        super().__init__(message)
        self.sqlstate = sqlstate


def apply_batch(conn, items, wait_timeout=None, is_stored_error=None, before_commit=None):
    """Applies items, a list of (key, request_hash, work), in one transaction
    on conn: BEGIN with one idempotency.claim_batch, work(cursor) of each
    claimed key in turn, one idempotency.complete_batch with COMMIT (a
    round trip per work and two more). Returns one result per item:
    (outcome, response, text) as apply_once returns it, or the exception to
    settle that item by as a single message (KeyInProgress, KeyReused,
    KeyRefused, HandlerFailure, a transient error). A failing work rolls the
    transaction back and the batch runs again without that item. The
    database's own errors (claim_batch, complete_batch, COMMIT) are raised,
    after ROLLBACK, with no item settled."""
    results = [None] * len(items)
    stored_errors = {}  # index -> error document, kept across runs
    pending = list(range(len(items)))
    while pending:
        failed = None
        answers = {}
        with _statement_transaction(conn) as (cursor, own):
            begin = "BEGIN; " if own else ""
            if wait_timeout is not None:
                begin += ("SELECT pg_catalog.set_config('idempotency.wait_timeout', "
                          f"{_literal(_wait_timeout_setting(wait_timeout))}, true); ")
            # The rows placed by their ordinality here, for less than an
            # ORDER BY costs the server.
            cursor.execute(
                f"{begin}SELECT ordinality, outcome, sqlstate, message, response::text"
                f" FROM idempotency.claim_batch({_array([items[i][0] for i in pending], 'text')},"
                f" {_array([items[i][1] for i in pending], 'text')})")
            rows = [None] * len(pending)
            for row in _last_rows(cursor):
                rows[row[0] - 1] = row[1:]
            completed = []  # (index, response, outcome)
            for index, (outcome, sqlstate, message, text) in zip(pending, rows):
                if outcome == "replayed":
                    response = None if text is None else json.loads(text)
                    answers[index] = ("replayed_error" if is_error_document(response) else "replayed", response, text)
                elif outcome == "refused":
                    refusal = KeyRefused(sqlstate, message)
                    answers[index] = claim_error(refusal) or refusal
                elif index in stored_errors:
                    completed.append((index, stored_errors[index], "stored_error"))
                else:
                    key, _, work = items[index]
                    handle = Sealable(cursor)
                    try:
                        completed.append((index, work(handle), "ran"))
                    except Exception as error:  # noqa: BLE001 -- settled below, the others run again
                        failed = (index, error)
                        break
                    finally:
                        handle.seal(f"the transaction of message key {key!r} has ended; "
                                    "use the cursor only inside the handler")
            if failed is None:
                if before_commit is not None:
                    before_commit()
                given = _array([None if response is None else json.dumps(response) for _, response, _ in completed],
                               "jsonb")
                keys = _array([items[index][0] for index, _, _ in completed], "text")
                # The answers as stored: jsonb's text (its key order, its spacing), after the COMMIT.
                raw = _jsonb_text_cursor(conn, cursor)
                ours = cursor if raw is None else raw
                stored = (f"SELECT {given}" if raw is not None else
                          f"SELECT ARRAY(SELECT r::text FROM unnest({given}) WITH ORDINALITY AS u(r, n) ORDER BY n)")
                if own:
                    ours.execute(f"SELECT idempotency.complete_batch({keys}, {given}); COMMIT; {stored}")
                    [(texts,)] = _last_rows(ours)
                else:
                    ours.execute(f"SELECT idempotency.complete_batch({keys}, {given}); {stored}")
                    [(texts,)] = _last_rows(ours)
                    conn.commit()
                for (index, _, outcome), text in zip(completed, texts):
                    answers[index] = (outcome, None if text is None else json.loads(text), text)
            elif own:
                cursor.execute("ROLLBACK")
            else:
                conn.rollback()
        if failed is None:
            for index, answer in answers.items():
                results[index] = answer
            return results
        index, error = failed
        if not is_transient(error) and is_stored_error is not None and is_stored_error(error):
            stored_errors[index] = error_document(error)
            continue
        if is_transient(error):
            results[index] = error
        else:
            failure = HandlerFailure(str(error))
            failure.__cause__ = error
            results[index] = failure
        pending.remove(index)
    return results


class Consumer:
    """Applies deliveries of queue once each. Call consume() to register with
    the channel (then channel.start_consuming()), or on_message() with each
    delivery yourself.

    handler(cursor, payload, delivery) returns the message's answer (a JSON
    value); delivery has .method, .properties and .body (pika's).

    batch_size > 1 applies deliveries in batches, one transaction each
    (consume() sets the channel's prefetch to twice it); a partial batch is
    applied batch_wait seconds after its first delivery (through the pika
    connection's call_later), or by flush()."""

    def __init__(self, conn, channel, queue, handler, *, key=None, request_hash=None, parse=None,
                 is_stored_error=None, dead_letter=None, wait_timeout=None, max_attempts=5,
                 backoff=default_backoff, on_event=None, sleep=None, properties_class=None,
                 batch_size=1, batch_wait=0.01):
        if not callable(handler):
            raise TypeError("handler must be a function (cursor, payload, delivery) -> answer")
        if not isinstance(max_attempts, int) or max_attempts < 1:
            raise ValueError(f"max_attempts must be a whole number >= 1, not {max_attempts!r}")
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a whole number >= 1, not {batch_size!r}")
        if dead_letter is not None and not isinstance(dead_letter.get("routing_key"), str):
            raise TypeError("dead_letter must be {'exchange': ..., 'routing_key': ...}")
        self.conn, self.channel, self.queue, self.handler = conn, channel, queue, handler
        self.key = key
        self.request_hash = request_hash or (lambda delivery, payload: hashlib.sha256(delivery.body).hexdigest())
        self.parse = parse or (lambda body, delivery: json.loads(body))
        self.is_stored_error, self.dead_letter, self.wait_timeout = is_stored_error, dead_letter, wait_timeout
        self.max_attempts, self.backoff = max_attempts, backoff
        self.on_event = on_event or (lambda event: None)
        connection = getattr(channel, "connection", None)
        # A BlockingConnection's sleep keeps serving heartbeats while it waits.
        self.sleep = sleep or (connection.sleep if hasattr(connection, "sleep") else time.sleep)
        self.in_progress_attempts = {}
        self._properties_class = properties_class
        self.batch_size, self.batch_wait = batch_size, batch_wait
        self._gathered = []
        self._timer = None

    def _properties(self, **fields):
        if self._properties_class is None:
            import pika  # imported when first needed: the package does not depend on pika
            self._properties_class = pika.BasicProperties
        return self._properties_class(**fields)

    def consume(self):
        if self.batch_size > 1 and hasattr(self.channel, "basic_qos"):
            # A batch can only fill when the broker may send that many unacked deliveries;
            # twice that lets the next batch gather while one commits.
            self.channel.basic_qos(prefetch_count=2 * self.batch_size)
        return self.channel.basic_consume(self.queue, self._callback, auto_ack=False)

    def _callback(self, channel, method, properties, body):
        delivery = Delivery(method, properties, body)
        if self.batch_size > 1:
            self.gather(delivery)
        else:
            self.on_message(delivery)

    def gather(self, delivery):
        """Batch mode: adds a delivery to the batch, applied when it is full."""
        self._gathered.append(delivery)
        if len(self._gathered) >= self.batch_size:
            self.flush()
        elif self._timer is None:
            connection = getattr(self.channel, "connection", None)
            if hasattr(connection, "call_later"):
                self._timer = connection.call_later(self.batch_wait, self.flush)

    def flush(self):
        """Applies the deliveries gathered so far, as one batch."""
        if self._timer is not None:
            try:
                self.channel.connection.remove_timeout(self._timer)
            except Exception:  # noqa: BLE001 -- it fired already
                pass
            self._timer = None
        deliveries, self._gathered = self._gathered, []
        if deliveries:
            self.on_batch(deliveries)

    def _prepare(self, delivery):
        """(key, payload) of a delivery, or None when it was dead-lettered for having neither or a key no
        claim accepts."""
        self._emit("delivered", delivery, redelivered=bool(delivery.method.redelivered))
        try:
            payload = self.parse(delivery.body, delivery)
            key = self.key(delivery, payload) if self.key else delivery.properties.message_id
        except Exception as error:  # noqa: BLE001
            self._dead_letter(delivery, "unparsable", f"the payload could not be parsed: {error}")
            return None
        if not isinstance(key, str) or not key:
            self._dead_letter(delivery, "no-key", "the message has no key (message id or business id)")
            return None
        # What the claim would refuse, refused here: in a batch, a key the
        # server refuses would end claim_batch for every message.
        if len(key.encode("utf-8", "surrogatepass")) > MAX_KEY_BYTES or "\0" in key:
            self._dead_letter(delivery, "invalid-key",
                              f"the message key is longer than {MAX_KEY_BYTES} bytes or has a NUL character")
            return None
        return key, payload

    def _settle_answer(self, delivery, key, outcome, response, text):
        """After the commit: reply, then ack."""
        self.in_progress_attempts.pop(key, None)
        self._emit("committed", delivery, key=key, outcome=outcome, response=response)
        self._reply(delivery, response, text, outcome)
        self.channel.basic_ack(delivery.method.delivery_tag)
        self._emit("acked", delivery, key=key, outcome=outcome)

    def on_batch(self, deliveries):
        """Applies deliveries in one transaction (apply_batch), then settles each."""
        prepared = []
        for delivery in deliveries:
            try:
                found = self._prepare(delivery)
            except Exception as error:  # noqa: BLE001
                self._settle_failure(delivery, None, error)
                continue
            if found is not None:
                prepared.append((delivery, found[0], found[1]))
        if not prepared:
            return
        items = [(key, self.request_hash(delivery, payload),
                  (lambda d, p: lambda cursor: self.handler(cursor, p, d))(delivery, payload))
                 for delivery, key, payload in prepared]

        def before_commit():
            for delivery, key, _ in prepared:
                self._emit("committing", delivery, key=key)

        try:
            results = apply_batch(self.conn, items, wait_timeout=self.wait_timeout,
                                  is_stored_error=self.is_stored_error, before_commit=before_commit)
        except Exception as error:  # noqa: BLE001 -- the database: every delivery comes back later
            for delivery, key, _ in prepared:
                self._settle_failure(delivery, key, error)
            return
        # Every answer of the batch is committed before any is replied or acked.
        for (delivery, key, _), result in zip(prepared, results):
            if not isinstance(result, BaseException):
                self._emit("committed", delivery, key=key, outcome=result[0], response=result[1])
        # Then every reply (each confirmed before basic_publish returns, on a
        # channel with confirm_delivery()), then the acks together: acks
        # between the replies would let the broker send the next deliveries
        # while each reply waits for its confirm.
        replied = []
        for (delivery, key, _), result in zip(prepared, results):
            if isinstance(result, BaseException):
                self._settle_failure(delivery, key, result)
                continue
            outcome, response, text = result
            try:
                self.in_progress_attempts.pop(key, None)
                self._reply(delivery, response, text, outcome)
            except Exception as error:  # noqa: BLE001
                self._settle_failure(delivery, key, error)
                continue
            replied.append((delivery, key, outcome))
        for delivery, key, outcome in replied:
            try:
                self.channel.basic_ack(delivery.method.delivery_tag)
            except Exception as error:  # noqa: BLE001
                self._settle_failure(delivery, key, error)
                continue
            self._emit("acked", delivery, key=key, outcome=outcome)

    def _emit(self, kind, delivery, **extra):
        self.on_event(dict(type=kind, delivery=delivery, **extra))

    def _publish(self, exchange, routing_key, body, properties):
        self.channel.basic_publish(exchange=exchange, routing_key=routing_key, body=body, properties=properties)

    def _copy_properties(self, delivery, headers):
        props = delivery.properties
        merged = dict(props.headers or {})
        merged.update(headers)
        return self._properties(
            content_type=props.content_type, content_encoding=props.content_encoding, headers=merged,
            delivery_mode=props.delivery_mode or 2, priority=props.priority,
            correlation_id=props.correlation_id, reply_to=props.reply_to, expiration=props.expiration,
            message_id=props.message_id, timestamp=props.timestamp, type=props.type, app_id=props.app_id)

    def _dead_letter(self, delivery, code, reason):
        if self.dead_letter is not None:
            self._publish(self.dead_letter.get("exchange", ""), self.dead_letter["routing_key"], delivery.body,
                          self._copy_properties(delivery, {REASON_HEADER: reason, CODE_HEADER: code,
                                                           "x-original-queue": self.queue}))
            self.channel.basic_ack(delivery.method.delivery_tag)
        else:
            # The queue's own dead-letter exchange, if any, gets it (x-death says 'rejected').
            self.channel.basic_nack(delivery.method.delivery_tag, requeue=False)
        self._emit("dead-lettered", delivery, code=code, reason=reason)

    def _reply(self, delivery, response, text, outcome):
        props = delivery.properties
        if not props.reply_to:
            return
        self._publish("", props.reply_to, (text if text is not None else "null").encode(), self._properties(
            correlation_id=props.correlation_id, content_type="application/json", delivery_mode=2,
            headers={REPLAYED_HEADER: outcome in ("replayed", "replayed_error")}))
        self._emit("replied", delivery, response=response, outcome=outcome)

    def _retry_later(self, delivery, key, error):
        attempts = int((delivery.properties.headers or {}).get(ATTEMPTS_HEADER, 0)) + 1
        if attempts >= self.max_attempts:
            self._dead_letter(delivery, "handler-error", f"the handler failed {attempts} times; last error: {error}")
            return
        self.sleep(self.backoff(attempts))
        self._publish("", self.queue, delivery.body, self._copy_properties(delivery, {ATTEMPTS_HEADER: attempts}))
        self.channel.basic_ack(delivery.method.delivery_tag)
        self._emit("retried", delivery, key=key, attempts=attempts, error=error)

    def _requeue_later(self, delivery, key, error):
        attempts = self.in_progress_attempts.get(key, 0) + 1
        self.in_progress_attempts[key] = attempts
        self.sleep(self.backoff(attempts))
        self.channel.basic_nack(delivery.method.delivery_tag, requeue=True)
        self._emit("requeued", delivery, key=key, attempts=attempts, error=error)

    def on_message(self, delivery):
        key = None
        try:
            found = self._prepare(delivery)
            if found is None:
                return
            key, payload = found
            outcome, response, text = apply_once(
                self.conn, key, lambda cursor: self.handler(cursor, payload, delivery),
                request_hash=self.request_hash(delivery, payload), wait_timeout=self.wait_timeout,
                is_stored_error=self.is_stored_error,
                before_commit=lambda: self._emit("committing", delivery, key=key))
            self._settle_answer(delivery, key, outcome, response, text)
        except Exception as error:  # noqa: BLE001 -- each kind is settled below
            self._settle_failure(delivery, key, error)

    def _settle_gone(self, delivery, key):
        """The message was applied before and its answer has expired (IK410):
        a duplicate, acked as done. No answer is kept, so none is replied."""
        self.in_progress_attempts.pop(key, None)
        self.channel.basic_ack(delivery.method.delivery_tag)
        self._emit("acked", delivery, key=key, outcome="gone")

    def _settle_failure(self, delivery, key, error):
        try:
            if isinstance(error, KeyInProgress):
                self._requeue_later(delivery, key, error)
            elif isinstance(error, KeyGone):
                self._settle_gone(delivery, key)
            elif isinstance(error, KeyReused):
                self._dead_letter(delivery, "IK422", str(error))
            elif isinstance(error, HandlerFailure):
                self._retry_later(delivery, key, error.__cause__)
            else:  # the database or the channel: the delivery comes back later
                self._requeue_later(delivery, key, error)
        except Exception as settle_error:  # noqa: BLE001
            # The channel is gone: the broker redelivers the message to another
            # consumer; its key makes that a replay if the work had committed.
            self._emit("error", delivery, key=key, error=settle_error)


class Delivery:
    """One delivery: pika's method frame, properties and body."""
    __slots__ = ("method", "properties", "body")

    def __init__(self, method, properties, body):
        self.method, self.properties, self.body = method, properties, body


def consume(conn, channel, queue, handler, **options):
    """Registers a Consumer for queue on channel (manual acks) and returns it;
    run channel.start_consuming() afterwards. Options as Consumer's."""
    consumer = Consumer(conn, channel, queue, handler, **options)
    consumer.consume()
    return consumer
