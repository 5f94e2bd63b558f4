package idempotency

// The middleware and the helpers against the database that PGHOST, PGPORT,
// PGUSER and PGDATABASE name (packages/run-tests makes one with the
// extension), through real HTTP servers on 127.0.0.1.

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgconn"
	"github.com/jackc/pgx/v4"
	"github.com/jackc/pgx/v4/pgxpool"
)

var (
	poolOnce sync.Once
	testPool *pgxpool.Pool
	poolErr  error
)

func pool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	poolOnce.Do(func() {
		config, err := pgxpool.ParseConfig("")
		if err != nil {
			poolErr = err
			return
		}
		config.MaxConns = 8
		if testPool, poolErr = pgxpool.ConnectConfig(context.Background(), config); poolErr == nil {
			_, poolErr = testPool.Exec(context.Background(),
				"CREATE TABLE IF NOT EXISTS go_charges (id bigserial PRIMARY KEY, item text NOT NULL)")
		}
	})
	if poolErr != nil {
		t.Fatalf("the test database (PGHOST, PGDATABASE...): %v", poolErr)
	}
	return testPool
}

func newKey() string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	return "k-" + hex.EncodeToString(b)
}

func charges(t *testing.T, item string) int {
	t.Helper()
	var n int
	if err := pool(t).QueryRow(context.Background(), "SELECT count(*) FROM go_charges WHERE item = $1", item).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// lookup is the stored response of a database key (nil when none).
func lookup(t *testing.T, databaseKey string) map[string]interface{} {
	t.Helper()
	var response []byte
	err := pool(t).QueryRow(context.Background(), "SELECT response FROM idempotency.lookup($1)", databaseKey).Scan(&response)
	if errors.Is(err, pgx.ErrNoRows) || response == nil {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var document map[string]interface{}
	if err := json.Unmarshal(response, &document); err != nil {
		t.Fatal(err)
	}
	return document
}

// byClient scopes keys to the client the X-Client header names (what an
// authentication middleware would establish).
func byClient(r *http.Request) string { return r.Header.Get("X-Client") }

// charge inserts the body's item and answers 201 with a Location.
func charge(w http.ResponseWriter, r *http.Request) {
	var order struct{ Item string }
	if err := json.NewDecoder(r.Body).Decode(&order); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var id int64
	if err := Tx(r.Context()).QueryRow(r.Context(), "INSERT INTO go_charges (item) VALUES ($1) RETURNING id",
		order.Item).Scan(&id); err != nil {
		panic(err)
	}
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.Header().Set("Location", fmt.Sprintf("/charges/%d", id))
	w.Header().Set("ETag", `"v1"`)
	w.Header().Set("X-Not-Replayed", "1")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"id":%d,"item":%q}`, id, order.Item)
}

// heldCharges serves charge behind the middleware of opts; a request that
// hold picks signals entered, then waits for proceed before it charges.
func heldCharges(t *testing.T, opts Options, hold func(*http.Request) bool) (server *httptest.Server, entered, proceed chan struct{}) {
	entered, proceed = make(chan struct{}), make(chan struct{})
	server = serve(t, Middleware(opts)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if hold(r) {
			close(entered)
			<-proceed
		}
		charge(w, r)
	})))
	return server, entered, proceed
}

func serve(t *testing.T, handler http.Handler) *httptest.Server {
	server := httptest.NewServer(handler)
	t.Cleanup(server.Close)
	return server
}

type answer struct {
	status int
	header http.Header
	body   []byte
}

func (a answer) problem(t *testing.T) map[string]interface{} {
	t.Helper()
	if a.header.Get("Content-Type") != "application/problem+json" {
		t.Fatalf("status %d, Content-Type %q, not a problem: %s", a.status, a.header.Get("Content-Type"), a.body)
	}
	var document map[string]interface{}
	if err := json.Unmarshal(a.body, &document); err != nil {
		t.Fatal(err)
	}
	return document
}

// send posts body with the key ("" for none) and the client's X-Client.
func send(t *testing.T, server *httptest.Server, path, key, client, contentType, body string) answer {
	t.Helper()
	request, err := http.NewRequest(http.MethodPost, server.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	request.Header.Set("Content-Type", contentType)
	if key != "" {
		request.Header.Set("Idempotency-Key", key)
	}
	if client != "" {
		request.Header.Set("X-Client", client)
	}
	return do(t, request)
}

func do(t *testing.T, request *http.Request) answer {
	t.Helper()
	response, err := http.DefaultClient.Do(request)
	if err != nil {
		t.Fatal(err)
	}
	defer response.Body.Close()
	body, err := io.ReadAll(response.Body)
	if err != nil {
		t.Fatal(err)
	}
	return answer{response.StatusCode, response.Header, body}
}

func order(t *testing.T, server *httptest.Server, key, client, body string) answer {
	t.Helper()
	return send(t, server, "/charges", key, client, "application/json", body)
}

func chargesServer(t *testing.T, options Options) *httptest.Server {
	if options.DB == nil && options.DBFor == nil {
		options.DB = pool(t)
	}
	if options.Scope == nil && !options.SharedKeys {
		options.Scope = byClient
	}
	return serve(t, Middleware(options)(http.HandlerFunc(charge)))
}

func TestFirstRequestRunsAndCommitsARetryReplays(t *testing.T) {
	server := chargesServer(t, Options{})
	key, item := newKey(), newKey()
	first := order(t, server, key, "alice", fmt.Sprintf(`{"item": %q}`, item))
	if first.status != 201 || first.header.Get("Idempotent-Replayed") != "" || first.header.Get("X-Not-Replayed") != "1" {
		t.Fatalf("first: %d %v %s", first.status, first.header, first.body)
	}
	retry := order(t, server, key, "alice", fmt.Sprintf(`{"item": %q}`, item))
	if retry.status != 201 || retry.header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(retry.body, first.body) {
		t.Fatalf("retry: %d %v %s", retry.status, retry.header, retry.body)
	}
	for _, name := range []string{"Location", "ETag", "Content-Type", "Content-Length"} {
		if retry.header.Get(name) != first.header.Get(name) {
			t.Errorf("%s: %q, first %q", name, retry.header.Get(name), first.header.Get(name))
		}
	}
	if retry.header.Get("X-Not-Replayed") != "" {
		t.Error("a header that is not replayable was replayed")
	}
	if n := charges(t, item); n != 1 {
		t.Errorf("%d charges", n)
	}
	scoped, _ := ScopedKey("alice", key)
	stored := lookup(t, scoped)
	if stored == nil || stored["status"] != float64(201) || stored["body"] != string(first.body) {
		t.Fatalf("stored under %q: %v", scoped, stored)
	}
	headers := stored["headers"].(map[string]interface{})
	if len(headers) != 3 || headers["Location"] != first.header.Get("Location") || headers["Etag"] != `"v1"` {
		t.Errorf("stored headers %v", headers)
	}
}

func TestAnotherRequestWithTheKeyIs422ReorderedJSONReplays(t *testing.T) {
	server := chargesServer(t, Options{})
	key, item := newKey(), newKey()
	if a := order(t, server, key, "alice", fmt.Sprintf(`{"item": %q, "n": [1.0, 2]}`, item)); a.status != 201 {
		t.Fatalf("%d %s", a.status, a.body)
	}
	same := order(t, server, key, "alice", fmt.Sprintf(`{ "n":[1,2.00],"item":%q }`, item))
	if same.status != 201 || same.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("the same JSON written otherwise: %d %s", same.status, same.body)
	}
	other := order(t, server, key, "alice", fmt.Sprintf(`{"item": %q, "n": [1, 3]}`, item))
	want := map[string]interface{}{"type": DefaultProblemBase + "idempotency-key-reused",
		"title": "Idempotency-Key reused with a different request", "status": float64(422),
		"detail": "This key was used for another request; use a new key for a new request."}
	if got := other.problem(t); other.status != 422 || fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("another body: %d %v", other.status, got)
	}
	path := send(t, server, "/charges?again", key, "alice", "application/json", fmt.Sprintf(`{"item": %q, "n": [1, 2]}`, item))
	if path.status != 422 {
		t.Errorf("another query: %d", path.status)
	}
	if n := charges(t, item); n != 1 {
		t.Errorf("%d charges", n)
	}
}

func TestADuplicateWhileTheFirstRunsIs409WithAWaitTimeoutItReplays(t *testing.T) {
	for _, wait := range []time.Duration{0, 5 * time.Second} {
		server, entered, proceed := heldCharges(t, Options{DB: pool(t), Scope: byClient, WaitTimeout: wait},
			func(*http.Request) bool { return true })
		key, item := newKey(), newKey()
		body := fmt.Sprintf(`{"item": %q}`, item)
		firstDone := make(chan answer)
		go func() { firstDone <- order(t, server, key, "alice", body) }()
		<-entered
		var duplicate answer
		if wait == 0 {
			duplicate = order(t, server, key, "alice", body)
			close(proceed)
		} else {
			duplicateDone := make(chan answer)
			go func() { duplicateDone <- order(t, server, key, "alice", body) }()
			time.Sleep(300 * time.Millisecond) // the duplicate waits on the key
			close(proceed)
			duplicate = <-duplicateDone
		}
		first := <-firstDone
		if first.status != 201 {
			t.Fatalf("first: %d %s", first.status, first.body)
		}
		if wait == 0 {
			got := duplicate.problem(t)
			if duplicate.status != 409 || duplicate.header.Get("Retry-After") != "1" ||
				got["type"] != DefaultProblemBase+"request-in-progress" || got["detail"] != "Retry the same request with the same key after 1 s." {
				t.Errorf("duplicate: %d %v %v", duplicate.status, duplicate.header, got)
			}
		} else if duplicate.status != 201 || duplicate.header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(duplicate.body, first.body) {
			t.Errorf("duplicate with a wait timeout: %d %v %s", duplicate.status, duplicate.header, duplicate.body)
		}
		if n := charges(t, item); n != 1 {
			t.Errorf("%d charges", n)
		}
	}
}

func TestAnotherClientsSameKeyRunsForThatClient(t *testing.T) {
	var seen []Info
	var mu sync.Mutex
	server := serve(t, Middleware(Options{DB: pool(t), Scope: byClient})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		info, _ := InfoFrom(r.Context())
		mu.Lock()
		seen = append(seen, info)
		mu.Unlock()
		charge(w, r)
	})))
	key, item := newKey(), newKey()
	body := fmt.Sprintf(`{"item": %q}`, item)
	alice := order(t, server, key, "alice", body)
	bob := order(t, server, key, "bob", body)
	if bob.status != 201 || bob.header.Get("Idempotent-Replayed") != "" || bytes.Equal(bob.body, alice.body) {
		t.Fatalf("Bob got %d %v %s", bob.status, bob.header, bob.body)
	}
	// Another body under Alice's key: Carol's own request, no 422.
	carol := order(t, server, key, "carol", fmt.Sprintf(`{"item": %q, "x": 1}`, item))
	if carol.status != 201 {
		t.Fatalf("Carol got %d %s", carol.status, carol.body)
	}
	again := order(t, server, key, "alice", body)
	if again.header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(again.body, alice.body) {
		t.Errorf("Alice's retry: %d %s", again.status, again.body)
	}
	if n := charges(t, item); n != 3 {
		t.Errorf("%d charges", n)
	}
	aliceKey, _ := ScopedKey("alice", key)
	if len(seen) != 3 || seen[0].DatabaseKey != aliceKey || seen[0].Scope != "alice" || seen[0].Key != key ||
		seen[0].RequestHash == "" {
		t.Errorf("Info: %+v", seen)
	}
}

// shortTTL is the TTL of keys a test retries after their response
// expired: past it, within idempotency.remember, a retry of the same
// request gets IK410; long enough that the first request commits within
// it on a loaded machine.
const shortTTL = "1 second"

// shortLived begins transactions whose claims give their keys shortTTL.
type shortLived struct{ db TxBeginner }

func (s shortLived) Begin(ctx context.Context) (pgx.Tx, error) {
	tx, err := s.db.Begin(ctx)
	if err != nil {
		return nil, err
	}
	if _, err := tx.Exec(ctx, "SELECT set_config('idempotency.ttl', $1, true)", shortTTL); err != nil {
		_ = tx.Rollback(ctx)
		return nil, err
	}
	return tx, nil
}

// waitUntilGone waits until the key's response has expired and the key is
// remembered (lookup's state gone).
func waitUntilGone(t *testing.T, databaseKey string) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		var state string
		err := pool(t).QueryRow(context.Background(), "SELECT state FROM idempotency.lookup($1)", databaseKey).Scan(&state)
		if err != nil {
			t.Fatal(err)
		}
		if state == "gone" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("key %q is %s, not gone", databaseKey, state)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestARetryAfterTheResponseExpiredIs410AnotherRequestIs422(t *testing.T) {
	server := chargesServer(t, Options{DB: shortLived{pool(t)}})
	key, item := newKey(), newKey()
	body := fmt.Sprintf(`{"item": %q}`, item)
	if a := order(t, server, key, "alice", body); a.status != 201 {
		t.Fatalf("first: %d %s", a.status, a.body)
	}
	scoped, _ := ScopedKey("alice", key)
	waitUntilGone(t, scoped)
	retry := order(t, server, key, "alice", body)
	want := map[string]interface{}{"type": DefaultProblemBase + "request-already-ran",
		"title": "This request already ran; its response is no longer kept", "status": float64(410),
		"detail": "A request with this Idempotency-Key was processed before and its response has expired; " +
			"it is not run again."}
	if got := retry.problem(t); retry.status != 410 || fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("the retry: %d %v", retry.status, got)
	}
	if retry.header.Get("Idempotent-Replayed") != "" {
		t.Error("a 410 is not a replay")
	}
	if n := charges(t, item); n != 1 {
		t.Errorf("the handler ran again: %d charges", n)
	}
	other := order(t, server, key, "alice", fmt.Sprintf(`{"item": %q}`, item+" other"))
	if got := other.problem(t); other.status != 422 || got["type"] != DefaultProblemBase+"idempotency-key-reused" {
		t.Errorf("another request: %d %v", other.status, got)
	}
	if n := charges(t, item+" other"); n != 0 {
		t.Errorf("another request ran: %d charges", n)
	}
	// Another client's same key is another key: its request runs.
	if a := order(t, server, key, "bob", body); a.status != 201 || charges(t, item) != 2 {
		t.Errorf("another client: %d %s", a.status, a.body)
	}
}

func TestTheHandlersOwnIKErrorsStayTheHandlers(t *testing.T) {
	var handled []error
	options := Options{DB: pool(t), SharedKeys: true, ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
		handled = append(handled, err)
		http.Error(w, "failed", http.StatusBadGateway)
	}}
	server := serve(t, Handle(options, func(w http.ResponseWriter, r *http.Request) error {
		_, err := Tx(r.Context()).Exec(r.Context(),
			"DO $$ BEGIN RAISE EXCEPTION 'mine' USING ERRCODE = '"+r.URL.Query().Get("code")+"'; END $$")
		return err
	}))
	codes := []string{"IK409", "IK410", "IK422"}
	for _, code := range codes {
		if a := send(t, server, "/own?code="+code, newKey(), "", "application/json", "{}"); a.status != 502 {
			t.Errorf("%s: %d %s", code, a.status, a.body)
		}
	}
	if len(handled) != len(codes) {
		t.Fatalf("errors handled: %v", handled)
	}
	for i, err := range handled {
		var pgErr *pgconn.PgError
		var ours *Error
		if !errors.As(err, &pgErr) || pgErr.Code != codes[i] || errors.As(err, &ours) {
			t.Errorf("%s: the handler's error became %#v", codes[i], err)
		}
	}
}

func TestARequestWithoutAPrincipalIs401(t *testing.T) {
	server := chargesServer(t, Options{})
	item := newKey()
	a := order(t, server, newKey(), "", fmt.Sprintf(`{"item": %q}`, item))
	if got := a.problem(t); a.status != 401 || got["type"] != DefaultProblemBase+"principal-required" {
		t.Errorf("%d %v", a.status, got)
	}
	if n := charges(t, item); n != 0 {
		t.Errorf("%d charges", n)
	}
}

func TestSharedKeysAreTheClientsKeys(t *testing.T) {
	server := chargesServer(t, Options{SharedKeys: true})
	key, item := newKey(), newKey()
	body := fmt.Sprintf(`{"item": %q}`, item)
	if a := order(t, server, key, "alice", body); a.status != 201 || lookup(t, key) == nil {
		t.Fatalf("%d %s: nothing stored under the key itself", a.status, a.body)
	}
	if a := order(t, server, key, "bob", body); a.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("another client did not share the key: %d", a.status)
	}
}

func TestMissingInvalidAndOptionalKeys(t *testing.T) {
	server := chargesServer(t, Options{})
	item := newKey()
	body := fmt.Sprintf(`{"item": %q}`, item)
	if a := order(t, server, "", "alice", body); a.status != 400 || a.problem(t)["type"] != DefaultProblemBase+"missing-idempotency-key" {
		t.Errorf("no key: %d %s", a.status, a.body)
	}
	for _, values := range [][]string{{"caf\xc3\xa9"}, {`"open`}, {"a", "b"}, {strings.Repeat("k", 256)}} {
		request, _ := http.NewRequest(http.MethodPost, server.URL+"/charges", strings.NewReader(body))
		request.Header.Set("Content-Type", "application/json")
		request.Header.Set("X-Client", "alice")
		request.Header["Idempotency-Key"] = values
		a := do(t, request)
		if got := a.problem(t); a.status != 400 || got["type"] != DefaultProblemBase+"invalid-idempotency-key" ||
			got["title"] != "Invalid Idempotency-Key" || got["detail"] == "" {
			t.Errorf("%q: %d %v", values, a.status, got)
		}
	}
	if n := charges(t, item); n != 0 {
		t.Errorf("%d charges", n)
	}
	optional := chargesServer(t, Options{Optional: true})
	for i := 0; i < 2; i++ {
		if a := order(t, optional, "", "alice", body); a.status != 201 || a.header.Get("Idempotent-Replayed") != "" {
			t.Errorf("an optional key: %d %s", a.status, a.body)
		}
	}
	if n := charges(t, item); n != 2 {
		t.Errorf("%d charges without a key, want 2", n)
	}
}

