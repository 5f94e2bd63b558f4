-- The benchmark's workload: a business operation and the textbook
-- idempotency protocol written in PL/pgSQL, to compare the extension with.
-- Run as the role that runs the benchmark (it owns schema bench).

CREATE SCHEMA bench;

-- Accounts get a balance no run can exhaust, so every withdrawal succeeds
-- and every leg does the same work. Room on each page keeps balance updates
-- HOT, as on a tuned OLTP table.
CREATE TABLE bench.accounts (
    id      int PRIMARY KEY,
    balance bigint NOT NULL
) WITH (fillfactor = 90);

CREATE TABLE bench.ledger (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    account    int NOT NULL,
    amount     bigint NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

-- The business operation: debit an account if it holds enough, record the
-- movement, answer with jsonb.
CREATE FUNCTION bench.withdraw(account int, amount bigint) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    new_balance bigint;
    entry       bigint;
BEGIN
    UPDATE bench.accounts SET balance = balance - amount
     WHERE id = account AND balance >= amount
    RETURNING balance INTO new_balance;
    IF NOT FOUND THEN
        RETURN jsonb_build_object('ok', false, 'account', account,
                                  'reason', 'insufficient funds');
    END IF;
    INSERT INTO bench.ledger (account, amount) VALUES (account, -amount)
    RETURNING id INTO entry;
    RETURN jsonb_build_object('ok', true, 'account', account,
                              'balance', new_balance, 'entry', entry);
END
$$;

-- The textbook protocol's key table: the same columns as idempotency.keys
-- except the scope (one tenant), so row widths are comparable.
CREATE TABLE bench.keys (
    key          text COLLATE "C" PRIMARY KEY,
    request_hash text NOT NULL,
    status       text NOT NULL CHECK (status IN ('in_progress', 'done')),
    response     jsonb,
    created_at   timestamptz NOT NULL DEFAULT now(),
    expires_at   timestamptz NOT NULL DEFAULT now() + interval '24 hours'
);

-- The textbook inbox of a queue consumer (examples/rabbitmq/schema.sql's
-- processed_messages): a message's id inserted in its work's transaction.
CREATE TABLE bench.processed_messages (
    message_id   text PRIMARY KEY,
    processed_at timestamptz NOT NULL DEFAULT now()
);

-- The textbook protocol around withdraw, in the caller's transaction: claim
-- the key with INSERT ... ON CONFLICT DO NOTHING (status in_progress), run
-- the operation, then mark the key done with its response. A key that exists
-- is replayed, or refused if in progress or used for another request. The
-- request fingerprint is a SHA-256 of the arguments, as the extension
-- computes one when the caller passes none.
CREATE FUNCTION bench.idempotent_withdraw(request_key text, account int,
                                          amount bigint) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    fingerprint text := encode(sha256(convert_to(account || ':' || amount, 'UTF8')), 'hex');
    claimed     text;
    stored      bench.keys;
    result      jsonb;
BEGIN
    INSERT INTO bench.keys (key, request_hash, status)
    VALUES (request_key, fingerprint, 'in_progress')
    ON CONFLICT (key) DO NOTHING
    RETURNING key INTO claimed;
    IF claimed IS NULL THEN
        SELECT * INTO stored FROM bench.keys WHERE key = request_key;
        IF stored.request_hash <> fingerprint THEN
            RAISE EXCEPTION 'idempotency key "%" was already used with a different request', request_key
                USING ERRCODE = 'IK422';
        END IF;
        IF stored.status = 'in_progress' THEN
            RAISE EXCEPTION 'idempotency key "%" is being processed by another transaction', request_key
                USING ERRCODE = 'IK409';
        END IF;
        RETURN stored.response;
    END IF;
    result := bench.withdraw(account, amount);
    UPDATE bench.keys SET status = 'done', response = result
     WHERE key = request_key;
    RETURN result;
END
$$;

-- From PostgreSQL 19 on, the textbook protocol can take or read the key in
-- one statement: INSERT ... ON CONFLICT DO SELECT returns the row inserted
-- or the one already there (inserted: its xmin is this transaction). The
-- same checks and work as bench.idempotent_withdraw; bench/run runs it as
-- the legs new-doselect and replay-doselect.
DO $do$
BEGIN
  IF current_setting('server_version_num')::int < 190000 THEN
    RETURN;
  END IF;
  EXECUTE $create$
CREATE FUNCTION bench.idempotent_withdraw_doselect(request_key text, account int,
                                                   amount bigint) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    fingerprint text := encode(sha256(convert_to(account || ':' || amount, 'UTF8')), 'hex');
    stored      record;
    result      jsonb;
BEGIN
    INSERT INTO bench.keys AS k (key, request_hash, status)
    VALUES (request_key, fingerprint, 'in_progress')
    ON CONFLICT (key) DO SELECT
    RETURNING k.request_hash, k.status, k.response,
              k.xmin = pg_current_xact_id()::xid AS claimed
    INTO stored;
    IF NOT stored.claimed THEN
        IF stored.request_hash <> fingerprint THEN
            RAISE EXCEPTION 'idempotency key "%" was already used with a different request', request_key
                USING ERRCODE = 'IK422';
        END IF;
        IF stored.status = 'in_progress' THEN
            RAISE EXCEPTION 'idempotency key "%" is being processed by another transaction', request_key
                USING ERRCODE = 'IK409';
        END IF;
        RETURN stored.response;
    END IF;
    result := bench.withdraw(account, amount);
    UPDATE bench.keys SET status = 'done', response = result
     WHERE key = request_key;
    RETURN result;
END
$$
$create$;
END
$do$;
