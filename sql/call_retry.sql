-- The retry scenario: one intent, one key, any number of deliveries.
\i sql/include/setup.sql

CREATE TABLE accounts (id int PRIMARY KEY, balance numeric NOT NULL);
CREATE TABLE ledger (id bigserial PRIMARY KEY, account int NOT NULL, amount numeric NOT NULL);
INSERT INTO accounts VALUES (7, 1000);

CREATE FUNCTION withdraw(account_id int, amount numeric) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
  new_balance numeric;
BEGIN
  UPDATE accounts SET balance = balance - amount
   WHERE id = account_id AND balance >= amount
  RETURNING balance INTO new_balance;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'insufficient funds in account %', account_id;
  END IF;
  INSERT INTO ledger (account, amount) VALUES (account_id, -amount);
  RETURN jsonb_build_object('account', account_id, 'balance', new_balance);
END $$;

-- withdraw 300 with key req-7f3a, delivered three times: one withdrawal,
-- three identical answers; the first ran, the retries replayed.
SELECT idempotency.idempotent_call('req-7f3a', NULL, 'SELECT withdraw($1, $2)', 7, 300) AS response,
       idempotency.last_call_replayed() AS replayed;
SELECT balance FROM accounts WHERE id = 7;
SELECT idempotency.idempotent_call('req-7f3a', NULL, 'SELECT withdraw($1, $2)', 7, 300) AS response,
       idempotency.last_call_replayed() AS replayed;
SELECT balance FROM accounts WHERE id = 7;
SELECT idempotency.idempotent_call('req-7f3a', NULL, 'SELECT withdraw($1, $2)', 7, 300) AS response,
       idempotency.last_call_replayed() AS replayed;
SELECT balance FROM accounts WHERE id = 7;
SELECT count(*) AS ledger_rows FROM ledger;

-- A new intent gets a new key.
SELECT idempotency.idempotent_call('req-91bc', NULL, 'SELECT withdraw($1, $2)', 7, 200) AS response,
       idempotency.last_call_replayed() AS replayed;
SELECT balance FROM accounts WHERE id = 7;
SELECT account, amount FROM ledger ORDER BY id;

-- The stored rows: one per key, done, with the response and a SHA-256
-- fingerprint computed from fn and the arguments (32 bytes), under the
-- key's digest.
SELECT scope, key, response, octet_length(request_hash) AS hash_bytes,
       key_digest = idempotency.key_digest(key) AS digest_of_key,
       expires_at - created_at AS ttl
  FROM idempotency.keys WHERE key LIKE 'req-%' ORDER BY key;

-- The replay is the stored response byte for byte.
SELECT idempotency.idempotent_call('req-7f3a', NULL, 'SELECT withdraw($1, $2)', 7, 300)::text
     = (SELECT response::text FROM idempotency.keys WHERE key = 'req-7f3a') AS same_bytes;

-- Same key, different request: IK422, nothing runs.
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('req-7f3a', NULL, 'SELECT withdraw($1, $2)', 7, 301)$$);
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('req-7f3a', NULL, 'SELECT withdraw($1, $2)', 8, 300)$$);
-- The same values as other types are the same request: withdraw receives
-- the same integer and bigint whatever types the caller sent them as.
SELECT idempotency.idempotent_call('req-7f3a', NULL, 'SELECT withdraw($1, $2)', 7::smallint, 300::bigint),
       idempotency.last_call_replayed();
SELECT idempotency.idempotent_call('req-7f3a', NULL, 'SELECT withdraw($1, $2)', '7', '300'::varchar),
       idempotency.last_call_replayed();
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('req-7f3a', NULL, 'SELECT withdraw($1,$2)', 7, 300)$$);
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('req-7f3a', NULL, 'SELECT withdraw($1, $2)', 7, NULL::int)$$);
SELECT idempotency.idempotent_call('req-7f3a', NULL, 'SELECT withdraw($1, $2)', 7, 301);
SELECT balance FROM accounts WHERE id = 7;
SELECT count(*) AS ledger_rows FROM ledger;

-- A client-supplied request_hash is compared as given.
SELECT idempotency.idempotent_call('req-c1', 'body-v1', 'SELECT withdraw($1, $2)', 7, 10);
SELECT idempotency.idempotent_call('req-c1', 'body-v1', 'SELECT withdraw($1, $2)', 7, 10),
       idempotency.last_call_replayed() AS replayed;
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('req-c1', 'body-v2', 'SELECT withdraw($1, $2)', 7, 10)$$);
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('req-c1', NULL, 'SELECT withdraw($1, $2)', 7, 10)$$);
SELECT balance FROM accounts WHERE id = 7;

-- An explicit VARIADIC array binds like spread arguments and fingerprints
-- the same way.
SELECT idempotency.idempotent_call('req-v1', NULL, 'SELECT withdraw($1, $2)', VARIADIC ARRAY[7, 5]);
SELECT idempotency.idempotent_call('req-v1', NULL, 'SELECT withdraw($1, $2)', 7, 5),
       idempotency.last_call_replayed() AS replayed;
SELECT balance FROM accounts WHERE id = 7;
