-- new keys through the extension, every argument an untyped placeholder as
-- most drivers send them: fn's text gives them their types
\set account random(1, :accounts)
\set amount 1
SELECT idempotency.idempotent_call(gen_random_uuid()::text, NULL, 'SELECT bench.withdraw($1, $2)', :account, :amount);