func TestAFailingHandlerCommitsNothing(t *testing.T) {
	failing := errors.New("the card was declined")
	var handled []error
	options := Options{DB: pool(t), Scope: byClient, ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
		handled = append(handled, err)
		http.Error(w, "failed", http.StatusBadGateway)
	}}
	mode := "error"
	handler := func(w http.ResponseWriter, r *http.Request) error {
		w.Header().Set("X-Handler", "1")
		charge(w, r)
		switch mode {
		case "error":
			return failing
		case "tx":
			// The transaction is the middleware's to end.
			if err := Tx(r.Context()).Commit(r.Context()); !errors.Is(err, ErrTxOwned) {
				t.Errorf("Commit: %v", err)
			}
			// The handler's own SQL error with an IK SQLSTATE stays the handler's.
			_, err := Tx(r.Context()).Exec(r.Context(), "DO $$ BEGIN RAISE EXCEPTION 'mine' USING ERRCODE = 'IK409'; END $$")
			return err
		}
		return nil
	}
	server := serve(t, Handle(options, handler))
	key, item := newKey(), newKey()
	body := fmt.Sprintf(`{"item": %q}`, item)
	for _, m := range []string{"error", "tx"} {
		mode = m
		a := order(t, server, key, "alice", body)
		if a.status != 502 || string(a.body) != "failed\n" || a.header.Get("X-Handler") != "" || a.header.Get("Location") != "" {
			t.Errorf("%s: %d %v %s", m, a.status, a.header, a.body)
		}
	}
	if len(handled) != 2 || handled[0] != failing || !strings.Contains(handled[1].Error(), "mine") {
		t.Errorf("errors handled: %v", handled)
	}
	if n := charges(t, item); n != 0 {
		t.Errorf("%d charges", n)
	}
	// Without a key (an Optional route), the extension would not refuse a
	// COMMIT either: the failing handler's work is rolled back all the same.
	optional := options
	optional.Optional = true
	mode = "error"
	if a := order(t, serve(t, Handle(optional, handler)), "", "alice", body); a.status != 502 {
		t.Errorf("without a key: %d %s", a.status, a.body)
	}
	if n := charges(t, item); n != 0 {
		t.Errorf("%d charges without a key", n)
	}
	// The key was not kept: the retry runs.
	mode = "ok"
	if a := order(t, server, key, "alice", body); a.status != 201 || a.header.Get("Idempotent-Replayed") != "" {
		t.Errorf("the retry: %d %s", a.status, a.body)
	}
	if n := charges(t, item); n != 1 {
		t.Errorf("%d charges after the retry", n)
	}
}

