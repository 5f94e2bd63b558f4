package idempotency

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"math"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// The request fingerprint, shared with the Node and Python packages: two
// requests are the same request for a key when their fingerprints are
// equal. It is the lower-case hex SHA-256 of
//
//	METHOD "\n" path [ "?" query ] "\n" body
//
//   - METHOD: the request method, upper case;
//   - path: the request path, percent-decoded, as bytes;
//   - query: the query string exactly as sent (present only when not empty);
//   - body: for a JSON media type (application/json, or any type ending in
//     +json) that parses, the canonical JSON of the parsed value (object
//     members sorted by their names' UTF-16 code units, no whitespace,
//     numbers and strings written as JavaScript's JSON.stringify writes
//     them), in UTF-8; otherwise the body's bytes as received (empty when
//     none).
//
// A JSON body is read as JavaScript's JSON.parse reads it, one leading byte
// order mark dropped, every number an IEEE double; a body that is not valid
// UTF-8 is not JSON (its bytes are hashed).

// Fingerprint is the fingerprint of a request given as its parts.
// requestTarget is the request line's target ("/path?query", as
// http.Request.RequestURI has it), body the body's bytes.
func Fingerprint(method, requestTarget, contentType string, body []byte) string {
	path, query := requestTarget, ""
	if i := strings.IndexByte(requestTarget, '?'); i >= 0 {
		path, query = requestTarget[:i], requestTarget[i+1:]
	}
	hash := sha256.New()
	hash.Write([]byte(strings.ToUpper(method) + "\n"))
	hash.Write(percentDecode(path))
	if query != "" {
		hash.Write([]byte("?" + query))
	}
	hash.Write([]byte("\n"))
	hash.Write(bodyPart(contentType, body))
	return hex.EncodeToString(hash.Sum(nil))
}

// RequestFingerprint is the fingerprint of a request whose body was read
// into body.
func RequestFingerprint(r *http.Request, body []byte) string {
	return Fingerprint(r.Method, requestTarget(r), r.Header.Get("Content-Type"), body)
}

func requestTarget(r *http.Request) string {
	if r.RequestURI != "" {
		return r.RequestURI
	}
	return r.URL.RequestURI()
}

// IsJSONMediaType says whether a Content-Type is JSON: application/json or
// any type ending in +json.
func IsJSONMediaType(contentType string) bool {
	media := strings.ToLower(strings.TrimSpace(strings.SplitN(contentType, ";", 2)[0]))
	return media == "application/json" || strings.HasSuffix(media, "+json")
}

func isHex(b byte) bool {
	return (b >= '0' && b <= '9') || (b >= 'A' && b <= 'F') || (b >= 'a' && b <= 'f')
}

// percentDecode: "%41%2F" -> the bytes 0x41 0x2F; a '%' not followed by two
// hex digits stays as it is.
func percentDecode(s string) []byte {
	out := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		if s[i] == '%' && i+2 < len(s) && isHex(s[i+1]) && isHex(s[i+2]) {
			n, _ := strconv.ParseUint(s[i+1:i+3], 16, 8)
			out = append(out, byte(n))
			i += 2
		} else {
			out = append(out, s[i])
		}
	}
	return out
}

func bodyPart(contentType string, body []byte) []byte {
	if IsJSONMediaType(contentType) {
		if canonical, err := CanonicalJSON(body); err == nil {
			return canonical
		}
	}
	return body
}

// CanonicalJSON is the canonical form of a JSON text: the value JSON.parse
// makes of it, written with object members sorted by their names' UTF-16
// code units and no whitespace, as the fingerprint hashes it. An error when
// the text is not JSON.
func CanonicalJSON(text []byte) ([]byte, error) {
	// JSON is UTF-8: a text that is not is no JSON (decoding it with
	// replacement characters would make two different bodies one).
	if !utf8.Valid(text) {
		return nil, errors.New("idempotency: not UTF-8")
	}
	units := decodeUTF8(text)
	if len(units) > 0 && units[0] == 0xfeff {
		units = units[1:]
	}
	p := &jsonParser{s: units}
	p.space()
	var out []byte
	out, err := p.value(out)
	if err != nil {
		return nil, err
	}
	p.space()
	if p.i != len(p.s) {
		return nil, errNotJSON
	}
	return out, nil
}

// decodeUTF8 is text as a JavaScript string holds it: UTF-16 code units.
// CanonicalJSON has checked that it is UTF-8.
func decodeUTF8(b []byte) []uint16 {
	return utf16.Encode([]rune(string(b)))
}

var errNotJSON = errors.New("not JSON")

// jsonParser reads JSON as JSON.parse does, from UTF-16 code units, and
// writes the canonical form as it goes (objects are collected, sorted and
// written when they close).
type jsonParser struct {
	s []uint16
	i int
}

