-- The business functions every client calls through the extension, and the
-- side tables that count their executions: the suite's oracle. Loaded by the
-- role the clients connect as, which owns them.

-- withdraw(account int, amount bigint): one ledger row per execution.
CREATE TABLE accounts (id int PRIMARY KEY, balance bigint NOT NULL);
CREATE TABLE ledger (id bigserial PRIMARY KEY, account int NOT NULL, amount bigint NOT NULL);

CREATE FUNCTION withdraw(account int, amount bigint) RETURNS jsonb
LANGUAGE sql AS $$
  INSERT INTO ledger (account, amount) VALUES (account, amount);
  INSERT INTO accounts AS a (id, balance) VALUES (account, 10000 - amount)
    ON CONFLICT (id) DO UPDATE SET balance = a.balance - amount;
  SELECT jsonb_build_object('account', id, 'balance', balance) FROM accounts WHERE id = account;
$$;

-- record_types: one row per execution, under its tag; the response echoes
-- what the function received (the instant as epoch seconds, so the
-- session's TimeZone plays no part).
CREATE TABLE type_calls (id bigserial PRIMARY KEY, tag text NOT NULL);

CREATE FUNCTION record_types(tag text, flag boolean, at timestamptz, id uuid, doc jsonb, amount numeric)
RETURNS jsonb
LANGUAGE sql AS $$
  INSERT INTO type_calls (tag) VALUES (tag);
  SELECT jsonb_build_object('tag', tag, 'flag', flag, 'at', extract(epoch FROM at),
                            'id', id, 'doc', doc, 'amount', amount);
$$;
