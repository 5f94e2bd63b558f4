"""The parts that need no database: the key parser, the shared fingerprint
(against packages/shared/fingerprint-vectors.json, which the Node package's
tests read too), the storing policy and the stored document."""
import base64
import hashlib
import json
import os
import unittest

from idempotency_pg import (canonical_json, decode_body, fingerprint, is_stored, parse_key, stored_document,
                            wsgi_fingerprint)

SHARED = os.environ.get("SHARED_DIR", os.path.join(os.path.dirname(__file__), "..", "..", "shared"))


class KeyTests(unittest.TestCase):
    def test_accepted(self):
        for value, key in (("abc-123", "abc-123"), ("  abc  ", "abc"), ('"abc"', "abc"), ('"a\\"b\\\\c"', 'a"b\\c'),
                           ('"abc";p=1', "abc"), ('"a b"', "a b"), ("k" * 255, "k" * 255)):
            self.assertEqual(parse_key(value).key, key, value)

    def test_refused(self):
        for value in ("", '""', "k" * 256, '"abc', '"a"b', '"a\\b"', "a\tb", "a\x00b", "a\x7fb", "caf\xc3\xa9",
                      "\xe9", '"\xc3\xa9"'):
            self.assertIsNotNone(parse_key(value).error, repr(value))


class FingerprintTests(unittest.TestCase):
    def test_shared_vectors(self):
        with open(os.path.join(SHARED, "fingerprint-vectors.json"), encoding="utf-8") as file:
            vectors = json.load(file)
        self.assertGreaterEqual(len(vectors), 10)
        for vector in vectors:
            got = fingerprint(vector["method"], vector["target"].encode("utf-8"), vector["content_type"],
                              base64.b64decode(vector["body_base64"]))
            self.assertEqual(got, vector["fingerprint"], vector["name"])

    def test_documented_form(self):
        expected = hashlib.sha256(b'POST\n/x?a=1\n{"a":1,"b":[2,{"c":3,"d":4}]}').hexdigest()
        self.assertEqual(fingerprint("post", "/x?a=1", "application/json", b'{"b": [2, {"d": 4, "c": 3}], "a": 1}'),
                         expected)
        self.assertEqual(canonical_json({"b": 1, "a": [1.5, "x", None]}), '{"a":[1.5,"x",null],"b":1}')

    def test_wsgi_environ_has_the_decoded_path(self):
        environ = {"REQUEST_METHOD": "POST", "PATH_INFO": "/a b/\xc3\xa9", "QUERY_STRING": "q=%41",
                   "CONTENT_TYPE": "text/plain"}
        self.assertEqual(wsgi_fingerprint(environ, b"x"), fingerprint("POST", b"/a%20b/%C3%A9?q=%41", "text/plain", b"x"))

    def test_numbers_as_javascript_writes_them(self):
        for value, text in ((1.0, "1"), (1e21, "1e+21"), (1e-7, "1e-7"), (1e-6, "0.000001"), (-0.0, "0"),
                            (123e-20, "1.23e-18"), (2 ** 53 + 1, "9007199254740992"), (1e16, "10000000000000000"),
                            (0.1, "0.1"), (5e-324, "5e-324"), (float("inf"), "null")):
            self.assertEqual(canonical_json(value), text, value)


class PolicyAndDocumentTests(unittest.TestCase):
    def test_policy(self):
        for status in (200, 201, 204, 301, 302, 401, 402, 403, 404, 410):
            self.assertTrue(is_stored(status), status)
        for status in (400, 408, 409, 422, 425, 429, 500, 502, 503, 504):
            self.assertFalse(is_stored(status), status)
        self.assertTrue(is_stored(400, store_validation_errors=True))
        self.assertFalse(is_stored(409, store_validation_errors=True))
        self.assertFalse(is_stored(404, validation_statuses=(404,)))

    def test_documents_keep_every_byte(self):
        for body in (b"plain", bytes([0x25, 0x50, 0xFF, 0xFE, 0x41]), b"a\x00b", b"\xef\xbb\xbfA", b""):
            document = json.loads(json.dumps(stored_document(200, {}, body)))
            self.assertEqual(decode_body(document), body)
        self.assertEqual(stored_document(200, {}, b"\xff")["body_encoding"], "base64")
        self.assertEqual(stored_document(200, {}, "é".encode())["body"], "é")
        with self.assertRaises(ValueError):
            decode_body({"status": 200, "body": "x", "body_encoding": "rot13"})


if __name__ == "__main__":
    unittest.main()
