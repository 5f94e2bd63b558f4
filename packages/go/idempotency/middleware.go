package idempotency

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"runtime"
	"strconv"
	"time"

	"github.com/jackc/pgx/v4"
)

// Options configure Middleware and Handle. One of DB and DBFor, and one of
// Scope and SharedKeys, are required; the zero value of every other field
// is the default of the Node and Python packages.
type Options struct {
	// DB begins each request's transaction: a *pgxpool.Pool.
	DB TxBeginner
	// DBFor, instead of DB, returns the database of each request: a pool
	// made after the routes were (at startup), or one per tenant. An
	// error, or a nil database, goes to ErrorHandler; nothing runs.
	DBFor func(r *http.Request) (TxBeginner, error)
	// Scope names the request's principal (the user, API client or tenant
	// it comes from; never a value the client chooses unchecked): each
	// principal's keys are its own. "" means no principal: 401
	// principal-required, the handler does not run. A Scope that panics
	// with a runtime error (userOf(r).ID without a user: a nil pointer; a
	// failed type assertion) means no principal too: 401, and the panic is
	// logged as a warning; any other panic goes on. An integer principal is
	// written in decimal.
	Scope func(r *http.Request) string
	// SharedKeys, instead of Scope, shares the route's keys between every
	// client (one trusted caller, an internal route).
	SharedKeys bool
	// Optional lets requests without an Idempotency-Key through: they run
	// in a transaction with no claim (by default they get 400
	// missing-idempotency-key).
	Optional bool
	// ReplayHeaders are the response headers stored and replayed besides
	// Content-Type (default Location and ETag). A replay hands them to
	// whoever retries with the key: never name Set-Cookie or tokens.
	ReplayHeaders []string
	// StoreValidationErrors stores the ValidationStatuses (default 400 and
	// 422), which are otherwise rolled back so a fixed request can reuse
	// its key.
	StoreValidationErrors bool
	ValidationStatuses    []int
	// WaitTimeout, when not zero, lets a claim wait that long for another
	// transaction holding the key (then replay its answer) instead of
	// answering 409 at once.
	WaitTimeout time.Duration
	// TTL, when not zero, is how long the request's key is kept and
	// replayed: idempotency.ttl for the request's transaction, set before
	// the claim. At least a microsecond; the database refuses one over
	// idempotency.max_ttl (ErrorHandler, nothing runs).
	TTL time.Duration
	// RetryAfter is the Retry-After of a 409 (default 1 s).
	RetryAfter time.Duration
	// MaxBodyBytes limits a response held back for storing (default 1 MiB):
	// over it, 500 response-too-large and nothing commits.
	MaxBodyBytes int
	// MaxRequestBytes limits the request body read for the fingerprint
	// (default 1 MiB): over it, 413 request-too-large.
	MaxRequestBytes int64
	// ProblemBase prefixes the problem types (default DefaultProblemBase).
	ProblemBase string
	// ErrorHandler answers a handler's error and the package's own errors
	// (a failed BEGIN, COMMIT, a stored document that is not a response);
	// nothing it writes is stored. Default: 500 Internal Server Error, and
	// the error to Logger.Error.
	ErrorHandler func(w http.ResponseWriter, r *http.Request, err error)
	// Logger gets each keyed request's outcome (Info; a mismatch, a scope
	// that panicked and a response too large to store: Warn) and the
	// default ErrorHandler's errors (Error). A *slog.Logger is one. Default:
	// warnings and errors to the standard log package.
	Logger Logger
}

// DefaultProblemBase is the default of Options.ProblemBase: problem types
// a client can rely on whatever host serves the API (a URN needs none).
const DefaultProblemBase = "urn:idempotency:problem:"

// HandlerFunc is a handler that may fail: an error it returns rolls the
// request's transaction back, drops what it wrote and goes to
// Options.ErrorHandler.
type HandlerFunc func(w http.ResponseWriter, r *http.Request) error

// ErrResponseTooLarge is what a handler's Write returns once its response
// is over Options.MaxBodyBytes.
var ErrResponseTooLarge = errors.New("idempotency: the response is too large to store for replay")

