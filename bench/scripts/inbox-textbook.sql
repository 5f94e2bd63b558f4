-- a new message through the textbook inbox the queue consumers are compared
-- with (examples/rabbitmq/consumer.js --textbook): the message id inserted
-- with ON CONFLICT DO NOTHING, the work, COMMIT
\set account random(1, :accounts)
\set key random(1, 9223372036854775807)
BEGIN;
INSERT INTO bench.processed_messages (message_id) VALUES (:key::text) ON CONFLICT DO NOTHING;
SELECT bench.withdraw(:account::int, 1::bigint);
COMMIT;
