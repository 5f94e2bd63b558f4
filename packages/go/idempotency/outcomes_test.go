package idempotency

// The options for an application's start and its logs: a database
// resolved per request, a TTL per route, the records of every outcome and
// of the default ErrorHandler, a Scope that panics, and the problem
// types' default and override.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v4/pgxpool"
)

type record struct {
	level, msg string
	attrs      map[string]interface{}
}

// recorder is a Logger that keeps what it gets.
type recorder struct {
	mu      sync.Mutex
	records []record
}

func (l *recorder) add(level, msg string, args []interface{}) {
	attrs := map[string]interface{}{}
	for i := 0; i+1 < len(args); i += 2 {
		attrs[args[i].(string)] = args[i+1]
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.records = append(l.records, record{level, msg, attrs})
}

func (l *recorder) Info(msg string, args ...interface{})  { l.add("INFO", msg, args) }
func (l *recorder) Warn(msg string, args ...interface{})  { l.add("WARN", msg, args) }
func (l *recorder) Error(msg string, args ...interface{}) { l.add("ERROR", msg, args) }

// of is "LEVEL event status [reason]" of each record of a database key.
func (l *recorder) of(databaseKey string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var lines []string
	for _, r := range l.records {
		if r.attrs["key_ref"] != KeyRef(databaseKey) {
			continue
		}
		line := fmt.Sprintf("%s %v %v", r.level, r.attrs["event"], r.attrs["status"])
		if reason, ok := r.attrs["reason"]; ok {
			line += fmt.Sprintf(" %v", reason)
		}
		lines = append(lines, line)
	}
	return lines
}

func (l *recorder) all() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return fmt.Sprint(l.records)
}

// keyTTL is the state of a database key and its expires_at - created_at
// in seconds.
func keyTTL(t *testing.T, databaseKey string) (string, float64) {
	t.Helper()
	var state string
	var seconds *float64
	err := pool(t).QueryRow(context.Background(),
		"SELECT state, extract(epoch FROM expires_at - created_at)::float8 FROM idempotency.lookup($1)",
		databaseKey).Scan(&state, &seconds)
	if err != nil {
		t.Fatal(err)
	}
	if seconds == nil {
		return state, 0
	}
	return state, *seconds
}

func scoped(client, key string) string {
	databaseKey, _ := ScopedKey(client, key)
	return databaseKey
}

func TestDBForResolvesTheDatabasePerRequest(t *testing.T) {
	var mu sync.Mutex
	var later *pgxpool.Pool // made after the routes, as at an application's start
	logs := &recorder{}
	server := chargesServer(t, Options{Logger: logs, DBFor: func(r *http.Request) (TxBeginner, error) {
		mu.Lock()
		defer mu.Unlock()
		return later, nil
	}})
	key, item := newKey(), newKey()
	body := fmt.Sprintf(`{"item": %q}`, item)
	if a := order(t, server, key, "alice", body); a.status != 500 || charges(t, item) != 0 {
		t.Fatalf("before the pool is made: %d %s", a.status, a.body)
	}
	if !strings.Contains(logs.all(), "Options.DBFor returned no database") {
		t.Errorf("the missing pool was not logged: %s", logs.all())
	}
	mu.Lock()
	later = pool(t)
	mu.Unlock()
	if a := order(t, server, key, "alice", body); a.status != 201 {
		t.Fatalf("first: %d %s", a.status, a.body)
	}
	if a := order(t, server, key, "alice", body); a.header.Get("Idempotent-Replayed") != "true" || charges(t, item) != 1 {
		t.Errorf("retry: %d %v", a.status, a.header)
	}
	failing := errors.New("no tenant database")
	failed := chargesServer(t, Options{Logger: logs, DBFor: func(*http.Request) (TxBeginner, error) { return nil, failing }})
	if a := order(t, failed, newKey(), "alice", body); a.status != 500 || !strings.Contains(logs.all(), failing.Error()) {
		t.Errorf("DBFor's error: %d %s", a.status, logs.all())
	}
}