// ErrTxOwned is what Commit and Rollback of the request's transaction
// return: the package ends it with the response.
var ErrTxOwned = errors.New("idempotency: the request's transaction belongs to the middleware, which commits or rolls it back with the response")

type settings struct {
	Options
	storedHeaders []string // canonical names: Content-Type and ReplayHeaders
}

func settingsOf(options Options) *settings {
	if (options.DB == nil) == (options.DBFor == nil) {
		panic("idempotency.Middleware: set Options.DB to begin transactions (a *pgxpool.Pool), " +
			"or Options.DBFor to return the database of each request; one of them, not both")
	}
	if options.TTL < 0 || (options.TTL > 0 && options.TTL < time.Microsecond) {
		panic(fmt.Sprintf("idempotency.Middleware: Options.TTL must be zero (the database's idempotency.ttl) "+
			"or at least a microsecond, not %v", options.TTL))
	}
	if options.Scope == nil && !options.SharedKeys {
		panic("idempotency.Middleware: Options.Scope must name the principal of a request, as in " +
			"Scope: func(r *http.Request) string { return userOf(r).ID }, so that one client's keys never " +
			"reach another's responses; SharedKeys: true shares the route's keys between every client")
	}
	if options.Scope != nil && options.SharedKeys {
		panic("idempotency.Middleware: set Options.Scope or Options.SharedKeys, not both")
	}
	s := &settings{Options: options}
	if s.ReplayHeaders == nil {
		s.ReplayHeaders = []string{"Location", "ETag"}
	}
	if s.RetryAfter <= 0 {
		s.RetryAfter = time.Second
	}
	if s.MaxBodyBytes <= 0 {
		s.MaxBodyBytes = 1 << 20
	}
	if s.MaxRequestBytes <= 0 {
		s.MaxRequestBytes = 1 << 20
	}
	if s.ProblemBase == "" {
		s.ProblemBase = DefaultProblemBase
	}
	if s.Logger == nil {
		s.Logger = defaultLogger
	}
	if s.ErrorHandler == nil {
		// The client learns nothing of the error; the log does.
		s.ErrorHandler = func(w http.ResponseWriter, r *http.Request, err error) {
			s.logError(r, err)
			http.Error(w, http.StatusText(http.StatusInternalServerError), http.StatusInternalServerError)
		}
	}
	s.storedHeaders = []string{"Content-Type"}
	for _, name := range s.ReplayHeaders {
		s.storedHeaders = append(s.storedHeaders, http.CanonicalHeaderKey(name))
	}
	return s
}

// Middleware makes the handlers it wraps safe to retry with an
// Idempotency-Key header. For a request with a key, it opens a
// transaction, claims the key and runs the handler with the transaction in
// the request's context (Tx). It holds back what the handler writes; once
// the handler returns, it stores the response (when the storing policy
// says so) and commits, then sends it. A handler that panics never
// commits: the transaction rolls back and the panic goes on.
//
// It panics when the options lack DB or a scope.
func Middleware(options Options) func(http.Handler) http.Handler {
	s := settingsOf(options)
	return func(next http.Handler) http.Handler {
		return &route{s, func(w http.ResponseWriter, r *http.Request) error {
			next.ServeHTTP(w, r)
			return nil
		}}
	}
}

// Handle is Middleware for a handler that returns an error: an error rolls
// back, nothing the handler wrote is sent, and Options.ErrorHandler
// answers.
func Handle(options Options, handler HandlerFunc) http.Handler {
	return &route{settingsOf(options), handler}
}

type route struct {
	s       *settings
	handler HandlerFunc
}

type contextKey int

const (
	txKey contextKey = iota
	infoKey
)

// Tx is the request's transaction in a handler that Middleware or Handle
// runs (nil elsewhere). The middleware commits or rolls it back: its
// Commit and Rollback return ErrTxOwned.
func Tx(ctx context.Context) pgx.Tx {
	tx, _ := ctx.Value(txKey).(pgx.Tx)
	return tx
}

