-- The refund example: captured payments, refunds against them, and the
-- transfers whose failure a refund compensates. Loaded by the application
-- role; the extension is created beforehand.

CREATE TABLE accounts (
    id      bigint PRIMARY KEY,
    balance bigint NOT NULL
);

CREATE TABLE payments (
    id         bigint PRIMARY KEY,
    account_id bigint NOT NULL REFERENCES accounts,
    amount     bigint NOT NULL CHECK (amount > 0),
    refunded   bigint NOT NULL DEFAULT 0,
    CHECK (refunded BETWEEN 0 AND amount)
);

-- One row per refund paid. Nothing here stops a retried refund from being
-- paid twice: the guard below only caps the total at the payment's amount.
-- That is the idempotency key's job, and the tests count these rows.
CREATE TABLE refunds (
    id         bigserial PRIMARY KEY,
    payment_id bigint NOT NULL REFERENCES payments,
    amount     bigint NOT NULL CHECK (amount > 0),
    created_at timestamptz NOT NULL DEFAULT now()
);

-- A transfer paid by a payment; when its payout fails the payment is
-- refunded in full (the compensation) and the transfer marked compensated.
CREATE TABLE transfers (
    id         bigint PRIMARY KEY,
    payment_id bigint NOT NULL REFERENCES payments,
    status     text NOT NULL CHECK (status IN ('payout_failed', 'compensated'))
);

-- Refunds amount of a payment to its account; returns the refund. Errors
-- carry their own SQLSTATEs so clients map them without reading messages:
--   P0002 (no_data_found)  no such payment
--   RF422                  the refund exceeds what is left to refund
CREATE FUNCTION refund(payment bigint, amount bigint) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    payer      bigint;
    refundable bigint;
    refund_id  bigint;
BEGIN
    UPDATE payments SET refunded = refunded + refund.amount
     WHERE id = payment AND refunded + refund.amount <= payments.amount
    RETURNING account_id, payments.amount - refunded INTO payer, refundable;
    IF NOT FOUND THEN
        IF NOT EXISTS (SELECT FROM payments WHERE id = payment) THEN
            RAISE EXCEPTION 'payment % does not exist', payment
                USING ERRCODE = 'no_data_found';
        END IF;
        RAISE EXCEPTION 'refund of % exceeds what is left of payment %', amount, payment
            USING ERRCODE = 'RF422';
    END IF;

    UPDATE accounts SET balance = balance + refund.amount WHERE id = payer;
    INSERT INTO refunds (payment_id, amount) VALUES (payment, refund.amount)
    RETURNING id INTO refund_id;

    RETURN jsonb_build_object('refund_id', refund_id, 'payment_id', payment,
                              'amount', amount, 'refundable', refundable);
END
$$;
