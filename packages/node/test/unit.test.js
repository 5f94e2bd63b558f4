'use strict';
// The parts that need no database: the Idempotency-Key parser, the shared
// fingerprint (against packages/shared/fingerprint-vectors.json, which the
// Python package's tests read too), the storing policy and the stored
// document.

const { test } = require('node:test');
const assert = require('node:assert/strict');
const path = require('node:path');
const fs = require('node:fs');
const {
  parseKey, fingerprint, canonicalJson, isStored, storedDocument, decodeBody, scopedKey, SHARED_KEYS,
} = require('..');

function vectorsFile(name = 'fingerprint-vectors.json') {
  // In the repository: packages/shared; the test runner may run a copy of
  // packages/node, which names the repository's file in SHARED_DIR.
  const dir = process.env.SHARED_DIR ?? path.join(__dirname, '..', '..', 'shared');
  return path.join(dir, name);
}

test('scopedKey matches the shared vectors', () => {
  const vectors = JSON.parse(fs.readFileSync(vectorsFile('scope-vectors.json'), 'utf8'));
  assert.ok(vectors.length >= 8);
  for (const vector of vectors)
    assert.equal(scopedKey(vector.scope, vector.key), vector.database_key, vector.name);
});

test('scopedKey: both forms stay within 255 bytes; refused scopes', () => {
  for (const length of [1, 220, 221, 255]) {
    const derived = scopedKey('alice', 'k'.repeat(length));
    assert.ok(Buffer.byteLength(derived) <= 255);
    assert.equal(derived[33], length <= 220 ? ':' : '#');
  }
  assert.notEqual(scopedKey('alice', 'k'), scopedKey('bob', 'k'));
  assert.equal(scopedKey(7, 'k'), scopedKey('7', 'k'));
  assert.equal(scopedKey(SHARED_KEYS, 'k'), 'k');
  for (const scope of [null, undefined, '', 1.5, true, {}, Buffer.from('alice')])
    assert.throws(() => scopedKey(scope, 'k'), TypeError, String(scope));
});

test('parseKey: bare and Structured Field String forms', () => {
  assert.deepEqual(parseKey('abc-123'), { key: 'abc-123' });
  assert.deepEqual(parseKey('  abc  '), { key: 'abc' });
  assert.deepEqual(parseKey('"abc"'), { key: 'abc' });
  assert.deepEqual(parseKey('"a\\"b\\\\c"'), { key: 'a"b\\c' });
  assert.deepEqual(parseKey('"abc";p=1'), { key: 'abc' });
  assert.deepEqual(parseKey('"a b"'), { key: 'a b' });
  assert.deepEqual(parseKey('k'.repeat(255)), { key: 'k'.repeat(255) });
});

test('parseKey: refused values', () => {
  for (const value of ['', '""', 'k'.repeat(256), '"abc', '"a"b', '"a\\b"', 'a\tb', 'a\x00b', 'a\x7fb',
    'caf\xc3\xa9', '\xe9', '"\xc3\xa9"'])
    assert.ok(parseKey(value).error, `${JSON.stringify(value)} is refused`);
});

test('the fingerprint matches the shared vectors', () => {
  const vectors = JSON.parse(fs.readFileSync(vectorsFile(), 'utf8'));
  assert.ok(vectors.length >= 10);
  for (const vector of vectors) {
    const got = fingerprint({
      method: vector.method,
      requestTarget: Buffer.from(vector.target, 'utf8').toString('latin1'),
      contentType: vector.content_type ?? undefined,
      body: Buffer.from(vector.body_base64, 'base64'),
    });
    assert.equal(got, vector.fingerprint, vector.name);
  }
});

test('the fingerprint is SHA-256 of method, path and canonical JSON, as documented', () => {
  const { createHash } = require('node:crypto');
  const expected = createHash('sha256').update('POST\n/x?a=1\n{"a":1,"b":[2,{"c":3,"d":4}]}').digest('hex');
  assert.equal(fingerprint({ method: 'post', requestTarget: '/x?a=1', contentType: 'application/json',
    body: { b: [2, { d: 4, c: 3 }], a: 1 } }), expected);
  assert.equal(canonicalJson({ b: 1, a: [1.5, 'x', null] }), '{"a":[1.5,"x",null],"b":1}');
});

test('the storing policy', () => {
  for (const status of [200, 201, 204, 301, 302, 401, 402, 403, 404, 410])
    assert.equal(isStored(status), true, String(status));
  for (const status of [400, 408, 409, 422, 425, 429, 500, 502, 503, 504])
    assert.equal(isStored(status), false, String(status));
  assert.equal(isStored(400, { storeValidationErrors: true }), true);
  assert.equal(isStored(422, { storeValidationErrors: true }), true);
  assert.equal(isStored(409, { storeValidationErrors: true }), false);
  assert.equal(isStored(404, { validationStatuses: [404] }), false);
});

test('stored documents keep every byte', () => {
  for (const bytes of [Buffer.from('plain'), Buffer.from([0x25, 0x50, 0xff, 0xfe, 0x41]), Buffer.from([0x61, 0, 0x62]),
    Buffer.from([0xef, 0xbb, 0xbf, 0x41]), Buffer.alloc(0)]) {
    const document = JSON.parse(JSON.stringify(storedDocument(200, {}, bytes)));
    assert.deepEqual(Buffer.from(decodeBody(document)), bytes);
  }
  assert.equal(storedDocument(200, {}, Buffer.from([0xff])).body_encoding, 'base64');
  assert.equal(storedDocument(200, {}, Buffer.from('é')).body, 'é');
  assert.throws(() => decodeBody({ status: 200, body: 'x', body_encoding: 'rot13' }), /body_encoding/);
});