// Info is what the middleware knows of a request: the client's Key ("" on
// an Optional route without one), its Scope ("" for SharedKeys), the key
// the database holds (DatabaseKey) and the request's fingerprint.
type Info struct {
	Key, Scope, DatabaseKey, RequestHash string
}

// InfoFrom is the Info of the request whose context ctx is.
func InfoFrom(ctx context.Context) (Info, bool) {
	info, ok := ctx.Value(infoKey).(Info)
	return info, ok
}

// ownedTx is the request's transaction as the handler sees it.
type ownedTx struct{ pgx.Tx }

func (ownedTx) Commit(context.Context) error   { return ErrTxOwned }
func (ownedTx) Rollback(context.Context) error { return ErrTxOwned }

type problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
}

func (s *settings) sendProblem(w http.ResponseWriter, status int, kind, title, detail string) {
	var buffer bytes.Buffer
	encoder := json.NewEncoder(&buffer)
	encoder.SetEscapeHTML(false)
	_ = encoder.Encode(problem{s.ProblemBase + kind, title, status, detail})
	w.Header().Set("Content-Type", "application/problem+json")
	writeBody(w, status, bytes.TrimSuffix(buffer.Bytes(), []byte("\n")))
}

func (s *settings) answerClaimError(w http.ResponseWriter, r *http.Request, err error) {
	switch {
	case errors.Is(err, ErrKeyInProgress):
		seconds := strconv.FormatInt(int64((s.RetryAfter+time.Second-1)/time.Second), 10)
		w.Header().Set("Retry-After", seconds)
		s.sendProblem(w, http.StatusConflict, "request-in-progress",
			"A request with this Idempotency-Key is still being processed",
			fmt.Sprintf("Retry the same request with the same key after %s s.", seconds))
	case errors.Is(err, ErrKeyGone):
		s.sendProblem(w, http.StatusGone, "request-already-ran",
			"This request already ran; its response is no longer kept",
			"A request with this Idempotency-Key was processed before and its response has expired; "+
				"it is not run again.")
	case errors.Is(err, ErrKeyReused):
		s.sendProblem(w, http.StatusUnprocessableEntity, "idempotency-key-reused",
			"Idempotency-Key reused with a different request",
			"This key was used for another request; use a new key for a new request.")
	case errors.Is(err, ErrInvalidKey):
		s.sendProblem(w, http.StatusBadRequest, "invalid-idempotency-key", "Invalid Idempotency-Key", err.Error())
	default:
		s.ErrorHandler(w, r, err)
	}
}

// dbOf is the database of the request: DB, or what DBFor returns.
func (s *settings) dbOf(r *http.Request) (TxBeginner, error) {
	if s.DBFor == nil {
		return s.DB, nil
	}
	db, err := s.DBFor(r)
	if err == nil && isNil(db) {
		err = errors.New("idempotency: Options.DBFor returned no database: is the pool made yet?")
	}
	return db, err
}

// isNil sees a nil pointer inside an interface too (a *pgxpool.Pool not
// yet made).
func isNil(db TxBeginner) bool {
	if db == nil {
		return true
	}
	value := reflect.ValueOf(db)
	return value.Kind() == reflect.Ptr && value.IsNil()
}

// principalOf is the request's scope. A Scope that panics with a runtime
// error (userOf(r).ID without a user) gives none, and the panic as an
// error; any other panic is a fault, not an answer about the client, and
// goes on.
func (s *settings) principalOf(r *http.Request) (scope string, failure error) {
	defer func() {
		if p := recover(); p != nil {
			runtimeError, ok := p.(runtime.Error)
			if !ok {
				panic(p)
			}
			scope, failure = "", fmt.Errorf("idempotency: Options.Scope panicked: %w", runtimeError)
		}
	}()
	return s.Scope(r), nil
}