func TestARoutesTTLIsItsKeysTTL(t *testing.T) {
	for _, c := range []struct {
		ttl     time.Duration
		seconds float64
	}{{72 * time.Hour, 259200}, {1500 * time.Millisecond, 1.5}, {0, 86400}} {
		server := chargesServer(t, Options{TTL: c.ttl})
		key := newKey()
		if a := order(t, server, key, "alice", fmt.Sprintf(`{"item": %q}`, newKey())); a.status != 201 {
			t.Fatalf("TTL %v: %d %s", c.ttl, a.status, a.body)
		}
		if state, seconds := keyTTL(t, scoped("alice", key)); state != "done" || seconds != c.seconds {
			t.Errorf("TTL %v: %s, kept %v s, not %v", c.ttl, state, seconds, c.seconds)
		}
	}
	// The alternative for every route of a pool: the connections' setting.
	config, err := pgxpool.ParseConfig("")
	if err != nil {
		t.Fatal(err)
	}
	config.ConnConfig.RuntimeParams["idempotency.ttl"] = "48h"
	longer, err := pgxpool.ConnectConfig(context.Background(), config)
	if err != nil {
		t.Fatal(err)
	}
	defer longer.Close()
	key := newKey()
	if a := order(t, chargesServer(t, Options{DB: longer}), key, "alice", fmt.Sprintf(`{"item": %q}`, newKey())); a.status != 201 {
		t.Fatalf("RuntimeParams: %d %s", a.status, a.body)
	}
	if state, seconds := keyTTL(t, scoped("alice", key)); state != "done" || seconds != 48*3600 {
		t.Errorf("RuntimeParams: %s, kept %v s", state, seconds)
	}
	// Over idempotency.max_ttl (30 days): the database refuses it, nothing runs.
	logs := &recorder{}
	server := chargesServer(t, Options{TTL: 400 * 24 * time.Hour, Logger: logs})
	key = newKey()
	item := newKey()
	if a := order(t, server, key, "alice", fmt.Sprintf(`{"item": %q}`, item)); a.status != 500 || charges(t, item) != 0 {
		t.Errorf("over max_ttl: %d %s", a.status, a.body)
	}
	if state, _ := keyTTL(t, scoped("alice", key)); state != "absent" || !strings.Contains(logs.all(), "idempotency.ttl") {
		t.Errorf("over max_ttl: key %s, logged %s", state, logs.all())
	}
	for _, bad := range []time.Duration{-time.Second, 500 * time.Nanosecond} {
		func() {
			defer func() {
				if p := recover(); p == nil || !strings.Contains(fmt.Sprint(p), "Options.TTL") {
					t.Errorf("TTL %v: %v", bad, p)
				}
			}()
			Middleware(Options{DB: pool(t), SharedKeys: true, TTL: bad})
		}()
	}
}

func TestTheLoggerGetsEveryOutcomeWithTheKeyRefed(t *testing.T) {
	logs := &recorder{}
	server, entered, proceed := heldCharges(t, Options{DB: pool(t), Scope: byClient, Logger: logs},
		func(r *http.Request) bool { return r.URL.Query().Get("hold") != "" })
	key, item := newKey(), newKey()
	body := fmt.Sprintf(`{"item": %q}`, item)
	firstDone := make(chan answer)
	go func() { firstDone <- send(t, server, "/charges?hold=1", key, "alice", "application/json", body) }()
	<-entered
	if a := send(t, server, "/charges?hold=1", key, "alice", "application/json", body); a.status != 409 {
		t.Fatalf("duplicate: %d %s", a.status, a.body)
	}
	close(proceed)
	if a := <-firstDone; a.status != 201 {
		t.Fatalf("first: %d %s", a.status, a.body)
	}
	if a := send(t, server, "/charges?hold=1", key, "alice", "application/json", body); a.status != 201 {
		t.Fatalf("retry: %d %s", a.status, a.body)
	}
	if a := send(t, server, "/charges?hold=1", key, "alice", "application/json", `{"item": "other"}`); a.status != 422 {
		t.Fatalf("another request: %d %s", a.status, a.body)
	}
	want := []string{"INFO conflict 409", "INFO stored 201", "INFO replayed 201", "WARN mismatch 422"}
	if got := logs.of(scoped("alice", key)); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("records %v, want %v", got, want)
	}
	written := logs.all()
	if strings.Contains(written, key) || strings.Contains(written, item) || strings.Contains(written, "hold=1") {
		t.Errorf("a key, body or query in the records: %s", written)
	}
	if !strings.Contains(written, "path:/charges ") || !strings.Contains(written, "method:POST") {
		t.Errorf("records without method and path: %s", written)
	}
}

