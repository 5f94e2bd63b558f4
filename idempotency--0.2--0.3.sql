-- idempotency 0.2 -> 0.3: every change to the key row and the objects around
-- it that this version makes. A fresh install runs 0.1, 0.1--0.2 and this
-- script in order.
\echo Use "ALTER EXTENSION idempotency UPDATE TO '0.3'" to load this file. \quit

