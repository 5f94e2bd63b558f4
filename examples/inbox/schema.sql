-- The inbox example: a table-backed queue and the effect its messages have.
-- Loaded by the application role; the extension is created beforehand.

-- The queue stands in for a broker. A message can be delivered more than
-- once (a producer retry, a redelivery after a lost ack, a replay after a
-- consumer-group rebalance), so the same message_id, the producer's id for
-- the message, may sit in several deliveries: it is not unique here.
CREATE TABLE queue (
    delivery_id bigserial PRIMARY KEY,
    message_id  text NOT NULL,
    payload     jsonb NOT NULL,
    enqueued_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE stock (
    sku     text PRIMARY KEY,
    on_hand bigint NOT NULL
);

-- The effect of a message: one shipment per paid order. No unique
-- constraint on order_id: applying each message once is the idempotency
-- key's job, and the tests count these rows to prove it.
CREATE TABLE shipments (
    id         bigserial PRIMARY KEY,
    order_id   bigint NOT NULL,
    sku        text NOT NULL REFERENCES stock,
    quantity   integer NOT NULL CHECK (quantity > 0),
    created_at timestamptz NOT NULL DEFAULT now()
);

-- Ships a paid order: takes the goods out of stock and records the shipment.
CREATE FUNCTION ship_order(order_id bigint, sku text, quantity integer)
RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    shipment_id bigint;
BEGIN
    UPDATE stock SET on_hand = on_hand - quantity WHERE stock.sku = ship_order.sku;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown sku %', sku USING ERRCODE = 'no_data_found';
    END IF;
    INSERT INTO shipments (order_id, sku, quantity)
    VALUES (order_id, sku, quantity)
    RETURNING id INTO shipment_id;
    RETURN jsonb_build_object('shipment_id', shipment_id);
END
$$;