// claimOutcome is the outcome reported for the claim's errors.
func claimOutcome(err error) (outcome, int, bool) {
	switch {
	case errors.Is(err, ErrKeyInProgress):
		return outcomeConflict, http.StatusConflict, true
	case errors.Is(err, ErrKeyGone):
		return outcomeGone, http.StatusGone, true
	case errors.Is(err, ErrKeyReused):
		return outcomeMismatch, http.StatusUnprocessableEntity, true
	case errors.Is(err, ErrInvalidKey):
		return outcomeInvalidKey, http.StatusBadRequest, true
	}
	return outcome{}, 0, false
}

// readBody reads the request body whole (nil when over limit).
func readBody(r *http.Request, limit int64) ([]byte, error) {
	if r.Body == nil || r.Body == http.NoBody {
		return []byte{}, nil
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(body)) > limit {
		return nil, nil
	}
	return body, nil
}

func (rt *route) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s := rt.s
	key, missing, err := ReadKey(r)
	if err != nil {
		s.report(r, outcomeInvalidKey, "", http.StatusBadRequest, err.Error(), nil)
		s.sendProblem(w, http.StatusBadRequest, "invalid-idempotency-key", "Invalid Idempotency-Key", err.Error())
		return
	}
	if missing && !s.Optional {
		s.report(r, outcomeInvalidKey, "", http.StatusBadRequest, "no Idempotency-Key header", nil)
		s.sendProblem(w, http.StatusBadRequest, "missing-idempotency-key", "Missing Idempotency-Key header",
			"Send a unique Idempotency-Key with this request and repeat it on retries.")
		return
	}
	info := Info{Key: key, DatabaseKey: key}
	if !missing && !s.SharedKeys {
		var failure error
		info.Scope, failure = s.principalOf(r)
		if info.Scope == "" {
			s.report(r, outcomeNoScope, "", http.StatusUnauthorized, "", failure)
			s.sendProblem(w, http.StatusUnauthorized, "principal-required", "Request without a principal",
				"This route keeps the Idempotency-Keys of each client apart and could not tell who sent this request.")
			return
		}
		info.DatabaseKey, _ = ScopedKey(info.Scope, key)
	}

	body, err := readBody(r, s.MaxRequestBytes)
	if err != nil {
		s.ErrorHandler(w, r, err)
		return
	}
	if body == nil {
		s.sendProblem(w, http.StatusRequestEntityTooLarge, "request-too-large", "Request body too large",
			fmt.Sprintf("A request to this route may have at most %d bytes of body.", s.MaxRequestBytes))
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	info.RequestHash = RequestFingerprint(r, body)

	ctx := r.Context()
	db, err := s.dbOf(r)
	if err != nil {
		s.ErrorHandler(w, r, err)
		return
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		s.ErrorHandler(w, r, err)
		return
	}
	if !missing {
		if err := s.setTransactionSettings(ctx, tx); err != nil {
			_ = tx.Rollback(context.Background())
			s.ErrorHandler(w, r, err)
			return
		}
		claimed, err := Claim(ctx, tx, info.DatabaseKey, info.RequestHash)
		if err != nil {
			_ = tx.Rollback(context.Background())
			if o, status, ok := claimOutcome(err); ok {
				s.report(r, o, info.DatabaseKey, status, "", nil)
			}
			s.answerClaimError(w, r, err)
			return
		}
		if claimed.Replayed {
			if err := tx.Commit(context.Background()); err != nil {
				s.ErrorHandler(w, r, err)
				return
			}
			document, err := ParseStoredDocument(claimed.Response)
			if err == nil {
				err = Replay(w, document)
			}
			if err != nil {
				s.ErrorHandler(w, r, err)
				return
			}
			s.report(r, outcomeReplayed, info.DatabaseKey, document.Status, "", nil)
			return
		}
	}
	rt.run(w, r.WithContext(context.WithValue(context.WithValue(ctx, txKey, pgx.Tx(ownedTx{tx})), infoKey, info)),
		tx, info, missing)
}

// setTransactionSettings sets the route's WaitTimeout and TTL for the
// request's transaction, before the claim.
func (s *settings) setTransactionSettings(ctx context.Context, tx pgx.Tx) error {
	if s.WaitTimeout != 0 {
		if err := SetWaitTimeout(ctx, tx, s.WaitTimeout); err != nil {
			return err
		}
	}
	if s.TTL != 0 {
		return SetTTL(ctx, tx, s.TTL)
	}
	return nil
}