func TestTheLoggerSaysWhyAResponseWasNotStored(t *testing.T) {
	logs := &recorder{}
	server := serve(t, Handle(Options{DB: pool(t), Scope: byClient, Logger: logs, MaxBodyBytes: 64,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) { http.Error(w, "failed", 502) }},
		func(w http.ResponseWriter, r *http.Request) error {
			switch path := r.URL.Path; path {
			case "/error":
				return errors.New("declined")
			case "/panic":
				panic(http.ErrAbortHandler) // net/http's quiet panic
			case "/large":
				_, _ = w.Write(bytes.Repeat([]byte("x"), 100))
			default:
				var status int
				fmt.Sscan(strings.TrimPrefix(path, "/"), &status)
				w.WriteHeader(status)
			}
			return nil
		}))
	for path, want := range map[string]string{
		"/503": "INFO not-stored 503 server-error", "/429": "INFO not-stored 429 not-now",
		"/422": "INFO not-stored 422 validation", "/error": "INFO not-stored <nil> handler-error",
		"/panic": "INFO not-stored <nil> handler-error",
		"/large": "WARN not-stored 500 response-too-large",
	} {
		key := newKey()
		request, _ := http.NewRequest(http.MethodPost, server.URL+path, strings.NewReader("{}"))
		request.Header.Set("Idempotency-Key", key)
		request.Header.Set("X-Client", "bob")
		if response, err := http.DefaultClient.Do(request); err == nil { // a panic closes the connection
			response.Body.Close()
		}
		if got := logs.of(scoped("bob", key)); fmt.Sprint(got) != fmt.Sprint([]string{want}) {
			t.Errorf("%s: %v, want %s", path, got, want)
		}
	}
	// A late retry refused with 410.
	gone := chargesServer(t, Options{DB: shortLived{pool(t)}, Logger: logs})
	key := newKey()
	body := fmt.Sprintf(`{"item": %q}`, newKey())
	order(t, gone, key, "carol", body)
	waitUntilGone(t, scoped("carol", key))
	if a := order(t, gone, key, "carol", body); a.status != 410 {
		t.Fatalf("late retry: %d %s", a.status, a.body)
	}
	if got := logs.of(scoped("carol", key)); fmt.Sprint(got) != fmt.Sprint([]string{"INFO stored 201", "INFO gone 410"}) {
		t.Errorf("late retry: %v", got)
	}
}

func TestTheDefaultErrorHandlerLogsTheErrorItHides(t *testing.T) {
	logs := &recorder{}
	server := serve(t, Handle(Options{DB: pool(t), Scope: byClient, Logger: logs},
		func(w http.ResponseWriter, r *http.Request) error { return errors.New("the card was declined") }))
	key := newKey()
	a := send(t, server, "/charges", key, "alice", "application/json", "{}")
	if a.status != 500 || string(a.body) != "Internal Server Error\n" {
		t.Errorf("%d %s", a.status, a.body)
	}
	var logged *record
	for i, r := range logs.records {
		if r.level == "ERROR" {
			logged = &logs.records[i]
		}
	}
	if logged == nil || logged.attrs["error"] != "the card was declined" || logged.attrs["key_ref"] != KeyRef(scoped("alice", key)) {
		t.Fatalf("the hidden error was not logged: %s", logs.all())
	}
	// Without a Logger: warnings and errors go to the standard logger, the
	// every-day outcomes do not.
	var written bytes.Buffer
	output, flags := log.Writer(), log.Flags()
	log.SetOutput(&written)
	log.SetFlags(0)
	defer func() { log.SetOutput(output); log.SetFlags(flags) }()
	plain := serve(t, Handle(Options{DB: pool(t), Scope: byClient},
		func(w http.ResponseWriter, r *http.Request) error {
			if r.URL.Path == "/fails" {
				return errors.New("the card was declined")
			}
			w.WriteHeader(201)
			return nil
		}))
	send(t, plain, "/ok", newKey(), "alice", "application/json", "{}")
	send(t, plain, "/fails", newKey(), "alice", "application/json", "{}")
	lines := strings.Split(strings.TrimSpace(written.String()), "\n")
	if len(lines) != 1 || !strings.HasPrefix(lines[0], "ERROR idempotency: answered 500 Internal Server Error") ||
		!strings.Contains(lines[0], `error="the card was declined"`) {
		t.Errorf("the standard logger got %q", lines)
	}
}

