-- The payment service's data: accounts, a ledger, and the business function
-- that the API runs once per idempotency key. Loaded by the application role
-- (it owns these tables); the extension is created beforehand by a superuser.

CREATE TABLE accounts (
    id      bigint PRIMARY KEY,
    balance bigint NOT NULL CHECK (balance >= 0)
);

-- One row per money movement. No unique constraint ties a row to a request:
-- exactly-once is the idempotency key's job, and the tests count these rows.
CREATE TABLE ledger (
    id         bigserial PRIMARY KEY,
    account_id bigint NOT NULL REFERENCES accounts,
    amount     bigint NOT NULL CHECK (amount <> 0), -- negative: a withdrawal
    created_at timestamptz NOT NULL DEFAULT now()
);

-- Withdraws amount from account and returns the response body the API sends.
-- The guarded UPDATE never overdraws, even under concurrency; errors carry
-- their own SQLSTATEs so clients map them without reading messages:
--   P0002 (no_data_found)  no such account
--   PY402                  insufficient funds
CREATE FUNCTION withdraw(account bigint, amount bigint) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    new_balance bigint;
    entry_id    bigint;
BEGIN
    UPDATE accounts SET balance = balance - amount
     WHERE id = account AND balance >= amount
    RETURNING balance INTO new_balance;
    IF NOT FOUND THEN
        IF NOT EXISTS (SELECT FROM accounts WHERE id = account) THEN
            RAISE EXCEPTION 'account % does not exist', account
                USING ERRCODE = 'no_data_found';
        END IF;
        RAISE EXCEPTION 'insufficient funds in account %', account
            USING ERRCODE = 'PY402';
    END IF;

    INSERT INTO ledger (account_id, amount) VALUES (account, -amount)
    RETURNING id INTO entry_id;

    RETURN jsonb_build_object('withdrawal_id', entry_id,
                              'account_id', account,
                              'amount', amount,
                              'balance', new_balance);
END
$$;
