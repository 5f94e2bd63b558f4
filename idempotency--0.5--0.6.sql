-- idempotency 0.5 -> 0.6: a request's identity and a key's identity that
-- survive any driver, any encoding and any database operation. A fresh
-- install runs 0.1 and every update script in order.
\echo Use "ALTER EXTENSION idempotency UPDATE TO '0.6'" to load this file. \quit