func TestAPanickingHandlerCommitsNothing(t *testing.T) {
	panics := true
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		charge(w, r)
		if panics {
			panic(http.ErrAbortHandler)
		}
	})
	server := serve(t, Middleware(Options{DB: pool(t), Scope: byClient})(handler))
	optional := serve(t, Middleware(Options{DB: pool(t), Scope: byClient, Optional: true})(handler))
	key, item := newKey(), newKey()
	body := fmt.Sprintf(`{"item": %q}`, item)
	for _, k := range []string{key, ""} {
		target := server
		if k == "" {
			target = optional
		}
		request, _ := http.NewRequest(http.MethodPost, target.URL+"/charges", strings.NewReader(body))
		request.Header.Set("Content-Type", "application/json")
		if k != "" {
			request.Header.Set("Idempotency-Key", k)
		}
		request.Header.Set("X-Client", "alice")
		if response, err := http.DefaultClient.Do(request); err == nil {
			response.Body.Close()
			t.Fatalf("the panicking handler answered %d", response.StatusCode)
		}
	}
	if n := charges(t, item); n != 0 {
		t.Errorf("%d charges", n)
	}
	panics = false
	if a := order(t, server, key, "alice", body); a.status != 201 || a.header.Get("Idempotent-Replayed") != "" {
		t.Errorf("the retry: %d %s", a.status, a.body)
	}
}

