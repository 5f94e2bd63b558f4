package idempotency

// Tests without a database: the key header, the scope and fingerprint
// vectors shared with the Node and Python packages, the storing policy and
// the stored document.

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The shared vectors: SHARED_DIR (packages/run-tests names the
// repository's), else packages/shared of the checkout.
func readVectors(t *testing.T, name string, into interface{}) {
	t.Helper()
	dir := os.Getenv("SHARED_DIR")
	if dir == "" {
		dir = filepath.Join("..", "..", "shared")
	}
	data, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	decoder := json.NewDecoder(bytes.NewReader(data))
	decoder.UseNumber()
	if err := decoder.Decode(into); err != nil {
		t.Fatal(err)
	}
}

func TestScopedKeyMatchesTheSharedVectors(t *testing.T) {
	var vectors []struct {
		Name        string
		Scope       interface{}
		Key         string
		DatabaseKey string `json:"database_key"`
	}
	readVectors(t, "scope-vectors.json", &vectors)
	if len(vectors) < 8 {
		t.Fatalf("only %d scope vectors", len(vectors))
	}
	for _, v := range vectors {
		scope, ok := v.Scope.(string)
		if number, isNumber := v.Scope.(json.Number); isNumber {
			scope, ok = number.String(), true // an integer principal: its decimal text
		}
		if !ok {
			t.Fatalf("%s: scope %v", v.Name, v.Scope)
		}
		got, err := ScopedKey(scope, v.Key)
		if err != nil || got != v.DatabaseKey {
			t.Errorf("%s: ScopedKey = %q, %v; want %q", v.Name, got, err, v.DatabaseKey)
		}
	}
	if _, err := ScopedKey("", "k"); err == nil {
		t.Error("an empty scope was accepted")
	}
}

func TestFingerprintMatchesTheSharedVectors(t *testing.T) {
	var vectors []struct {
		Name        string
		Method      string
		Target      string
		ContentType *string `json:"content_type"`
		BodyBase64  string  `json:"body_base64"`
		Fingerprint string
	}
	readVectors(t, "fingerprint-vectors.json", &vectors)
	if len(vectors) < 10 {
		t.Fatalf("only %d fingerprint vectors", len(vectors))
	}
	for _, v := range vectors {
		body, err := base64.StdEncoding.DecodeString(v.BodyBase64)
		if err != nil {
			t.Fatal(err)
		}
		contentType := ""
		if v.ContentType != nil {
			contentType = *v.ContentType
		}
		if got := Fingerprint(v.Method, v.Target, contentType, body); got != v.Fingerprint {
			t.Errorf("%s: fingerprint %s, want %s", v.Name, got, v.Fingerprint)
		}
	}
}

func TestFingerprintIsSHA256OfMethodPathAndCanonicalJSON(t *testing.T) {
	sum := sha256.Sum256([]byte("POST\n/x?a=1\n{\"a\":1,\"b\":[2,{\"c\":3,\"d\":4}]}"))
	got := Fingerprint("post", "/x?a=1", "application/json", []byte(`{"b": [2, {"d": 4, "c": 3}], "a": 1}`))
	if got != hex.EncodeToString(sum[:]) {
		t.Errorf("fingerprint %s", got)
	}
}

func TestCanonicalJSONIsWhatJavaScriptWrites(t *testing.T) {
	for input, want := range map[string]string{
		`{"b": 1, "a": [1.5, "x", null]}`:   `{"a":[1.5,"x",null],"b":1}`,
		`[1e400, -1e400, 1e-400, -0.0]`:     `[null,null,0,0]`,
		`[0.000001, 1e-7, 1e21, 123e-20]`:   `[0.000001,1e-7,1e+21,1.23e-18]`,
		`"\u00e9\ud83d\ude00\ud800\u001f<"`: "\"é😀\\ud800\\u001f<\"",
	} {
		got, err := CanonicalJSON([]byte(input))
		if err != nil || string(got) != want {
			t.Errorf("CanonicalJSON(%s) = %s, %v; want %s", input, got, err, want)
		}
	}
	for _, bad := range []string{``, `{"a":1,}`, `[01]`, `{'a':1}`, `1 2`, `"a` + "\n" + `"`, `NaN`, `[.5]`, `{"a" 1}`,
		// Not UTF-8 (the last a surrogate's encoding): no JSON.
		"\"\xff\xe2\x82\"", "\"\xed\xa0\x80\""} {
		if got, err := CanonicalJSON([]byte(bad)); err == nil {
			t.Errorf("CanonicalJSON(%q) = %s, want an error", bad, got)
		}
	}
}

func TestParseKey(t *testing.T) {
	for value, want := range map[string]string{
		"abc":                    "abc",
		"  abc \t":               "abc",
		`"abc"`:                  "abc",
		`"a\"b\\c";p=1`:          `a"b\c`,
		`a "quoted" key`:         `a "quoted" key`,
		strings.Repeat("k", 255): strings.Repeat("k", 255),
	} {
		if got, err := ParseKey(value); err != nil || got != want {
			t.Errorf("ParseKey(%q) = %q, %v; want %q", value, got, err, want)
		}
	}
	for value, detail := range map[string]string{
		"":                       "1 to 255 bytes",
		`""`:                     "1 to 255 bytes",
		strings.Repeat("k", 256): "1 to 255 bytes",
		"caf\xc3\xa9":            "non-ASCII",
		"a\x01b":                 "control character",
		"a\x7fb":                 "control character",
		`"a\nb"`:                 "backslash may only escape",
		`"abc`:                   "lacks its closing quote",
		`"abc" x`:                "Nothing but parameters",
	} {
		_, err := ParseKey(value)
		if err == nil || !strings.Contains(err.Error(), detail) || !errors.Is(err, ErrInvalidKey) {
			t.Errorf("ParseKey(%q) = %v; want an invalid key error saying %q", value, err, detail)
		}
	}
}

func TestStoringPolicy(t *testing.T) {
	for _, status := range []int{200, 201, 204, 301, 302, 401, 402, 403, 404, 410} {
		if !IsStored(status, false, nil) {
			t.Errorf("%d not stored", status)
		}
	}
	for _, status := range []int{400, 408, 409, 422, 425, 429, 500, 502, 503, 504} {
		if IsStored(status, false, nil) {
			t.Errorf("%d stored", status)
		}
	}
	if !IsStored(400, true, nil) || !IsStored(422, true, nil) || IsStored(409, true, nil) || IsStored(404, false, []int{404}) {
		t.Error("validation statuses")
	}
}

func TestStoredDocumentsKeepEveryByte(t *testing.T) {
	for _, body := range [][]byte{[]byte("plain"), {0x25, 0x50, 0xff, 0xfe, 0x41}, {0x61, 0, 0x62}, {0xef, 0xbb, 0xbf, 0x41}, {}} {
		text, err := json.Marshal(NewStoredDocument(200, http.Header{"Location": {"/x"}}, body))
		if err != nil {
			t.Fatal(err)
		}
		document, err := ParseStoredDocument(text)
		if err != nil {
			t.Fatal(err)
		}
		got, err := document.DecodeBody()
		if err != nil || !bytes.Equal(got, body) || document.Headers["Location"][0] != "/x" {
			t.Errorf("%x came back as %x, %v (%s)", body, got, err, text)
		}
	}
	if d := NewStoredDocument(200, nil, []byte{0xff}); d.BodyEncoding != "base64" {
		t.Error("a binary body is not base64")
	}
	if d := NewStoredDocument(200, nil, []byte("é")); d.Body != "é" || d.BodyEncoding != "" {
		t.Error("UTF-8 text is not stored as text")
	}
	if _, err := (StoredDocument{Status: 200, Body: "x", BodyEncoding: "rot13"}).DecodeBody(); err == nil {
		t.Error("an unknown body_encoding decoded")
	}
	// One value a string, several an array; both read back.
	text, _ := json.Marshal(StoredHeaders{"Etag": {`"a"`}, "Link": {"<a>", "<b>"}})
	if string(text) != `{"Etag":"\"a\"","Link":["\u003ca\u003e","\u003cb\u003e"]}` {
		t.Errorf("headers written as %s", text)
	}
	for _, bad := range []string{`null`, `{"headers": {}}`, `{"status": 20.5}`, `[1]`} {
		if _, err := ParseStoredDocument([]byte(bad)); err == nil {
			t.Errorf("%s was taken for a response document", bad)
		}
	}
}
