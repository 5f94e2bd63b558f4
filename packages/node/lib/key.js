'use strict';
// Reads the Idempotency-Key request header as the IETF draft
// (draft-ietf-httpapi-idempotency-key-header) defines it: a Structured Field
// String ("...", with \" and \\ escapes), and the common bare form. Keys are
// printable ASCII (0x20-0x7E): a non-ASCII or control character makes the
// header invalid, never a different key. Node hands header values over as
// latin1, one character per byte, so a character above 0x7E here is a raw
// byte above 0x7E on the wire.

const MAX_KEY_BYTES = 255;

const isPrintableAscii = (code) => code >= 0x20 && code <= 0x7e;

function invalid(detail) {
  return { error: detail };
}

// The characters after the opening quote up to the closing one, unescaped;
// parameters after the string (";a=1") are ignored, as RFC 8941 asks.
function parseQuoted(text) {
  let key = '';
  for (let i = 1; i < text.length; i++) {
    const code = text.charCodeAt(i);
    if (code === 0x5c) { // backslash
      const next = text[++i];
      if (next !== '"' && next !== '\\')
        return invalid('In a quoted Idempotency-Key, a backslash may only escape " or \\.');
      key += next;
    } else if (code === 0x22) { // closing quote
      const rest = text.slice(i + 1);
      if (rest !== '' && !rest.startsWith(';'))
        return invalid('Nothing but parameters may follow the closing quote of an Idempotency-Key.');
      return { key };
    } else if (!isPrintableAscii(code)) {
      return invalid(nonAsciiDetail(code));
    } else {
      key += text[i];
    }
  }
  return invalid('A quoted Idempotency-Key lacks its closing quote.');
}

function nonAsciiDetail(code) {
  return code > 0x7f
    ? 'An Idempotency-Key may only hold printable ASCII characters; this one has a byte above 0x7E (non-ASCII).'
    : 'An Idempotency-Key may only hold printable ASCII characters; this one has a control character.';
}

// Parses one field value. Returns { key } or { error: detail }.
function parseKey(value) {
  const text = value.replace(/^[ \t]+|[ \t]+$/g, '');
  let result;
  if (text.startsWith('"')) {
    result = parseQuoted(text);
  } else {
    const bad = [...text].find((ch) => !isPrintableAscii(ch.charCodeAt(0)));
    result = bad === undefined ? { key: text } : invalid(nonAsciiDetail(bad.charCodeAt(0)));
  }
  if (result.key !== undefined && (result.key.length < 1 || result.key.length > MAX_KEY_BYTES))
    return invalid(`An Idempotency-Key must be 1 to ${MAX_KEY_BYTES} bytes long.`);
  return result;
}

// The key of a Node request: { key }, { missing: true } or { error }. Reads
// every Idempotency-Key field of the raw headers: more than one is an error
// (Node would join them with ", ").
function readKey(req) {
  const values = [];
  const raw = req.rawHeaders ?? [];
  for (let i = 0; i < raw.length; i += 2) {
    if (raw[i].toLowerCase() === 'idempotency-key')
      values.push(raw[i + 1]);
  }
  if (values.length === 0 && typeof req.headers?.['idempotency-key'] === 'string')
    values.push(req.headers['idempotency-key']);
  if (values.length === 0)
    return { missing: true };
  if (values.length > 1)
    return invalid('Send one Idempotency-Key field, not several.');
  return parseKey(values[0]);
}

module.exports = { parseKey, readKey, MAX_KEY_BYTES };
