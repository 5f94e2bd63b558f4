'use strict';
// The request fingerprint, shared with the Python package (idempotency_pg):
// two requests are the same request for a key when their fingerprints are
// equal. It is the lower-case hex SHA-256 of
//
//   METHOD "\n" path [ "?" query ] "\n" body
//
// - METHOD: the request method, upper case;
// - path: the request path, percent-decoded, as bytes;
// - query: the query string exactly as sent (present only when not empty);
// - body: for a JSON media type (application/json, or any type ending in
//   +json) that parses, the canonical JSON of the parsed value (object
//   members sorted by their names' UTF-16 code units, no whitespace, numbers
//   and strings written as JavaScript's JSON.stringify writes them), in
//   UTF-8; otherwise the body's bytes as received (empty when none).

const { createHash } = require('node:crypto');

// JSON with object members in a fixed order and no whitespace.
function canonicalJson(value) {
  if (Array.isArray(value))
    return `[${value.map(canonicalJson).join(',')}]`;
  if (value !== null && typeof value === 'object')
    return `{${Object.keys(value).sort()
      .map((name) => `${JSON.stringify(name)}:${canonicalJson(value[name])}`).join(',')}}`;
  return JSON.stringify(value) ?? 'null';
}

function isJsonMediaType(contentType) {
  if (typeof contentType !== 'string')
    return false;
  const type = contentType.split(';')[0].trim().toLowerCase();
  return type === 'application/json' || type.endsWith('+json');
}

// "%41%2F" -> the bytes 0x41 0x2F; a '%' not followed by two hex digits
// stays as it is.
function percentDecode(bytes) {
  const out = Buffer.alloc(bytes.length);
  let length = 0;
  const hex = (b) => (b >= 0x30 && b <= 0x39) || (b >= 0x41 && b <= 0x46) || (b >= 0x61 && b <= 0x66);
  for (let i = 0; i < bytes.length; i++) {
    if (bytes[i] === 0x25 && i + 2 < bytes.length && hex(bytes[i + 1]) && hex(bytes[i + 2])) {
      out[length++] = parseInt(String.fromCharCode(bytes[i + 1], bytes[i + 2]), 16);
      i += 2;
    } else {
      out[length++] = bytes[i];
    }
  }
  return out.subarray(0, length);
}

// The body's part of the fingerprint: canonical JSON text for a JSON body
// (given parsed, or as bytes that parse), else the bytes.
const strictUtf8 = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true });

function bodyPart(contentType, body) {
  if (body === undefined || body === null)
    return Buffer.alloc(0);
  const json = isJsonMediaType(contentType);
  if (Buffer.isBuffer(body) || body instanceof Uint8Array || typeof body === 'string') {
    const bytes = typeof body === 'string' ? Buffer.from(body, 'utf8') : Buffer.from(body);
    if (json) {
      try {
        // JSON is UTF-8: a body that is not stays its bytes (decoding it with
        // replacement characters would make two different bodies one).
        const text = strictUtf8.decode(bytes).replace(/^\uFEFF/, '');
        return Buffer.from(canonicalJson(JSON.parse(text)), 'utf8');
      } catch {
        // not JSON after all: the bytes
      }
    }
    return bytes;
  }
  if (json)
    return Buffer.from(canonicalJson(body), 'utf8');
  throw new TypeError(
    `idempotency-pg cannot fingerprint a parsed ${contentType ?? 'untyped'} body: the fingerprint of a `
    + 'non-JSON body is its bytes. Give the body parser verify: keepRawBody, or use express.raw().');
}

// The fingerprint of a request given as its parts. requestTarget is the
// request line's target ("/path?query", as Node's req.url has it: latin1).
function fingerprint({ method, requestTarget, contentType, body }) {
  const question = requestTarget.indexOf('?');
  const path = question === -1 ? requestTarget : requestTarget.slice(0, question);
  const query = question === -1 ? '' : requestTarget.slice(question + 1);
  const hash = createHash('sha256');
  hash.update(`${method.toUpperCase()}\n`);
  hash.update(percentDecode(Buffer.from(path, 'latin1')));
  if (query !== '')
    hash.update(Buffer.concat([Buffer.from('?'), Buffer.from(query, 'latin1')]));
  hash.update('\n');
  hash.update(bodyPart(contentType, body));
  return hash.digest('hex');
}

// The fingerprint of a Node/Express request, after its body was read.
function requestFingerprint(req) {
  const body = Buffer.isBuffer(req.rawBody) ? req.rawBody : req.body;
  return fingerprint({
    method: req.method,
    requestTarget: req.originalUrl ?? req.url,
    contentType: req.headers['content-type'],
    body,
  });
}

// For body parsers that parse what is not JSON (express.urlencoded, a text
// parser with a charset): keeps the bytes for the fingerprint.
//   app.use(express.urlencoded({ verify: keepRawBody }))
function keepRawBody(req, res, buffer) {
  req.rawBody = Buffer.from(buffer);
}

module.exports = { fingerprint, requestFingerprint, canonicalJson, isJsonMediaType, keepRawBody };