func TestWhichStatusesAreStored(t *testing.T) {
	status := 0
	answerWith := func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if _, err := Tx(r.Context()).Exec(r.Context(), "INSERT INTO go_charges (item) VALUES ($1)", string(body)); err != nil {
			panic(err)
		}
		w.WriteHeader(status)
		fmt.Fprintf(w, "status %d", status)
	}
	for _, c := range []struct {
		status                int
		storeValidation, kept bool
	}{{500, false, false}, {503, true, false}, {409, true, false}, {429, false, false},
		{400, false, false}, {422, false, false}, {400, true, true}, {422, true, true},
		{404, false, true}, {200, false, true}, {302, false, true}} {
		server := serve(t, Middleware(Options{DB: pool(t), Scope: byClient, StoreValidationErrors: c.storeValidation})(http.HandlerFunc(answerWith)))
		status = c.status
		key, item := newKey(), newKey()
		first := send(t, server, "/", key, "alice", "text/plain", item)
		client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
		request, _ := http.NewRequest(http.MethodPost, server.URL+"/", strings.NewReader(item))
		request.Header.Set("Content-Type", "text/plain")
		request.Header.Set("Idempotency-Key", key)
		request.Header.Set("X-Client", "alice")
		response, err := client.Do(request)
		if err != nil {
			t.Fatal(err)
		}
		response.Body.Close()
		replayed := response.Header.Get("Idempotent-Replayed") == "true"
		n := charges(t, item)
		if first.status != c.status || response.StatusCode != c.status || replayed != c.kept || (n == 1) != c.kept {
			t.Errorf("%d (storeValidationErrors %v): first %d, retry %d replayed %v, %d rows", c.status, c.storeValidation,
				first.status, response.StatusCode, replayed, n)
		}
	}
}

