package idempotency_test

// The Go snippets of packages/go/README.md and of docs/frameworks.md's Go
// section are the regions of this file between "// snippet: NAME" and
// "// end snippet", run by the tests below; TestDocsQuoteTheSnippets checks
// that the docs quote them verbatim after a <!-- snippet: NAME --> line (and
// that no Go snippet there lacks one).

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v4/pgxpool"

	"idempotency/packages/go/idempotency"
)

type user struct{ ID string }

type userKey struct{}

// authenticate is the application's authentication: Authorization:
// Bearer <user> is that user.
func authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if name := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer "); name != r.Header.Get("Authorization") {
			r = r.WithContext(context.WithValue(r.Context(), userKey{}, &user{name}))
		}
		next.ServeHTTP(w, r)
	})
}

// userOf is the authenticated user (nil without one).
func userOf(r *http.Request) *user {
	u, _ := r.Context().Value(userKey{}).(*user)
	return u
}

func docsDatabase(t *testing.T) *pgxpool.Pool {
	t.Helper()
	db, err := pgxpool.Connect(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	if _, err := db.Exec(context.Background(), `
		CREATE TABLE IF NOT EXISTS charges (id bigserial PRIMARY KEY, amount bigint NOT NULL);
		CREATE TABLE IF NOT EXISTS refunds (id bigserial PRIMARY KEY, charge_id bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return db
}

type reply struct {
	status int
	header http.Header
	body   string
}

func post(t *testing.T, url, key, user, body string) reply {
	t.Helper()
	request, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	request.Header.Set("Content-Type", "application/json")
	request.Header.Set("Idempotency-Key", key)
	if user != "" {
		request.Header.Set("Authorization", "Bearer "+user)
	}
	response, err := http.DefaultClient.Do(request)
	if err != nil {
		t.Fatal(err)
	}
	defer response.Body.Close()
	data, _ := io.ReadAll(response.Body)
	return reply{response.StatusCode, response.Header, string(data)}
}

func newDocsKey() string { return fmt.Sprintf("docs-%d", time.Now().UnixNano()) }

// checkCharges: a first request, its replay, and a request without a user.
func checkCharges(t *testing.T, url string) {
	t.Helper()
	key := newDocsKey()
	first := post(t, url, key, "alice", `{"amount": 1250}`)
	if first.status != 201 || first.header.Get("Location") == "" {
		t.Fatalf("first: %d %v %s", first.status, first.header, first.body)
	}
	retry := post(t, url, key, "alice", `{"amount": 1250}`)
	if retry.header.Get("Idempotent-Replayed") != "true" || retry.body != first.body {
		t.Errorf("retry: %d %v %s", retry.status, retry.header, retry.body)
	}
	anonymous := post(t, url, newDocsKey(), "", `{"amount": 1}`)
	if anonymous.status != 401 || !strings.Contains(anonymous.body, `"urn:idempotency:problem:principal-required"`) {
		t.Errorf("without a user: %d %s", anonymous.status, anonymous.body)
	}
}

func TestTheREADMEMiddlewareSnippet(t *testing.T) {
	docsDatabase(t)
	ctx := context.Background()
	mux := http.NewServeMux()
	// snippet: go-middleware
	pool, err := pgxpool.Connect(ctx, "") // PGHOST, PGDATABASE... as libpq reads them
	if err != nil {
		log.Fatal(err)
	}
	keyed := idempotency.Middleware(idempotency.Options{
		DB:    pool,
		Scope: func(r *http.Request) string { return userOf(r).ID }, // the request's principal
	})
	mux.Handle("/charges", keyed(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var charge struct{ Amount int64 }
		if err := json.NewDecoder(r.Body).Decode(&charge); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest) // not stored: the client may fix it and retry
			return
		}
		tx := idempotency.Tx(r.Context()) // the request's transaction (pgx.Tx)
		var id int64
		err := tx.QueryRow(r.Context(), "INSERT INTO charges (amount) VALUES ($1) RETURNING id", charge.Amount).Scan(&id)
		if err != nil {
			panic(err) // rolls back; nothing stored
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", fmt.Sprintf("/charges/%d", id))
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%d,"amount":%d}`, id, charge.Amount)
	})))
	// end snippet
	defer pool.Close()
	server := httptest.NewServer(authenticate(mux))
	defer server.Close()
	checkCharges(t, server.URL+"/charges")
}

func TestTheFrameworksMiddlewareSnippet(t *testing.T) {
	pool := docsDatabase(t)
	mux := http.NewServeMux()
	// snippet: go-frameworks
	keyed := idempotency.Middleware(idempotency.Options{
		DB:    pool,                                                 // a *pgxpool.Pool
		Scope: func(r *http.Request) string { return userOf(r).ID }, // or SharedKeys: true
	})
	mux.Handle("/charges", keyed(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx := idempotency.Tx(r.Context()) // the request's pgx.Tx
		if _, err := tx.Exec(r.Context(), "INSERT INTO charges (amount) VALUES (1250)"); err != nil {
			panic(err) // rolls back; nothing stored
		}
		w.Header().Set("Location", "/charges/17")
		w.WriteHeader(http.StatusCreated)
	})))
	// end snippet
	server := httptest.NewServer(authenticate(mux))
	defer server.Close()
	checkCharges(t, server.URL+"/charges")
}

// events is a Logger that keeps each record's level and event.
type events struct {
	mu    sync.Mutex
	lines []string
}

