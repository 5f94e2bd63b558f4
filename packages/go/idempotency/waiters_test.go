package idempotency

// Many duplicates of one request with a WaitTimeout, sent while the first
// holds its key: every one waits for it and, once it commits, replays its
// answer at once; none is answered 409 when its wait runs out.

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v4/pgxpool"
)

const (
	duplicates = 20
	// Far below the wait: a bound, not a measure of speed.
	promptAfterCommit = 5 * time.Second
)

// waitersPool has a connection for the first request and every duplicate.
func waitersPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	config, err := pgxpool.ParseConfig("")
	if err != nil {
		t.Fatal(err)
	}
	config.MaxConns = duplicates + 4
	waiters, err := pgxpool.ConnectConfig(context.Background(), config)
	if err != nil {
		t.Fatalf("the test database (PGHOST, PGDATABASE...): %v", err)
	}
	t.Cleanup(waiters.Close)
	return waiters
}

// waitingForLocks is how many backends of the test database wait for a lock.
func waitingForLocks(t *testing.T) int {
	t.Helper()
	var n int
	if err := pool(t).QueryRow(context.Background(), "SELECT count(*) FROM pg_stat_activity "+
		"WHERE wait_event_type = 'Lock' AND datname = current_database()").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

type timedAnswer struct {
	answer
	at time.Time
}

func TestDuplicatesWaitingForTheFirstAllReplayOnceItCommits(t *testing.T) {
	pool(t) // makes the table charge writes to
	var runs int32
	// Only the first request runs the handler while the test holds it.
	server, entered, proceed := heldCharges(t,
		Options{DB: waitersPool(t), Scope: byClient, WaitTimeout: 20 * time.Second},
		func(*http.Request) bool { return atomic.AddInt32(&runs, 1) == 1 })
	key, item := newKey(), newKey()
	body := fmt.Sprintf(`{"item": %q}`, item)
	firstDone := make(chan answer)
	go func() { firstDone <- order(t, server, key, "alice", body) }()
	<-entered

	answers := make(chan timedAnswer, duplicates)
	for i := 0; i < duplicates; i++ {
		go func() {
			a := order(t, server, key, "alice", body)
			answers <- timedAnswer{a, time.Now()}
		}()
	}
	for deadline := time.Now().Add(15 * time.Second); waitingForLocks(t) != duplicates; {
		if time.Now().After(deadline) {
			t.Fatalf("the %d duplicates never all waited for the key", duplicates)
		}
		time.Sleep(20 * time.Millisecond)
	}
	close(proceed)
	firstAnswer := <-firstDone
	committedAt := time.Now()
	if firstAnswer.status != 201 {
		t.Fatalf("first: %d %s", firstAnswer.status, firstAnswer.body)
	}

	var latest time.Duration
	for i := 0; i < duplicates; i++ {
		a := <-answers
		if a.status != 201 || a.header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(a.body, firstAnswer.body) {
			t.Errorf("duplicate: %d %v %s", a.status, a.header, a.body)
		}
		if after := a.at.Sub(committedAt); after > latest {
			latest = after
		}
	}
	if latest > promptAfterCommit {
		t.Errorf("the last duplicate answered %v after the first, not within %v", latest, promptAfterCommit)
	}
	if n := charges(t, item); n != 1 {
		t.Errorf("%d charges", n)
	}
}