func TestBodiesReplayByteForByte(t *testing.T) {
	payloads := map[string][]byte{"binary": {0x25, 0x50, 0xff, 0xfe, 0x00, 0x41}, "text": []byte("héllo ✓"), "untyped": []byte("<html><body>hi</body></html>")}
	for name, payload := range payloads {
		server := serve(t, Middleware(Options{DB: pool(t), Scope: byClient})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if name == "binary" {
				w.Header().Set("Content-Type", "application/octet-stream")
			}
			for _, b := range payload { // written a byte at a time: held back and stored whole
				_, _ = w.Write([]byte{b})
			}
		})))
		key := newKey()
		first := send(t, server, "/", key, "alice", "application/octet-stream", "\x00\x01")
		retry := send(t, server, "/", key, "alice", "application/octet-stream", "\x00\x01")
		if !bytes.Equal(first.body, payload) || !bytes.Equal(retry.body, payload) || retry.header.Get("Idempotent-Replayed") != "true" ||
			retry.header.Get("Content-Type") != first.header.Get("Content-Type") || first.header.Get("Content-Type") == "" {
			t.Errorf("%s: %q (%s) then %q (%s)", name, first.body, first.header.Get("Content-Type"), retry.body, retry.header.Get("Content-Type"))
		}
		scoped, _ := ScopedKey("alice", key)
		stored := lookup(t, scoped)
		if encoding := stored["body_encoding"]; (encoding == "base64") != (name == "binary") {
			t.Errorf("%s stored with body_encoding %v", name, encoding)
		}
		// The type net/http sniffs for an untyped body is stored too: a
		// replay by another package sends it.
		if typ := stored["headers"].(map[string]interface{})["Content-Type"]; typ != first.header.Get("Content-Type") {
			t.Errorf("%s stored with Content-Type %v", name, typ)
		}
	}
}

