-- a batch of 32 new messages through the queue consumers' extension path,
-- statement for statement (per call: the batch)
\set key random(1, 9223372036854775807)
\set a1 random(1, :accounts)
\set a2 random(1, :accounts)
\set a3 random(1, :accounts)
\set a4 random(1, :accounts)
\set a5 random(1, :accounts)
\set a6 random(1, :accounts)
\set a7 random(1, :accounts)
\set a8 random(1, :accounts)
\set a9 random(1, :accounts)
\set a10 random(1, :accounts)
\set a11 random(1, :accounts)
\set a12 random(1, :accounts)
\set a13 random(1, :accounts)
\set a14 random(1, :accounts)
\set a15 random(1, :accounts)
\set a16 random(1, :accounts)
\set a17 random(1, :accounts)
\set a18 random(1, :accounts)
\set a19 random(1, :accounts)
\set a20 random(1, :accounts)
\set a21 random(1, :accounts)
\set a22 random(1, :accounts)
\set a23 random(1, :accounts)
\set a24 random(1, :accounts)
\set a25 random(1, :accounts)
\set a26 random(1, :accounts)
\set a27 random(1, :accounts)
\set a28 random(1, :accounts)
\set a29 random(1, :accounts)
\set a30 random(1, :accounts)
\set a31 random(1, :accounts)
\set a32 random(1, :accounts)
BEGIN;
SELECT ordinality, outcome, sqlstate, message, response::text AS text FROM idempotency.claim_batch(CAST('{"m:key-1","m:key-2","m:key-3","m:key-4","m:key-5","m:key-6","m:key-7","m:key-8","m:key-9","m:key-10","m:key-11","m:key-12","m:key-13","m:key-14","m:key-15","m:key-16","m:key-17","m:key-18","m:key-19","m:key-20","m:key-21","m:key-22","m:key-23","m:key-24","m:key-25","m:key-26","m:key-27","m:key-28","m:key-29","m:key-30","m:key-31","m:key-32"}' AS text[]), CAST('{"0b7a2cbbd0d5a3d1ea0b3bb5a8d6a1c4e0c9f3b7a2d6e1f0c3b9a8d7e6f5a4b3","0b7a2cbbd0d5a3d1ea0b3bb5a8d6a1c4e0c9f3b7a2d6e1f0c3b9a8d7e6f5a4b3","0b7a2cbbd0d5a3d1ea0b3bb5a8d6a1c4e0c9f3b7a2d6e1f0c3b9a8d7e6f5a4b3","0b7a2cbbd0d5a3d1ea0b3bb5a8d6a1c4e0c9f3b7a2d6e1f0c3b9a8d7e6f5a4b3","0b7a2cbbd0d5a3d1ea0b3bb5a8d6a1c4e0c9f3b7a2d6e1f0c3b9a8d7e6f5a4b3","0b7a2cbbd0d5a3d1ea0b3bb5a8d6a1c4e0c9f3b7a2d6e1f0c3b9a8d7e6f5a4b3","0b7a2cbbd0d5a3d1ea0b3bb5a8d6a1c4e0c9f3b7a2d6e1f0c3b9a8d7e6f5a4b3","0b7a2cbbd0d5a3d1ea0b3bb5a8d6a1c4e0c9f3b7a2d6e1f0c3b9a8d7e6f5a4b3","0b7a2cbbd0d5a3d1ea0b3bb5a8d6a1c4e0c9f3b7a2d6e1f0c3b9a8d7e6f5a4b3","0b7a2cbbd0d5a3d1ea0b3bb5a8d6a1c4e0c9f3b7a2d6e1f0c3b9a8d7e6f5a4b3","0b7a2cbbd0d5a3d1ea0b3bb5a8d6a1c4e0c9f3b7a2d6e1f0c3b9a8d7e6f5a4b3","0b7a2cbbd0d5a3d1ea0b3bb5a8d6a1c4e0c9f3b7a2d6e1f0c3b9a8d7e6f5a4b3","0b7a2cbbd0d5a3d1ea0b3bb5a8d6a1c4e0c9f3b7a2d6e1f0c3b9a8d7e6f5a4b3","0b7a2cbbd0d5a3d1ea0b3bb5a8d6a1c4e0c9f3b7a2d6e1f0c3b9a8d7e6f5a4b3","0b7a2cbbd0d5a3d1ea0b3bb5a8d6a1c4e0c9f3b7a2d6e1f0c3b9a8d7e6f5a4b3","0b7a2cbbd0d5a3d1ea0b3bb5a8d6a1c4e0c9f3b7a2d6e1f0c3b9a8d7e6f5a4b3","0b7a2cbbd0d5a3d1ea0b3bb5a8d6a1c4e0c9f3b7a2d6e1f0c3b9a8d7e6f5a4b3","0b7a2cbbd0d5a3d1ea0b3bb5a8d6a1c4e0c9f3b7a2d6e1f0c3b9a8d7e6f5a4b3","0b7a2cbbd0d5a3d1ea0b3bb5a8d6a1c4e0c9f3b7a2d6e1f0c3b9a8d7e6f5a4b3","0b7a2cbbd0d5a3d1ea0b3bb5a8d6a1c4e0c9f3b7a2d6e1f0c3b9a8d7e6f5a4b3","0b7a2cbbd0d5a3d1ea0b3bb5a8d6a1c4e0c9f3b7a2d6e1f0c3b9a8d7e6f5a4b3","0b7a2cbbd0d5a3d1ea0b3bb5a8d6a1c4e0c9f3b7a2d6e1f0c3b9a8d7e6f5a4b3","0b7a2cbbd0d5a3d1ea0b3bb5a8d6a1c4e0c9f3b7a2d6e1f0c3b9a8d7e6f5a4b3","0b7a2cbbd0d5a3d1ea0b3bb5a8d6a1c4e0c9f3b7a2d6e1f0c3b9a8d7e6f5a4b3","0b7a2cbbd0d5a3d1ea0b3bb5a8d6a1c4e0c9f3b7a2d6e1f0c3b9a8d7e6f5a4b3","0b7a2cbbd0d5a3d1ea0b3bb5a8d6a1c4e0c9f3b7a2d6e1f0c3b9a8d7e6f5a4b3","0b7a2cbbd0d5a3d1ea0b3bb5a8d6a1c4e0c9f3b7a2d6e1f0c3b9a8d7e6f5a4b3","0b7a2cbbd0d5a3d1ea0b3bb5a8d6a1c4e0c9f3b7a2d6e1f0c3b9a8d7e6f5a4b3","0b7a2cbbd0d5a3d1ea0b3bb5a8d6a1c4e0c9f3b7a2d6e1f0c3b9a8d7e6f5a4b3","0b7a2cbbd0d5a3d1ea0b3bb5a8d6a1c4e0c9f3b7a2d6e1f0c3b9a8d7e6f5a4b3","0b7a2cbbd0d5a3d1ea0b3bb5a8d6a1c4e0c9f3b7a2d6e1f0c3b9a8d7e6f5a4b3","0b7a2cbbd0d5a3d1ea0b3bb5a8d6a1c4e0c9f3b7a2d6e1f0c3b9a8d7e6f5a4b3"}' AS text[]));
SELECT bench.withdraw(:a1::int, 1::bigint);
SELECT bench.withdraw(:a2::int, 1::bigint);
SELECT bench.withdraw(:a3::int, 1::bigint);
SELECT bench.withdraw(:a4::int, 1::bigint);
SELECT bench.withdraw(:a5::int, 1::bigint);
SELECT bench.withdraw(:a6::int, 1::bigint);
SELECT bench.withdraw(:a7::int, 1::bigint);
SELECT bench.withdraw(:a8::int, 1::bigint);
SELECT bench.withdraw(:a9::int, 1::bigint);
SELECT bench.withdraw(:a10::int, 1::bigint);
SELECT bench.withdraw(:a11::int, 1::bigint);
SELECT bench.withdraw(:a12::int, 1::bigint);
SELECT bench.withdraw(:a13::int, 1::bigint);
SELECT bench.withdraw(:a14::int, 1::bigint);
SELECT bench.withdraw(:a15::int, 1::bigint);
SELECT bench.withdraw(:a16::int, 1::bigint);
SELECT bench.withdraw(:a17::int, 1::bigint);
SELECT bench.withdraw(:a18::int, 1::bigint);
SELECT bench.withdraw(:a19::int, 1::bigint);
SELECT bench.withdraw(:a20::int, 1::bigint);
SELECT bench.withdraw(:a21::int, 1::bigint);
SELECT bench.withdraw(:a22::int, 1::bigint);
SELECT bench.withdraw(:a23::int, 1::bigint);
SELECT bench.withdraw(:a24::int, 1::bigint);
SELECT bench.withdraw(:a25::int, 1::bigint);
SELECT bench.withdraw(:a26::int, 1::bigint);
SELECT bench.withdraw(:a27::int, 1::bigint);
SELECT bench.withdraw(:a28::int, 1::bigint);
SELECT bench.withdraw(:a29::int, 1::bigint);
SELECT bench.withdraw(:a30::int, 1::bigint);
SELECT bench.withdraw(:a31::int, 1::bigint);
SELECT bench.withdraw(:a32::int, 1::bigint);
SELECT idempotency.complete_batch(CAST('{"m:key-1","m:key-2","m:key-3","m:key-4","m:key-5","m:key-6","m:key-7","m:key-8","m:key-9","m:key-10","m:key-11","m:key-12","m:key-13","m:key-14","m:key-15","m:key-16","m:key-17","m:key-18","m:key-19","m:key-20","m:key-21","m:key-22","m:key-23","m:key-24","m:key-25","m:key-26","m:key-27","m:key-28","m:key-29","m:key-30","m:key-31","m:key-32"}' AS text[]), answers) AS done, answers AS texts FROM CAST('{"{\"ok\": true, \"entry\": 123456, \"account\": 4321, \"balance\": 999999999999}","{\"ok\": true, \"entry\": 123456, \"account\": 4321, \"balance\": 999999999999}","{\"ok\": true, \"entry\": 123456, \"account\": 4321, \"balance\": 999999999999}","{\"ok\": true, \"entry\": 123456, \"account\": 4321, \"balance\": 999999999999}","{\"ok\": true, \"entry\": 123456, \"account\": 4321, \"balance\": 999999999999}","{\"ok\": true, \"entry\": 123456, \"account\": 4321, \"balance\": 999999999999}","{\"ok\": true, \"entry\": 123456, \"account\": 4321, \"balance\": 999999999999}","{\"ok\": true, \"entry\": 123456, \"account\": 4321, \"balance\": 999999999999}","{\"ok\": true, \"entry\": 123456, \"account\": 4321, \"balance\": 999999999999}","{\"ok\": true, \"entry\": 123456, \"account\": 4321, \"balance\": 999999999999}","{\"ok\": true, \"entry\": 123456, \"account\": 4321, \"balance\": 999999999999}","{\"ok\": true, \"entry\": 123456, \"account\": 4321, \"balance\": 999999999999}","{\"ok\": true, \"entry\": 123456, \"account\": 4321, \"balance\": 999999999999}","{\"ok\": true, \"entry\": 123456, \"account\": 4321, \"balance\": 999999999999}","{\"ok\": true, \"entry\": 123456, \"account\": 4321, \"balance\": 999999999999}","{\"ok\": true, \"entry\": 123456, \"account\": 4321, \"balance\": 999999999999}","{\"ok\": true, \"entry\": 123456, \"account\": 4321, \"balance\": 999999999999}","{\"ok\": true, \"entry\": 123456, \"account\": 4321, \"balance\": 999999999999}","{\"ok\": true, \"entry\": 123456, \"account\": 4321, \"balance\": 999999999999}","{\"ok\": true, \"entry\": 123456, \"account\": 4321, \"balance\": 999999999999}","{\"ok\": true, \"entry\": 123456, \"account\": 4321, \"balance\": 999999999999}","{\"ok\": true, \"entry\": 123456, \"account\": 4321, \"balance\": 999999999999}","{\"ok\": true, \"entry\": 123456, \"account\": 4321, \"balance\": 999999999999}","{\"ok\": true, \"entry\": 123456, \"account\": 4321, \"balance\": 999999999999}","{\"ok\": true, \"entry\": 123456, \"account\": 4321, \"balance\": 999999999999}","{\"ok\": true, \"entry\": 123456, \"account\": 4321, \"balance\": 999999999999}","{\"ok\": true, \"entry\": 123456, \"account\": 4321, \"balance\": 999999999999}","{\"ok\": true, \"entry\": 123456, \"account\": 4321, \"balance\": 999999999999}","{\"ok\": true, \"entry\": 123456, \"account\": 4321, \"balance\": 999999999999}","{\"ok\": true, \"entry\": 123456, \"account\": 4321, \"balance\": 999999999999}","{\"ok\": true, \"entry\": 123456, \"account\": 4321, \"balance\": 999999999999}","{\"ok\": true, \"entry\": 123456, \"account\": 4321, \"balance\": 999999999999}"}' AS jsonb[]) AS answers;
COMMIT;
