package idempotency

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgconn"
	"github.com/jackc/pgtype"
	"github.com/jackc/pgx/v4"
)

// Queryer runs statements: a pgx.Tx, or a *pgx.Conn or *pgxpool.Conn
// inside a transaction you began. Claim, Complete and Release work in the
// caller's transaction.
type Queryer interface {
	Exec(ctx context.Context, sql string, arguments ...interface{}) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...interface{}) pgx.Row
}

// Claimed is what Claim returns: Replayed with the stored Response, or a
// claim this transaction now holds (Response nil).
type Claimed struct {
	Replayed  bool
	Response  json.RawMessage
	CreatedAt time.Time
	ExpiresAt time.Time
}

// SetWaitTimeout sets idempotency.wait_timeout for the rest of the
// transaction (what SET LOCAL does): how long a claim waits for another
// transaction holding the key before IK409. Whole milliseconds.
func SetWaitTimeout(ctx context.Context, q Queryer, wait time.Duration) error {
	_, err := q.Exec(ctx, "SELECT set_config('idempotency.wait_timeout', $1, true)",
		strconv.FormatInt(wait.Milliseconds(), 10))
	return err
}

// SetTTL sets idempotency.ttl for the rest of the transaction (what SET
// LOCAL does): the keys it claims from now on are kept ttl. The database
// refuses a TTL that is not positive or over idempotency.max_ttl (22023).
func SetTTL(ctx context.Context, q Queryer, ttl time.Duration) error {
	_, err := q.Exec(ctx, "SELECT pg_catalog.set_config('idempotency.ttl', $1, true)", ttlText(ttl))
	return err
}

// ttlText is a duration as an interval's text, to the microsecond.
func ttlText(ttl time.Duration) string {
	return fmt.Sprintf("%d.%06d seconds", ttl/time.Second, (ttl%time.Second)/time.Microsecond)
}

// Claim claims key in q's open transaction, with requestHash (the
// request's fingerprint; "" for none). Errors: an *Error with
// CodeKeyInProgress (IK409), CodeKeyGone (IK410), CodeKeyReused (IK422) or
// CodeInvalidKey for the claim's own errors (errors.Is(err,
// ErrKeyInProgress)...), any other error as it came.
func Claim(ctx context.Context, q Queryer, key, requestHash string) (Claimed, error) {
	var hash interface{}
	if requestHash != "" {
		hash = requestHash
	}
	var claimed Claimed
	var response []byte
	var created, expires pgtype.Timestamptz
	err := q.QueryRow(ctx, "SELECT replayed, response, created_at, expires_at FROM idempotency.claim($1, $2)",
		key, hash).Scan(&claimed.Replayed, &response, &created, &expires)
	if err != nil {
		return Claimed{}, fromClaimError(err)
	}
	if response != nil {
		claimed.Response = json.RawMessage(response)
	}
	claimed.CreatedAt, claimed.ExpiresAt = created.Time, expires.Time
	return claimed, nil
}

// Complete stores response (a value encoding/json writes; a
// json.RawMessage as it is) for the key this transaction claimed. It
// commits or rolls back with the transaction.
func Complete(ctx context.Context, q Queryer, key string, response interface{}) error {
	text, err := json.Marshal(response)
	if err != nil {
		return err
	}
	_, err = q.Exec(ctx, "SELECT idempotency.complete($1, $2::jsonb)", key, string(text))
	return err
}

// Release lets go of this transaction's claim of key without storing
// anything.
func Release(ctx context.Context, q Queryer, key string) error {
	_, err := q.Exec(ctx, "SELECT idempotency.release($1)", key)
	return err
}

// TxBeginner begins transactions: a *pgxpool.Pool (or a *pgx.Conn, for one
// request at a time).
type TxBeginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Run runs work once for key, in a transaction of its own: after a claim,
// its result (a value encoding/json writes) is stored and committed with
// its work, and returned. A retry gets the stored result without running
// work: Replayed, with the stored JSON. An error of work rolls back and is
// returned, as are the claim's errors.
func Run(ctx context.Context, db TxBeginner, key, requestHash string,
	work func(ctx context.Context, tx pgx.Tx) (interface{}, error)) (replayed bool, response json.RawMessage, err error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return false, nil, err
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback(context.Background())
		}
	}()
	claimed, err := Claim(ctx, tx, key, requestHash)
	if err != nil {
		return false, nil, err
	}
	if claimed.Replayed {
		return true, claimed.Response, tx.Commit(ctx)
	}
	result, err := work(ctx, ownedTx{tx})
	if err != nil {
		return false, nil, err
	}
	if response, err = json.Marshal(result); err != nil {
		return false, nil, err
	}
	if err = Complete(ctx, tx, key, json.RawMessage(response)); err != nil {
		return false, nil, err
	}
	return false, response, tx.Commit(ctx)
}