func TestSizeLimits(t *testing.T) {
	server := serve(t, Middleware(Options{DB: pool(t), Scope: byClient, MaxBodyBytes: 10, MaxRequestBytes: 64})(http.HandlerFunc(
		func(w http.ResponseWriter, r *http.Request) {
			body, _ := io.ReadAll(r.Body)
			if _, err := Tx(r.Context()).Exec(r.Context(), "INSERT INTO go_charges (item) VALUES ($1)", string(body)); err != nil {
				panic(err)
			}
			if _, err := w.Write([]byte("0123456789")); err != nil {
				panic(err)
			}
			if _, err := w.Write([]byte("!")); !errors.Is(err, ErrResponseTooLarge) {
				t.Errorf("the write past the limit: %v", err)
			}
		})))
	item := newKey()
	a := send(t, server, "/", newKey(), "alice", "text/plain", item)
	if got := a.problem(t); a.status != 500 || got["type"] != DefaultProblemBase+"response-too-large" {
		t.Errorf("too large a response: %d %v", a.status, got)
	}
	if n := charges(t, item); n != 0 {
		t.Errorf("%d charges", n)
	}
	a = send(t, server, "/", newKey(), "alice", "text/plain", strings.Repeat("x", 65))
	if got := a.problem(t); a.status != 413 || got["type"] != DefaultProblemBase+"request-too-large" {
		t.Errorf("too large a request: %d %v", a.status, got)
	}
}

