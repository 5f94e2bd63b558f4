package idempotency

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"unicode/utf8"
)

// StoredDocument is the document stored for a key, shared with the Node
// and Python packages:
//
//	{ "status": 201,
//	  "headers": { "Content-Type": "application/json", "Location": "/x/1" },
//	  "body": "<the body>",
//	  "body_encoding": "base64" }          <- only for a binary body
//
// A body that is valid UTF-8 without NUL is stored as that text; any other
// body as base64 with "body_encoding": "base64". Either way the replay
// sends the same bytes.
type StoredDocument struct {
	Status       int           `json:"status"`
	Headers      StoredHeaders `json:"headers"`
	Body         string        `json:"body"`
	BodyEncoding string        `json:"body_encoding,omitempty"`
}

// StoredHeaders are the headers of a stored response: a header with one
// value is stored as a string, one with several as an array of strings.
type StoredHeaders map[string][]string

// MarshalJSON writes one value as a string, several as an array.
func (h StoredHeaders) MarshalJSON() ([]byte, error) {
	out := make(map[string]interface{}, len(h))
	for name, values := range h {
		if len(values) == 1 {
			out[name] = values[0]
		} else {
			out[name] = values
		}
	}
	return json.Marshal(out)
}

// UnmarshalJSON reads a string or an array of strings for each header.
func (h *StoredHeaders) UnmarshalJSON(data []byte) error {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		return err
	}
	headers := make(StoredHeaders, len(raw))
	for name, value := range raw {
		var one string
		if err := json.Unmarshal(value, &one); err == nil {
			headers[name] = []string{one}
			continue
		}
		var several []string
		if err := json.Unmarshal(value, &several); err != nil {
			return fmt.Errorf("stored header %q is neither a string nor an array of strings", name)
		}
		headers[name] = several
	}
	*h = headers
	return nil
}

// NewStoredDocument is the document of a response: its status, the headers
// to replay and its body, encoded as the shared format says.
func NewStoredDocument(status int, headers http.Header, body []byte) StoredDocument {
	document := StoredDocument{Status: status, Headers: StoredHeaders{}}
	for name, values := range headers {
		document.Headers[name] = append([]string(nil), values...)
	}
	if bytes.IndexByte(body, 0) < 0 && utf8.Valid(body) {
		document.Body = string(body)
	} else {
		document.Body = base64.StdEncoding.EncodeToString(body)
		document.BodyEncoding = "base64"
	}
	return document
}

// DecodeBody is the body's bytes.
func (d StoredDocument) DecodeBody() ([]byte, error) {
	switch d.BodyEncoding {
	case "base64":
		return base64.StdEncoding.DecodeString(d.Body)
	case "", "utf-8":
		return []byte(d.Body), nil
	default:
		return nil, fmt.Errorf("stored response has an unknown body_encoding %q", d.BodyEncoding)
	}
}

// ParseStoredDocument reads the stored response of a key (the claim's
// response) as an HTTP response document.
func ParseStoredDocument(response []byte) (StoredDocument, error) {
	var document StoredDocument
	var probe map[string]json.RawMessage
	if err := json.Unmarshal(response, &probe); err != nil || probe == nil || probe["status"] == nil {
		return document, errors.New("the stored response of this key is not an HTTP response document")
	}
	if err := json.Unmarshal(response, &document); err != nil {
		return document, fmt.Errorf("the stored response of this key is not an HTTP response document: %w", err)
	}
	if document.Status < 100 || document.Status > 999 {
		return document, fmt.Errorf("the stored response of this key has status %d", document.Status)
	}
	return document, nil
}

// bodyAllowed says whether a response with this status has a body.
func bodyAllowed(status int) bool {
	return status >= 200 && status != http.StatusNoContent && status != http.StatusNotModified
}

// Replay sends a stored response again, byte for byte, with
// Idempotent-Replayed: true.
func Replay(w http.ResponseWriter, document StoredDocument) error {
	body, err := document.DecodeBody()
	if err != nil {
		return err
	}
	header := w.Header()
	for name, values := range document.Headers {
		header.Del(name)
		for _, value := range values {
			header.Add(name, value)
		}
	}
	header.Set("Idempotent-Replayed", "true")
	writeBody(w, document.Status, body)
	return nil
}

// writeBody sends status and body with their Content-Length.
func writeBody(w http.ResponseWriter, status int, body []byte) {
	if bodyAllowed(status) {
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	}
	w.WriteHeader(status)
	if bodyAllowed(status) && len(body) > 0 {
		_, _ = w.Write(body)
	}
}
