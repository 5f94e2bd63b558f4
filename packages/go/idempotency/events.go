package idempotency

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log"
	"net/http"
	"strings"
)

// Logger receives what the middleware reports: each keyed request's
// outcome and the errors its default ErrorHandler answers. A *slog.Logger
// (Go 1.21 and later) is one; so is StdLogger's.
//
// Records carry the message and key-value pairs: "event" (stored,
// replayed, conflict, mismatch, gone, not-stored, invalid-key,
// principal-required), "key_ref" (KeyRef of the database key: never the
// client's key, nor the body), "status", "method", "path" (without the
// query string), and "reason" (why a response was not stored, or why a
// key was refused) or "error".
type Logger interface {
	Info(msg string, args ...interface{})
	Warn(msg string, args ...interface{})
	Error(msg string, args ...interface{})
}

// KeyRef is the key_ref of the records: the first 16 hex digits of
// SHA-256 over the database key (ScopedKey), so that the records of one
// key match and the key stays out of the logs.
func KeyRef(databaseKey string) string {
	sum := sha256.Sum256([]byte(databaseKey))
	return hex.EncodeToString(sum[:])[:16]
}

// StdLogger writes every record to l (log.Default() when nil), one line
// each: "idempotency: replayed the stored response event=replayed ...".
func StdLogger(l *log.Logger) Logger {
	return stdLogger{l, true}
}

// The default Logger: warnings and errors to the standard logger, the
// outcomes of every day (Info) left out.
var defaultLogger Logger = stdLogger{nil, false}

type stdLogger struct {
	l    *log.Logger
	info bool
}

func (s stdLogger) Info(msg string, args ...interface{}) {
	if s.info {
		s.write("INFO", msg, args)
	}
}
func (s stdLogger) Warn(msg string, args ...interface{})  { s.write("WARN", msg, args) }
func (s stdLogger) Error(msg string, args ...interface{}) { s.write("ERROR", msg, args) }

func (s stdLogger) write(level, msg string, args []interface{}) {
	var line strings.Builder
	fmt.Fprintf(&line, "%s %s", level, msg)
	for i := 0; i+1 < len(args); i += 2 {
		fmt.Fprintf(&line, " %v=%q", args[i], fmt.Sprint(args[i+1]))
	}
	l := s.l
	if l == nil {
		l = log.Default()
	}
	l.Print(line.String())
}

// An outcome the middleware reports.
type outcome struct {
	event, message string
	warn           bool
}

var (
	outcomeStored     = outcome{"stored", "idempotency: stored the response with its work", false}
	outcomeReplayed   = outcome{"replayed", "idempotency: replayed the stored response", false}
	outcomeConflict   = outcome{"conflict", "idempotency: refused: another request with this key is in progress (409)", false}
	outcomeGone       = outcome{"gone", "idempotency: refused: this request already ran and its response expired (410)", false}
	outcomeMismatch   = outcome{"mismatch", "idempotency: refused: the key was used for another request (422)", true}
	outcomeNotStored  = outcome{"not-stored", "idempotency: not stored: rolled back", false}
	outcomeNoScope    = outcome{"principal-required", "idempotency: refused: no principal (401)", false}
	outcomeInvalidKey = outcome{"invalid-key", "idempotency: refused: a malformed or missing key (400)", false}
)

// report hands an outcome to the Logger: Warn for a mismatch and for what
// the application should look at (a scope that panicked, a response it
// cannot store), Info otherwise.
func (s *settings) report(r *http.Request, o outcome, databaseKey string, status int, reason string, err error) {
	args := []interface{}{"event", o.event}
	if databaseKey != "" {
		args = append(args, "key_ref", KeyRef(databaseKey))
	}
	if status != 0 {
		args = append(args, "status", status)
	}
	args = append(args, "method", r.Method, "path", r.URL.Path)
	if reason != "" {
		args = append(args, "reason", reason)
	}
	if err != nil {
		args = append(args, "error", err.Error())
	}
	if o.warn || err != nil || reason == "response-too-large" || reason == "storing-failed" {
		s.Logger.Warn(o.message, args...)
	} else {
		s.Logger.Info(o.message, args...)
	}
}

// logError is what the default ErrorHandler records of the error it
// answers with a bare 500.
func (s *settings) logError(r *http.Request, err error) {
	args := []interface{}{"method", r.Method, "path", r.URL.Path, "error", err.Error()}
	if info, ok := InfoFrom(r.Context()); ok && info.DatabaseKey != "" {
		args = append([]interface{}{"key_ref", KeyRef(info.DatabaseKey)}, args...)
	}
	s.Logger.Error("idempotency: answered 500 Internal Server Error", args...)
}