func TestARouteMustNameItsScope(t *testing.T) {
	for name, options := range map[string]Options{"no scope": {DB: pool(t)}, "both": {DB: pool(t), Scope: byClient, SharedKeys: true},
		"no DB": {Scope: byClient}} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: Middleware accepted the options", name)
				}
			}()
			Middleware(options)
		}()
	}
}

func TestClaimCompleteReleaseAndRun(t *testing.T) {
	ctx := context.Background()
	db := pool(t)
	key := newKey()
	first, err := db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Rollback(ctx)
	if claimed, err := Claim(ctx, first, key, "h1"); err != nil || claimed.Replayed {
		t.Fatalf("claim: %+v %v", claimed, err)
	}
	second, err := db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Claim(ctx, second, key, "h1"); !errors.Is(err, ErrKeyInProgress) || err.(*Error).Status != 409 {
		t.Errorf("a claim of a held key: %v", err)
	}
	second.Rollback(ctx)
	// Released, the key is free again within the same transaction.
	if err := Release(ctx, first, key); err != nil {
		t.Fatal(err)
	}
	if claimed, err := Claim(ctx, first, key, "h1"); err != nil || claimed.Replayed {
		t.Fatalf("claim after release: %+v %v", claimed, err)
	}
	if err := Complete(ctx, first, key, map[string]int{"answer": 42}); err != nil {
		t.Fatal(err)
	}
	if err := first.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	third, _ := db.Begin(ctx)
	defer third.Rollback(ctx)
	claimed, err := Claim(ctx, third, key, "h1")
	if err != nil || !claimed.Replayed || string(claimed.Response) != `{"answer": 42}` || claimed.CreatedAt.IsZero() {
		t.Errorf("the replay: %+v %s %v", claimed, claimed.Response, err)
	}
	if _, err := Claim(ctx, third, key, "h2"); !errors.Is(err, ErrKeyReused) {
		t.Errorf("another hash: %v", err)
	}
	third.Rollback(ctx)
	bad, _ := db.Begin(ctx)
	if _, err := Claim(ctx, bad, strings.Repeat("k", 256), ""); !errors.Is(err, ErrInvalidKey) {
		t.Errorf("an over-long key: %v", err)
	}
	bad.Rollback(ctx)

	runs := 0
	work := func(ctx context.Context, tx pgx.Tx) (interface{}, error) {
		runs++
		_, err := tx.Exec(ctx, "INSERT INTO go_charges (item) VALUES ($1)", "run "+key)
		return []int{runs}, err
	}
	for i, want := range []bool{false, true} {
		replayed, response, err := Run(ctx, db, "run-"+key, "", work)
		if err != nil || replayed != want || string(response) != "[1]" {
			t.Errorf("Run %d: %v %s %v", i, replayed, response, err)
		}
	}
	if runs != 1 || charges(t, "run "+key) != 1 {
		t.Errorf("work ran %d times", runs)
	}
	if _, _, err := Run(ctx, db, "fail-"+key, "", func(ctx context.Context, tx pgx.Tx) (interface{}, error) {
		_, _ = tx.Exec(ctx, "INSERT INTO go_charges (item) VALUES ($1)", "fail "+key)
		return nil, errors.New("no")
	}); err == nil || charges(t, "fail "+key) != 0 {
		t.Errorf("a failing work: %v", err)
	}
}

