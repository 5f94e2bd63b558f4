-- The checkout service's data: orders to pay and the charges made against
-- them. Loaded by the application role (it owns these tables); the extension
-- is created beforehand by a superuser.

CREATE TABLE orders (
    id           bigint PRIMARY KEY,
    description  text NOT NULL,
    amount_cents bigint NOT NULL CHECK (amount_cents > 0)
);

-- One row per charge attempt, declined ones included. No unique constraint
-- ties a charge to a request: exactly-once is the idempotency key's job, and
-- the tests count these rows.
CREATE TABLE charges (
    id           bigserial PRIMARY KEY,
    order_id     bigint NOT NULL REFERENCES orders,
    amount_cents bigint NOT NULL,
    status       text NOT NULL CHECK (status IN ('succeeded', 'declined')),
    created_at   timestamptz NOT NULL DEFAULT now()
);

-- Whether the card network answers; when it does not, a charge fails with
-- 503 and nothing of it is kept.
CREATE TABLE card_network (
    available boolean NOT NULL
);
INSERT INTO card_network VALUES (true);
