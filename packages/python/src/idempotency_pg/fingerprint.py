"""The request fingerprint, shared with the Node package (idempotency-pg):
two requests are the same request for a key when their fingerprints are
equal. It is the lower-case hex SHA-256 of

    METHOD "\\n" path [ "?" query ] "\\n" body

- METHOD: the request method, upper case;
- path: the request path, percent-decoded, as bytes;
- query: the query string exactly as sent (present only when not empty);
- body: for a JSON media type (application/json, or any type ending in
  +json) that parses, the canonical JSON of the parsed value (object members
  sorted by their names' UTF-16 code units, no whitespace, numbers and
  strings written as JavaScript's JSON.stringify writes them), in UTF-8;
  otherwise the body's bytes as received (empty when none).

Numbers are what JavaScript makes of them: integers beyond 2**53 and all
fractions are IEEE doubles, written in the shortest form that reads back."""
import hashlib
import json
import math
import re
from decimal import Decimal

_MAX_SAFE_INTEGER = 2 ** 53


def is_json_media_type(content_type):
    if not content_type:
        return False
    media_type = content_type.split(";")[0].strip().lower()
    return media_type == "application/json" or media_type.endswith("+json")


def _es_number(value):
    """A number as JavaScript's Number::toString writes it."""
    if isinstance(value, int):
        if abs(value) <= _MAX_SAFE_INTEGER:
            return str(value)
        value = float(value)
    if math.isnan(value) or math.isinf(value):
        return "null"
    if value == 0:
        return "0"
    sign = "-" if value < 0 else ""
    _, digits, exponent = Decimal(repr(abs(value))).normalize().as_tuple()
    s = "".join(map(str, digits))
    k = len(s)
    n = exponent + k  # the decimal point's position
    if k <= n <= 21:
        text = s + "0" * (n - k)
    elif 0 < n <= 21:
        text = s[:n] + "." + s[n:]
    elif -6 < n <= 0:
        text = "0." + "0" * -n + s
    else:
        e = n - 1
        mantissa = s if k == 1 else s[0] + "." + s[1:]
        text = f"{mantissa}e{'+' if e >= 0 else '-'}{abs(e)}"
    return sign + text


_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _es_string(text):
    """A string as JSON.stringify writes it."""
    out = ['"']
    for ch in text:
        code = ord(ch)
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif code < 0x20 or 0xD800 <= code <= 0xDFFF:
            out.append(f"\\u{code:04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _utf16_order(name):
    return name.encode("utf-16-be", "surrogatepass")


def canonical_json(value):
    """JSON with object members in a fixed order and no whitespace."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, (int, float)):
        return _es_number(value)
    if isinstance(value, str):
        return _es_string(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(canonical_json(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{_es_string(name)}:{canonical_json(value[name])}"
                              for name in sorted(value, key=_utf16_order)) + "}"
    raise TypeError(f"not a JSON value: {type(value).__name__}")


def _parse_int(text):
    number = int(text)
    return number if abs(number) <= _MAX_SAFE_INTEGER else float(text)


def _no_constants(name):
    raise ValueError(f"{name} is not JSON")


def _body_part(content_type, body):
    body = bytes(body or b"")
    if is_json_media_type(content_type):
        try:
            text = body.decode("utf-8")
            if text.startswith("\ufeff"):
                text = text[1:]
            value = json.loads(text, parse_int=_parse_int, parse_constant=_no_constants)
            return canonical_json(value).encode("utf-8", "surrogatepass")
        except ValueError:
            pass  # not JSON after all: the bytes
    return body


def fingerprint_of_parts(method, path, query, content_type, body):
    """The fingerprint from the decoded path (bytes) and the query as sent
    (bytes)."""
    digest = hashlib.sha256(method.upper().encode("ascii") + b"\n" + path)
    if query:
        digest.update(b"?" + query)
    digest.update(b"\n")
    digest.update(_body_part(content_type, body))
    return digest.hexdigest()


_PERCENT = re.compile(rb"%([0-9A-Fa-f]{2})")


def fingerprint(method, request_target, content_type, body):
    """The fingerprint from the request line's target (bytes, or latin1
    text): "/path?query" with the path still percent-encoded."""
    if isinstance(request_target, str):
        request_target = request_target.encode("latin1")
    path, question, query = request_target.partition(b"?")
    path = _PERCENT.sub(lambda match: bytes([int(match.group(1), 16)]), path)
    return fingerprint_of_parts(method, path, query, content_type, body)


def _latin1(text):
    try:
        return text.encode("latin1")
    except UnicodeEncodeError:  # not from a WSGI server: already decoded text
        return text.encode("utf-8")


def wsgi_fingerprint(environ, body):
    """The fingerprint of a WSGI request (Django's request.META), whose
    PATH_INFO the server percent-decoded already."""
    path = _latin1(environ.get("SCRIPT_NAME", "") + environ.get("PATH_INFO", ""))
    return fingerprint_of_parts(environ.get("REQUEST_METHOD", "GET"), path,
                                _latin1(environ.get("QUERY_STRING", "")),
                                environ.get("CONTENT_TYPE"), body)