func TestClaimAndRunOfARequestWhoseResponseExpired(t *testing.T) {
	ctx := context.Background()
	db := pool(t)
	key := newKey()
	runs := 0
	work := func(ctx context.Context, tx pgx.Tx) (interface{}, error) {
		runs++
		_, err := tx.Exec(ctx, "INSERT INTO go_charges (item) VALUES ($1)", "gone "+key)
		return runs, err
	}
	if _, _, err := Run(ctx, shortLived{db}, key, "h", work); err != nil {
		t.Fatal(err)
	}
	waitUntilGone(t, key)
	tx, err := db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	_, err = Claim(ctx, tx, key, "h")
	var pgErr *pgconn.PgError
	if !errors.Is(err, ErrKeyGone) || err.(*Error).Status != 410 || !errors.As(err, &pgErr) || pgErr.Code != "IK410" {
		t.Errorf("a claim of the same request: %v", err)
	}
	tx.Rollback(ctx)
	other, err := db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Rollback(ctx)
	if _, err := Claim(ctx, other, key, "another request"); !errors.Is(err, ErrKeyReused) {
		t.Errorf("a claim of another request: %v", err)
	}
	other.Rollback(ctx)
	if _, _, err := Run(ctx, db, key, "h", work); !errors.Is(err, ErrKeyGone) {
		t.Errorf("Run: %v", err)
	}
	if runs != 1 || charges(t, "gone "+key) != 1 {
		t.Errorf("work ran %d times", runs)
	}
}
