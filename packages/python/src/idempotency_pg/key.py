"""Reads the Idempotency-Key request header as the IETF draft
(draft-ietf-httpapi-idempotency-key-header) defines it: a Structured Field
String ("...", with \\" and \\\\ escapes), and the common bare form. Keys are
printable ASCII (0x20-0x7E): a non-ASCII or control character makes the
header invalid, never a different key. WSGI (PEP 3333) hands header values
over as latin1 text, one character per byte, so a character above 0x7E here
is a raw byte above 0x7E on the wire."""

MAX_KEY_BYTES = 255


class KeyHeader:
    """The outcome of reading the header: key, or missing, or error."""

    __slots__ = ("key", "missing", "error")

    def __init__(self, key=None, missing=False, error=None):
        self.key, self.missing, self.error = key, missing, error

    def __eq__(self, other):
        return isinstance(other, KeyHeader) and (self.key, self.missing, self.error) == (
            other.key, other.missing, other.error)

    def __repr__(self):
        return f"KeyHeader(key={self.key!r}, missing={self.missing}, error={self.error!r})"


def _printable(code):
    return 0x20 <= code <= 0x7E


def _bad_character(code):
    if code > 0x7F:
        return KeyHeader(error="An Idempotency-Key may only hold printable ASCII characters; "
                               "this one has a byte above 0x7E (non-ASCII).")
    return KeyHeader(error="An Idempotency-Key may only hold printable ASCII characters; "
                           "this one has a control character.")


def _parse_quoted(text):
    key = []
    i = 1
    while i < len(text):
        ch = text[i]
        if ch == "\\":
            i += 1
            if i >= len(text) or text[i] not in ('"', "\\"):
                return KeyHeader(error='In a quoted Idempotency-Key, a backslash may only escape " or \\.')
            key.append(text[i])
        elif ch == '"':
            rest = text[i + 1:]
            if rest and not rest.startswith(";"):
                return KeyHeader(error="Nothing but parameters may follow the closing quote of an Idempotency-Key.")
            return KeyHeader(key="".join(key))
        elif not _printable(ord(ch)):
            return _bad_character(ord(ch))
        else:
            key.append(ch)
        i += 1
    return KeyHeader(error="A quoted Idempotency-Key lacks its closing quote.")


def parse_key(value):
    """Parses one field value (latin1 text, as WSGI gives it)."""
    text = value.strip(" \t")
    if text.startswith('"'):
        result = _parse_quoted(text)
    else:
        bad = next((ord(ch) for ch in text if not _printable(ord(ch))), None)
        result = KeyHeader(key=text) if bad is None else _bad_character(bad)
    if result.key is not None and not 1 <= len(result.key) <= MAX_KEY_BYTES:
        return KeyHeader(error=f"An Idempotency-Key must be 1 to {MAX_KEY_BYTES} bytes long.")
    return result


def read_key(meta):
    """The key of a WSGI/Django request, from its META (environ)."""
    value = meta.get("HTTP_IDEMPOTENCY_KEY")
    if value is None:
        return KeyHeader(missing=True)
    return parse_key(value)
