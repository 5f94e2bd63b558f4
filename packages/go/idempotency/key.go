package idempotency

import (
	"fmt"
	"net/http"
	"strings"
)

// MaxKeyBytes is the longest Idempotency-Key, in bytes.
const MaxKeyBytes = 255

// The Idempotency-Key request header as the IETF draft
// (draft-ietf-httpapi-idempotency-key-header) defines it: a Structured Field
// String ("...", with \" and \\ escapes), and the common bare form. Keys are
// printable ASCII (0x20-0x7E): a non-ASCII or control byte makes the header
// invalid, never a different key.

func isPrintableASCII(b byte) bool { return b >= 0x20 && b <= 0x7e }

func nonASCIIDetail(b byte) string {
	if b > 0x7f {
		return "An Idempotency-Key may only hold printable ASCII characters; this one has a byte above 0x7E (non-ASCII)."
	}
	return "An Idempotency-Key may only hold printable ASCII characters; this one has a control character."
}

// invalidKey is the error of a header that holds no valid key; its message
// is the detail of the 400 problem.
func invalidKey(detail string) error {
	return &Error{Code: CodeInvalidKey, Status: http.StatusBadRequest, Message: detail}
}

// parseQuoted reads the characters after the opening quote up to the
// closing one, unescaped; parameters after the string (";a=1") are ignored,
// as RFC 8941 asks.
func parseQuoted(text string) (string, error) {
	var key strings.Builder
	for i := 1; i < len(text); i++ {
		b := text[i]
		switch {
		case b == '\\':
			i++
			if i >= len(text) || (text[i] != '"' && text[i] != '\\') {
				return "", invalidKey(`In a quoted Idempotency-Key, a backslash may only escape " or \.`)
			}
			key.WriteByte(text[i])
		case b == '"':
			rest := text[i+1:]
			if rest != "" && !strings.HasPrefix(rest, ";") {
				return "", invalidKey("Nothing but parameters may follow the closing quote of an Idempotency-Key.")
			}
			return key.String(), nil
		case !isPrintableASCII(b):
			return "", invalidKey(nonASCIIDetail(b))
		default:
			key.WriteByte(b)
		}
	}
	return "", invalidKey("A quoted Idempotency-Key lacks its closing quote.")
}

// ParseKey parses one Idempotency-Key field value (its bytes as received).
// The error, an *Error with Code CodeInvalidKey, says what is wrong in
// words fit for the 400 problem's detail.
func ParseKey(value string) (string, error) {
	text := strings.Trim(value, " \t")
	var key string
	if strings.HasPrefix(text, `"`) {
		var err error
		if key, err = parseQuoted(text); err != nil {
			return "", err
		}
	} else {
		for i := 0; i < len(text); i++ {
			if !isPrintableASCII(text[i]) {
				return "", invalidKey(nonASCIIDetail(text[i]))
			}
		}
		key = text
	}
	if len(key) < 1 || len(key) > MaxKeyBytes {
		return "", invalidKey(fmt.Sprintf("An Idempotency-Key must be 1 to %d bytes long.", MaxKeyBytes))
	}
	return key, nil
}

// ReadKey reads the key of a request: the key, or missing (no
// Idempotency-Key field), or an error (an invalid field, or more than one).
func ReadKey(r *http.Request) (key string, missing bool, err error) {
	values := r.Header.Values("Idempotency-Key")
	switch len(values) {
	case 0:
		return "", true, nil
	case 1:
		key, err = ParseKey(values[0])
		return key, false, err
	default:
		return "", false, invalidKey("Send one Idempotency-Key field, not several.")
	}
}