type user struct{ ID string }

func userOf(r *http.Request) *user {
	if u, ok := r.Context().Value(userKey{}).(*user); ok {
		return u
	}
	return nil
}

type userKey struct{}

func TestTheLoggerGetsA400ForAMalformedOrMissingKeyWithItsReason(t *testing.T) {
	logs := &recorder{}
	server := chargesServer(t, Options{Logger: logs})
	tooLong := strings.Repeat("k", 256)
	for _, key := range []string{tooLong, ""} {
		if a := order(t, server, key, "alice", `{"item": "invalid key"}`); a.status != 400 {
			t.Fatalf("key %q: %d %s", key, a.status, a.body)
		}
	}
	var got []string
	for _, r := range logs.records {
		_, hasRef := r.attrs["key_ref"]
		got = append(got, fmt.Sprintf("%s %v %v %v %v ref=%v", r.level, r.attrs["event"], r.attrs["status"],
			r.attrs["path"], r.attrs["reason"], hasRef))
	}
	want := []string{
		"INFO invalid-key 400 /charges An Idempotency-Key must be 1 to 255 bytes long. ref=false",
		"INFO invalid-key 400 /charges no Idempotency-Key header ref=false",
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("records:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if strings.Contains(logs.all(), tooLong) {
		t.Errorf("the raw key is in the records: %s", logs.all())
	}
}

func TestAScopeThatPanicsWithARuntimeErrorIs401OtherPanicsGoOn(t *testing.T) {
	logs := &recorder{}
	server := chargesServer(t, Options{Logger: logs, Scope: func(r *http.Request) string { return userOf(r).ID }})
	item := newKey()
	a := order(t, server, newKey(), "", fmt.Sprintf(`{"item": %q}`, item))
	if got := a.problem(t); a.status != 401 || got["type"] != "urn:idempotency:problem:principal-required" {
		t.Errorf("%d %v", a.status, got)
	}
	if n := charges(t, item); n != 0 {
		t.Errorf("%d charges", n)
	}
	if len(logs.records) != 1 || logs.records[0].level != "WARN" || logs.records[0].attrs["event"] != "principal-required" ||
		!strings.Contains(fmt.Sprint(logs.records[0].attrs["error"]), "nil pointer") {
		t.Errorf("records: %s", logs.all())
	}
	// A panic of another kind is a fault: it goes on (net/http drops the
	// connection), nothing runs, no 401.
	failing := chargesServer(t, Options{Logger: logs, Scope: func(r *http.Request) string { panic("the user store is down") }})
	request, _ := http.NewRequest(http.MethodPost, failing.URL+"/charges", strings.NewReader(fmt.Sprintf(`{"item": %q}`, item)))
	request.Header.Set("Idempotency-Key", newKey())
	if response, err := http.DefaultClient.Do(request); err == nil {
		response.Body.Close()
		t.Errorf("another panic answered %d", response.StatusCode)
	}
	if n := charges(t, item); n != 0 || len(logs.records) != 1 {
		t.Errorf("%d charges, records %s", n, logs.all())
	}
}

func TestProblemTypesAreURNsUnlessTheRouteSetsProblemBase(t *testing.T) {
	if DefaultProblemBase != "urn:idempotency:problem:" {
		t.Errorf("DefaultProblemBase %q", DefaultProblemBase)
	}
	if got := order(t, chargesServer(t, Options{}), "", "alice", "{}").problem(t); got["type"] != "urn:idempotency:problem:missing-idempotency-key" {
		t.Errorf("default: %v", got)
	}
	own := chargesServer(t, Options{ProblemBase: "https://api.example.com/problems/"})
	if got := order(t, own, "", "alice", "{}").problem(t); got["type"] != "https://api.example.com/problems/missing-idempotency-key" {
		t.Errorf("ProblemBase: %v", got)
	}
}