// run runs the handler on a captured response, then stores and commits, or
// rolls back, and sends.
func (rt *route) run(w http.ResponseWriter, r *http.Request, tx pgx.Tx, info Info, missing bool) {
	s := rt.s
	capture := newCapture(w.Header(), s.MaxBodyBytes)
	ended := false
	notStored := func(reason string, status int) {
		if !missing {
			s.report(r, outcomeNotStored, info.DatabaseKey, status, reason, nil)
		}
	}
	defer func() {
		if !ended { // the handler panicked: nothing commits, the panic goes on
			_ = tx.Rollback(context.Background())
			notStored("handler-error", 0)
		}
	}()
	err := rt.handler(capture, r)
	ended = true
	background := context.Background()
	if err != nil {
		_ = tx.Rollback(background)
		notStored("handler-error", 0)
		s.ErrorHandler(w, r, err)
		return
	}
	if capture.overflowed {
		_ = tx.Rollback(background)
		notStored("response-too-large", http.StatusInternalServerError)
		s.sendProblem(w, http.StatusInternalServerError, "response-too-large", "Response too large to store",
			fmt.Sprintf("The response is larger than %d bytes and cannot be stored for replay; nothing was committed.",
				s.MaxBodyBytes))
		return
	}
	status := capture.status
	if status == 0 {
		status = http.StatusOK
	}
	body := capture.body.Bytes()
	header := capture.header
	// What net/http would send: a body without a Content-Type is sniffed.
	if _, typed := header["Content-Type"]; !typed && len(body) > 0 && bodyAllowed(status) {
		header.Set("Content-Type", http.DetectContentType(body))
	}
	reason := notStoredReason(status, s.StoreValidationErrors, s.ValidationStatuses)
	stored := reason == ""
	if stored && !missing {
		replayable := http.Header{}
		for _, name := range s.storedHeaders {
			if values, ok := header[name]; ok {
				replayable[name] = values
			}
		}
		err = Complete(background, tx, info.DatabaseKey, NewStoredDocument(status, replayable, body))
	}
	if err == nil {
		if stored {
			err = tx.Commit(background)
		} else {
			err = tx.Rollback(background)
		}
	}
	if err != nil {
		_ = tx.Rollback(background)
		notStored("storing-failed", status)
		s.ErrorHandler(w, r, err)
		return
	}
	if stored && !missing {
		s.report(r, outcomeStored, info.DatabaseKey, status, "", nil)
	} else {
		notStored(reason, status)
	}
	target := w.Header()
	for name := range target {
		delete(target, name)
	}
	for name, values := range header {
		target[name] = values
	}
	writeBody(w, status, body)
}

// capture holds back what a handler writes.
type capture struct {
	header     http.Header
	status     int
	body       bytes.Buffer
	max        int
	overflowed bool
}

func newCapture(initial http.Header, max int) *capture {
	return &capture{header: initial.Clone(), max: max}
}

func (c *capture) Header() http.Header { return c.header }

func (c *capture) WriteHeader(status int) {
	if c.status != 0 || (status >= 100 && status < 200) {
		return
	}
	if status < 100 || status > 999 {
		panic(fmt.Sprintf("invalid WriteHeader code %v", status))
	}
	c.status = status
}

func (c *capture) Write(p []byte) (int, error) {
	if c.status == 0 {
		c.WriteHeader(http.StatusOK)
	}
	if c.overflowed {
		return 0, ErrResponseTooLarge
	}
	if c.body.Len()+len(p) > c.max {
		c.overflowed = true
		c.body = bytes.Buffer{}
		return 0, ErrResponseTooLarge
	}
	return c.body.Write(p)
}

// WriteString lets io.WriteString write without a copy.
func (c *capture) WriteString(text string) (int, error) {
	return c.Write([]byte(text))
}

// Flush does nothing: the response is sent after the commit.
func (c *capture) Flush() {}
