"""The document stored for a key, shared with the Node package:

    {"status": 201,
     "headers": {"Content-Type": "application/json", "Location": "/x/1"},
     "body": "<the body>",
     "body_encoding": "base64"}          <- only for a binary body

A body that is valid UTF-8 without NUL is stored as that text; any other
body as base64 with "body_encoding": "base64". Either way the replay sends
the same bytes. Header names keep the casing the application gave them."""
import base64


def encode_body(body):
    body = bytes(body)
    if b"\x00" not in body:
        try:
            return {"body": body.decode("utf-8")}
        except UnicodeDecodeError:
            pass
    return {"body": base64.b64encode(body).decode("ascii"), "body_encoding": "base64"}


def decode_body(document):
    body = document.get("body") or ""
    encoding = document.get("body_encoding")
    if encoding == "base64":
        return base64.b64decode(body)
    if encoding not in (None, "utf-8"):
        raise ValueError(f"stored response has an unknown body_encoding {encoding!r}")
    return body.encode("utf-8")


def stored_document(status, headers, body):
    return {"status": status, "headers": headers, **encode_body(body)}
