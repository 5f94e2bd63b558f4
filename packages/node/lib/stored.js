'use strict';
// The document stored for a key, shared with the Python package:
//
//   { "status": 201,
//     "headers": { "Content-Type": "application/json", "Location": "/x/1" },
//     "body": "<the body>",
//     "body_encoding": "base64" }          <- only for a binary body
//
// A body that is valid UTF-8 without NUL is stored as that text; any other
// body as base64 with "body_encoding": "base64". Either way the replay sends
// the same bytes. Header names keep the casing the application gave them.

const utf8 = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true });

function encodeBody(bytes) {
  if (!bytes.includes(0)) {
    try {
      return { body: utf8.decode(bytes) };
    } catch {
      // not UTF-8: base64 below
    }
  }
  return { body: bytes.toString('base64'), body_encoding: 'base64' };
}

function decodeBody(document) {
  const body = document.body ?? '';
  if (document.body_encoding === 'base64')
    return Buffer.from(body, 'base64');
  if (document.body_encoding !== undefined && document.body_encoding !== 'utf-8')
    throw new TypeError(`stored response has an unknown body_encoding ${JSON.stringify(document.body_encoding)}`);
  return Buffer.from(body, 'utf8');
}

function storedDocument(status, headers, bytes) {
  return { status, headers, ...encodeBody(bytes) };
}

module.exports = { storedDocument, decodeBody, encodeBody };