func (e *events) add(level string, args []interface{}) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.lines = append(e.lines, fmt.Sprintf("%s %v", level, args[1]))
}
func (e *events) Info(msg string, args ...interface{})  { e.add("INFO", args) }
func (e *events) Warn(msg string, args ...interface{})  { e.add("WARN", args) }
func (e *events) Error(msg string, args ...interface{}) { e.add("ERROR", args) }

func TestTheStartupSnippet(t *testing.T) {
	observer := docsDatabase(t)
	ctx := context.Background()
	mux := http.NewServeMux()
	logger := &events{}
	createRefund := func(w http.ResponseWriter, r *http.Request) {
		var id int64
		if err := idempotency.Tx(r.Context()).QueryRow(r.Context(),
			"INSERT INTO refunds (charge_id) VALUES (17) RETURNING id").Scan(&id); err != nil {
			panic(err)
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%d}`, id)
	}
	server := httptest.NewServer(authenticate(mux))
	defer server.Close()
	// snippet: go-startup
	var db atomic.Pointer[pgxpool.Pool] // set at startup, below
	refunds := idempotency.Middleware(idempotency.Options{
		DBFor:  func(r *http.Request) (idempotency.TxBeginner, error) { return db.Load(), nil },
		Scope:  func(r *http.Request) string { return userOf(r).ID },
		TTL:    7 * 24 * time.Hour, // this route's keys are kept a week
		Logger: logger,             // a *slog.Logger, or idempotency.StdLogger(nil)
	})
	mux.Handle("/refunds", refunds(http.HandlerFunc(createRefund)))
	// end snippet
	if a := post(t, server.URL+"/refunds", newDocsKey(), "bob", "{}"); a.status != 500 {
		t.Errorf("before the pool is made: %d %s", a.status, a.body)
	}
	// snippet: go-startup-pool
	pool, err := pgxpool.Connect(ctx, "")
	if err != nil {
		log.Fatal(err)
	}
	db.Store(pool)
	// end snippet
	defer pool.Close()
	key := newDocsKey()
	if a := post(t, server.URL+"/refunds", key, "bob", "{}"); a.status != 201 {
		t.Fatalf("first: %d %s", a.status, a.body)
	}
	if a := post(t, server.URL+"/refunds", key, "bob", "{}"); a.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("retry: %d %v", a.status, a.header)
	}
	scoped, _ := idempotency.ScopedKey("bob", key)
	var seconds float64
	if err := observer.QueryRow(ctx, "SELECT extract(epoch FROM expires_at - created_at)::float8 FROM idempotency.lookup($1)",
		scoped).Scan(&seconds); err != nil || seconds != 7*86400 {
		t.Errorf("the key is kept %v s (%v)", seconds, err)
	}
	// The default ErrorHandler's record of the request before the pool, then the outcomes.
	if got, want := fmt.Sprint(logger.lines), "[ERROR POST INFO stored INFO replayed]"; got != want {
		t.Errorf("records %s, want %s", got, want)
	}
}

// The docs' Go snippets, and the regions of this file they quote.
func TestDocsQuoteTheSnippets(t *testing.T) {
	source, err := os.ReadFile("docs_test.go")
	if err != nil {
		t.Fatal(err)
	}
	regions := map[string]string{}
	for _, match := range regexp.MustCompile(`(?s)\n\t// snippet: ([a-z-]+)\n(.*?)\t// end snippet\n`).FindAllStringSubmatch(string(source), -1) {
		regions[match[1]] = regexp.MustCompile(`(?m)^\t`).ReplaceAllString(match[2], "")
	}
	docs := filepath.Join("..", "..", "..", "docs")
	if shared := os.Getenv("SHARED_DIR"); shared != "" {
		docs = filepath.Join(shared, "..", "..", "docs")
	}
	readme, err := os.ReadFile(filepath.Join("..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	frameworks, err := os.ReadFile(filepath.Join(docs, "frameworks.md"))
	if err != nil {
		t.Fatal(err)
	}
	goSection := string(frameworks)
	start := strings.Index(goSection, "\n## Go: net/http and pgx\n")
	if start < 0 {
		t.Fatal("docs/frameworks.md has no Go section")
	}
	goSection = goSection[start:]
	if end := strings.Index(goSection[1:], "\n## "); end >= 0 {
		goSection = goSection[:end+1]
	}
	quoted := map[string]bool{}
	for where, text := range map[string]string{"packages/go/README.md": string(readme), "docs/frameworks.md (Go)": goSection} {
		if fences := strings.Count(text, "\n```go\n"); fences == 0 {
			t.Errorf("%s: no Go snippet", where)
		} else if marked := len(regexp.MustCompile("<!-- snippet: [a-z-]+ -->\n```go\n").FindAllString(text, -1)); marked != fences {
			t.Errorf("%s: %d of %d Go snippets without a <!-- snippet: NAME --> line", where, fences-marked, fences)
		}
		for _, match := range regexp.MustCompile("(?s)<!-- snippet: ([a-z-]+) -->\n```go\n(.*?)```\n").FindAllStringSubmatch(text, -1) {
			region, ok := regions[match[1]]
			if !ok {
				t.Errorf("%s: snippet %s is no region of docs_test.go", where, match[1])
			} else if match[2] != region {
				t.Errorf("%s: snippet %s is not docs_test.go's:\n%s\nthe test runs:\n%s", where, match[1], match[2], region)
			}
			quoted[match[1]] = true
		}
	}
	for name := range regions {
		if !quoted[name] {
			t.Errorf("the region %s of docs_test.go is quoted by no doc", name)
		}
	}
}