func (p *jsonParser) space() {
	for p.i < len(p.s) {
		switch p.s[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

func (p *jsonParser) literal(word string) bool {
	if p.i+len(word) > len(p.s) {
		return false
	}
	for k := 0; k < len(word); k++ {
		if p.s[p.i+k] != uint16(word[k]) {
			return false
		}
	}
	p.i += len(word)
	return true
}

func (p *jsonParser) value(out []byte) ([]byte, error) {
	if p.i >= len(p.s) {
		return nil, errNotJSON
	}
	switch c := p.s[p.i]; {
	case c == '{':
		return p.object(out)
	case c == '[':
		return p.array(out)
	case c == '"':
		units, err := p.str()
		if err != nil {
			return nil, err
		}
		return appendJSString(out, units), nil
	case c == '-' || (c >= '0' && c <= '9'):
		return p.number(out)
	case p.literal("true"):
		return append(out, "true"...), nil
	case p.literal("false"):
		return append(out, "false"...), nil
	case p.literal("null"):
		return append(out, "null"...), nil
	}
	return nil, errNotJSON
}

func (p *jsonParser) array(out []byte) ([]byte, error) {
	p.i++ // [
	out = append(out, '[')
	p.space()
	if p.i < len(p.s) && p.s[p.i] == ']' {
		p.i++
		return append(out, ']'), nil
	}
	for first := true; ; first = false {
		if !first {
			out = append(out, ',')
		}
		p.space()
		var err error
		if out, err = p.value(out); err != nil {
			return nil, err
		}
		p.space()
		if p.i >= len(p.s) {
			return nil, errNotJSON
		}
		switch p.s[p.i] {
		case ',':
			p.i++
		case ']':
			p.i++
			return append(out, ']'), nil
		default:
			return nil, errNotJSON
		}
	}
}

type member struct {
	name  []uint16
	value []byte
}

func lessUTF16(a, b []uint16) bool {
	for k := 0; k < len(a) && k < len(b); k++ {
		if a[k] != b[k] {
			return a[k] < b[k]
		}
	}
	return len(a) < len(b)
}

func (p *jsonParser) object(out []byte) ([]byte, error) {
	p.i++ // {
	var members []member
	index := map[string]int{} // a name's place in members: the last value wins
	p.space()
	if p.i < len(p.s) && p.s[p.i] == '}' {
		p.i++
		return append(out, "{}"...), nil
	}
	for {
		p.space()
		if p.i >= len(p.s) || p.s[p.i] != '"' {
			return nil, errNotJSON
		}
		name, err := p.str()
		if err != nil {
			return nil, err
		}
		p.space()
		if p.i >= len(p.s) || p.s[p.i] != ':' {
			return nil, errNotJSON
		}
		p.i++
		p.space()
		value, err := p.value(nil)
		if err != nil {
			return nil, err
		}
		id := string(utf16Bytes(name))
		if k, ok := index[id]; ok {
			members[k].value = value
		} else {
			index[id] = len(members)
			members = append(members, member{name, value})
		}
		p.space()
		if p.i >= len(p.s) {
			return nil, errNotJSON
		}
		if p.s[p.i] == ',' {
			p.i++
			continue
		}
		if p.s[p.i] != '}' {
			return nil, errNotJSON
		}
		p.i++
		break
	}
	sort.Slice(members, func(a, b int) bool { return lessUTF16(members[a].name, members[b].name) })
	out = append(out, '{')
	for k, m := range members {
		if k > 0 {
			out = append(out, ',')
		}
		out = appendJSString(out, m.name)
		out = append(out, ':')
		out = append(out, m.value...)
	}
	return append(out, '}'), nil
}

func utf16Bytes(units []uint16) []byte {
	b := make([]byte, 0, 2*len(units))
	for _, u := range units {
		b = append(b, byte(u>>8), byte(u))
	}
	return b
}

func hexValue(u uint16) (uint16, bool) {
	switch {
	case u >= '0' && u <= '9':
		return u - '0', true
	case u >= 'a' && u <= 'f':
		return u - 'a' + 10, true
	case u >= 'A' && u <= 'F':
		return u - 'A' + 10, true
	}
	return 0, false
}

// str reads a string literal into its code units (lone surrogates kept).
func (p *jsonParser) str() ([]uint16, error) {
	p.i++ // "
	var units []uint16
	for p.i < len(p.s) {
		c := p.s[p.i]
		p.i++
		switch {
		case c == '"':
			return units, nil
		case c < 0x20:
			return nil, errNotJSON
		case c != '\\':
			units = append(units, c)
			continue
		}
		if p.i >= len(p.s) {
			return nil, errNotJSON
		}
		e := p.s[p.i]
		p.i++
		switch e {
		case '"', '\\', '/':
			units = append(units, e)
		case 'b':
			units = append(units, '\b')
		case 'f':
			units = append(units, '\f')
		case 'n':
			units = append(units, '\n')
		case 'r':
			units = append(units, '\r')
		case 't':
			units = append(units, '\t')
		case 'u':
			if p.i+4 > len(p.s) {
				return nil, errNotJSON
			}
			var v uint16
			for k := 0; k < 4; k++ {
				h, ok := hexValue(p.s[p.i+k])
				if !ok {
					return nil, errNotJSON
				}
				v = v<<4 | h
			}
			p.i += 4
			units = append(units, v)
		default:
			return nil, errNotJSON
		}
	}
	return nil, errNotJSON
}

func isDigit(u uint16) bool { return u >= '0' && u <= '9' }

// number reads a JSON number as a double and writes it as JavaScript does.
func (p *jsonParser) number(out []byte) ([]byte, error) {
	start := p.i
	if p.s[p.i] == '-' {
		p.i++
	}
	switch {
	case p.i < len(p.s) && p.s[p.i] == '0':
		p.i++
	case p.i < len(p.s) && isDigit(p.s[p.i]):
		for p.i < len(p.s) && isDigit(p.s[p.i]) {
			p.i++
		}
	default:
		return nil, errNotJSON
	}
	if p.i < len(p.s) && p.s[p.i] == '.' {
		p.i++
		if p.i >= len(p.s) || !isDigit(p.s[p.i]) {
			return nil, errNotJSON
		}
		for p.i < len(p.s) && isDigit(p.s[p.i]) {
			p.i++
		}
	}
	if p.i < len(p.s) && (p.s[p.i] == 'e' || p.s[p.i] == 'E') {
		p.i++
		if p.i < len(p.s) && (p.s[p.i] == '+' || p.s[p.i] == '-') {
			p.i++
		}
		if p.i >= len(p.s) || !isDigit(p.s[p.i]) {
			return nil, errNotJSON
		}
		for p.i < len(p.s) && isDigit(p.s[p.i]) {
			p.i++
		}
	}
	text := make([]byte, 0, p.i-start)
	for _, u := range p.s[start:p.i] {
		text = append(text, byte(u))
	}
	// Correctly rounded, as JavaScript; out of range is ±Inf or ±0 with
	// ErrRange, which JavaScript gives too (Infinity is written null).
	value, err := strconv.ParseFloat(string(text), 64)
	var numErr *strconv.NumError
	if err != nil && !(errors.As(err, &numErr) && numErr.Err == strconv.ErrRange) {
		return nil, errNotJSON
	}
	return append(out, jsNumber(value)...), nil
}

// jsNumber writes a double as JSON.stringify does (Number::toString).
func jsNumber(v float64) string {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return "null"
	}
	if v == 0 {
		return "0"
	}
	sign := ""
	if v < 0 {
		sign, v = "-", -v
	}
	// The shortest digits that read back: d.ddde±x.
	e := strconv.FormatFloat(v, 'e', -1, 64)
	mark := strings.IndexByte(e, 'e')
	digits := strings.Replace(e[:mark], ".", "", 1)
	exponent, _ := strconv.Atoi(e[mark+1:])
	k, n := len(digits), exponent+1 // the decimal point's position
	var text string
	switch {
	case k <= n && n <= 21:
		text = digits + strings.Repeat("0", n-k)
	case 0 < n && n <= 21:
		text = digits[:n] + "." + digits[n:]
	case -6 < n && n <= 0:
		text = "0." + strings.Repeat("0", -n) + digits
	default:
		mantissa := digits
		if k > 1 {
			mantissa = digits[:1] + "." + digits[1:]
		}
		expSign := "+"
		if n-1 < 0 {
			expSign = "-"
		}
		text = mantissa + "e" + expSign + strconv.Itoa(abs(n-1))
	}
	return sign + text
}

func abs(n int) int {
	if n < 0 {
		return -n
	}
	return n
}

// appendJSString writes a string as JSON.stringify does, in UTF-8: the
// short escapes, \u00xx for other control characters, \udxxx for lone
// surrogates, everything else as it is.
func appendJSString(out []byte, units []uint16) []byte {
	const hexDigits = "0123456789abcdef"
	out = append(out, '"')
	for k := 0; k < len(units); k++ {
		u := units[k]
		switch {
		case u == '"':
			out = append(out, '\\', '"')
		case u == '\\':
			out = append(out, '\\', '\\')
		case u == '\b':
			out = append(out, '\\', 'b')
		case u == '\f':
			out = append(out, '\\', 'f')
		case u == '\n':
			out = append(out, '\\', 'n')
		case u == '\r':
			out = append(out, '\\', 'r')
		case u == '\t':
			out = append(out, '\\', 't')
		case u < 0x20:
			out = append(out, '\\', 'u', '0', '0', hexDigits[u>>4], hexDigits[u&0xf])
		case u >= 0xd800 && u <= 0xdbff && k+1 < len(units) && units[k+1] >= 0xdc00 && units[k+1] <= 0xdfff:
			out = utf8.AppendRune(out, utf16.DecodeRune(rune(u), rune(units[k+1])))
			k++
		case u >= 0xd800 && u <= 0xdfff:
			out = append(out, '\\', 'u', hexDigits[u>>12], hexDigits[(u>>8)&0xf], hexDigits[(u>>4)&0xf], hexDigits[u&0xf])
		default:
			out = utf8.AppendRune(out, rune(u))
		}
	}
	return append(out, '"')
}
