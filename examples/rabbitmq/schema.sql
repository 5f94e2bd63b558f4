-- The consumers' database: accounts and the ledger of applied transfers.
-- A message {account, amount} adds one ledger row and moves the account's
-- balance; a transfer that would take the balance below zero is refused
-- with SQLSTATE P0001, an answer the consumer stores like any other.
-- The ledger has no unique constraint on message_id on purpose: the checker,
-- not the schema, must find a message applied twice.
CREATE TABLE public.accounts (
  account integer PRIMARY KEY,
  balance bigint NOT NULL DEFAULT 0
);
CREATE TABLE public.ledger (
  entry_id bigserial PRIMARY KEY,
  message_id text NOT NULL,
  account integer NOT NULL REFERENCES public.accounts,
  amount bigint NOT NULL,
  applied_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX ledger_message_id ON public.ledger (message_id);
-- The textbook inbox of the consumers without the extension (--textbook):
-- a message's id inserted in the transaction of its work, which a
-- redelivery finds there.
CREATE TABLE public.processed_messages (
  message_id text PRIMARY KEY,
  processed_at timestamptz NOT NULL DEFAULT now()
);

CREATE FUNCTION public.apply_transfer(message_id text, account integer, amount bigint)
RETURNS jsonb LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  balance_after bigint;
BEGIN
  UPDATE public.accounts a SET balance = a.balance + amount
   WHERE a.account = apply_transfer.account
   RETURNING a.balance INTO balance_after;
  IF balance_after IS NULL THEN
    RAISE EXCEPTION 'no account %', account USING ERRCODE = 'P0001';
  END IF;
  IF balance_after < 0 THEN
    RAISE EXCEPTION 'insufficient funds on account %', account USING ERRCODE = 'P0001',
      DETAIL = format('the balance would be %s', balance_after);
  END IF;
  INSERT INTO public.ledger (message_id, account, amount) VALUES (message_id, account, amount);
  RETURN jsonb_build_object('message_id', message_id, 'account', account, 'balance', balance_after);
END $$;

INSERT INTO public.accounts (account, balance) SELECT g, 1000 FROM generate_series(1, 50) g;
