-- idempotency 0.2 -> 0.3: every change to the key row and the objects around
-- it that this version makes. A fresh install runs 0.1, 0.1--0.2 and this
-- script in order.
\echo Use "ALTER EXTENSION idempotency UPDATE TO '0.3'" to load this file. \quit

-- The key row loses its status column. A row is written once, when its
-- call is done, so status was 'done' in every row; nothing reads it.
-- Dropping a column rewrites no row: every stored key keeps replaying.
-- Whatever a DBA built on the column (a view, an index) goes with it.
ALTER TABLE idempotency.keys DROP COLUMN status CASCADE;
