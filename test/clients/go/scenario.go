// The clients scenario from pgx v4 (see test/clients/run): bare
// placeholders, Go values as pgx encodes them; with the extended protocol
// (pgx's default: statements prepared and described) or the simple one
// (pgx interpolates the values into the SQL).
//
//	pgx-scenario extended|simple
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgconn"
	"github.com/jackc/pgtype"
	"github.com/jackc/pgx/v4"
)

var (
	ctx     = context.Background()
	prefix  = os.Getenv("CLIENTS_RUN") + "-" + os.Getenv("CLIENTS_CONFIG") + "-"
	account = atoi(os.Getenv("CLIENTS_ACCOUNT"))
	stamp   = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
)

const (
	uuid = "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"
	doc  = `{"a": 1, "b": [true, null]}`
)

func atoi(s string) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		panic(err)
	}
	return n
}

func result(step, field string, value interface{}) {
	fmt.Printf("RESULT %s %s %v\n", step, field, value)
}

func sqlstate(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

func step(name string, body func() error) {
	if err := body(); err != nil {
		result(name, "error", strings.ReplaceAll(sqlstate(err)+" "+err.Error(), "\n", " "))
	}
}

// docs:begin pgx
const callWithdraw = `SELECT idempotency.idempotent_call($1, NULL, 'SELECT withdraw($1, $2)', $2, $3)::text,
                             idempotency.last_call_replayed()`

var errBusy = errors.New("busy: retry later with the same key (409)")
var errKeyReused = errors.New("key reused for another request (422)")

func withdraw(conn *pgx.Conn, key string, account int, amount int64) (response string, replayed bool, err error) {
	err = conn.QueryRow(ctx, callWithdraw, key, account, amount).Scan(&response, &replayed)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "IK409" {
		return "", false, fmt.Errorf("%w: %v", errBusy, err)
	}
	if errors.As(err, &pgErr) && pgErr.Code == "IK422" {
		return "", false, fmt.Errorf("%w: %v", errKeyReused, err)
	}
	return response, replayed, err
}

// docs:end pgx

const callTypes = `SELECT idempotency.idempotent_call($1, NULL, 'SELECT record_types($1, $2, $3, $4, $5, $6)',
                                                 $2, $3, $4, $5, $6, $7)::text,
                          idempotency.last_call_replayed()`

func reportCall(name string, conn *pgx.Conn, sql string, args ...interface{}) {
	step(name, func() error {
		var response string
		var replayed bool
		if err := conn.QueryRow(ctx, sql, args...).Scan(&response, &replayed); err != nil {
			return err
		}
		result(name, "response", response)
		result(name, "replayed", replayed)
		return nil
	})
}

func textArray(values ...*string) pgtype.TextArray {
	var array pgtype.TextArray
	if err := array.Set(values); err != nil {
		panic(err)
	}
	return array
}

func connect(simple bool, application string) *pgx.Conn {
	config, err := pgx.ParseConfig("")
	if err != nil {
		panic(err)
	}
	config.PreferSimpleProtocol = simple
	config.RuntimeParams["application_name"] = application
	conn, err := pgx.ConnectConfig(ctx, config)
	if err != nil {
		panic(err)
	}
	return conn
}

func main() {
	simple := os.Args[1] == "simple"
	conn := connect(simple, "clients")
	other := connect(simple, "clients-holder")
	defer conn.Close(ctx)
	defer other.Close(ctx)

	first := prefix + "first"
	for _, name := range []string{"first", "retry"} {
		step(name, func() error {
			response, replayed, err := withdraw(conn, first, account+1, 300)
			if err != nil {
				return err
			}
			result(name, "response", response)
			result(name, "replayed", replayed)
			return nil
		})
	}
	step("conflict", func() error {
		_, err := conn.Exec(ctx, callWithdraw, first, account+1, 301)
		result("conflict", "sqlstate", sqlstate(err))
		return nil
	})

	step("busy", func() error {
		key := prefix + "busy"
		tx, err := other.Begin(ctx)
		if err != nil {
			return err
		}
		defer tx.Rollback(ctx)
		if _, err := tx.Exec(ctx, callWithdraw, key, account+2, 100); err != nil {
			return err
		}
		started := time.Now()
		_, err = conn.Exec(ctx, callWithdraw, key, account+2, 100)
		result("busy", "sqlstate", sqlstate(err))
		result("busy", "elapsed_ms", time.Since(started).Milliseconds())
		if err := tx.Commit(ctx); err != nil {
			return err
		}
		reportCall("busy_after", conn, callWithdraw, key, account+2, 100)
		return nil
	})

	step("handler", func() error {
		key := prefix + "handler"
		tx, err := conn.Begin(ctx)
		if err != nil {
			return err
		}
		defer tx.Rollback(ctx)
		var replayed bool
		if err := tx.QueryRow(ctx, "SELECT replayed FROM idempotency.claim($1, $2)", key, "hash-1").Scan(&replayed); err != nil {
			return err
		}
		result("handler_claim", "replayed", replayed)
		var work string
		if err := tx.QueryRow(ctx, "SELECT withdraw($1, $2)::text", account+3, 50).Scan(&work); err != nil {
			return err
		}
		result("handler_work", "response", work)
		if _, err := tx.Exec(ctx, "SELECT idempotency.complete($1, $2)", key, work); err != nil {
			return err
		}
		if err := tx.Commit(ctx); err != nil {
			return err
		}
		var response string
		err = conn.BeginFunc(ctx, func(tx pgx.Tx) error {
			return tx.QueryRow(ctx, "SELECT replayed, response::text FROM idempotency.claim($1, $2)", key, "hash-1").
				Scan(&replayed, &response)
		})
		if err != nil {
			return err
		}
		result("handler_again", "replayed", replayed)
		result("handler_again", "response", response)
		return nil
	})

	step("release", func() error {
		key := prefix + "release"
		err := conn.BeginFunc(ctx, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "SELECT replayed FROM idempotency.claim($1, $2)", key, nil); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "SELECT idempotency.release($1)", key)
			return err
		})
		if err != nil {
			return err
		}
		var state string
		if err := conn.QueryRow(ctx, "SELECT state FROM idempotency.lookup($1)", key).Scan(&state); err != nil {
			return err
		}
		result("release_lookup", "state", state)
		tx, err := conn.Begin(ctx)
		if err != nil {
			return err
		}
		var replayed bool
		err = tx.QueryRow(ctx, "SELECT replayed FROM idempotency.claim($1, $2)", key, nil).Scan(&replayed)
		tx.Rollback(ctx)
		if err != nil {
			return err
		}
		result("release_again", "replayed", replayed)
		return nil
	})

	// Three keys, the second with a nil request hash, in one transaction:
	// withdraw for each claimed key, the answers as a []string for jsonb[].
	// Then the batch again with the first key repeated under another hash.
	// The hashes go as a pgtype.TextArray: pgx's simple protocol cannot
	// encode a []*string, the extended one takes either.
	batchKeys := []string{prefix + "batch-0", prefix + "batch-1", prefix + "batch-2"}
	hash0, hash2, hashOther := "hash-0", "hash-2", "hash-0-other"
	batchHashes := textArray(&hash0, nil, &hash2)
	step("batch", func() error {
		return conn.BeginFunc(ctx, func(tx pgx.Tx) error {
			rows, err := tx.Query(ctx, "SELECT outcome FROM idempotency.claim_batch($1, $2) ORDER BY ordinality",
				batchKeys, batchHashes)
			if err != nil {
				return err
			}
			// The rows are read to the end before the connection runs withdraw.
			var outcomes []string
			for rows.Next() {
				var outcome string
				if err := rows.Scan(&outcome); err != nil {
					return err
				}
				outcomes = append(outcomes, outcome)
			}
			if err := rows.Err(); err != nil {
				return err
			}
			var keys, responses []string
			for i, outcome := range outcomes {
				result(fmt.Sprintf("batch.%d", i), "outcome", outcome)
				if outcome != "claimed" {
					continue
				}
				var work string
				if err := tx.QueryRow(ctx, "SELECT withdraw($1, $2)::text", account+6+i, 10*(i+1)).Scan(&work); err != nil {
					return err
				}
				result(fmt.Sprintf("batch.%d", i), "response", work)
				keys = append(keys, batchKeys[i])
				responses = append(responses, work)
			}
			_, err = tx.Exec(ctx, "SELECT idempotency.complete_batch($1, $2)", keys, responses)
			return err
		})
	})
	step("batch_retry", func() error {
		return conn.BeginFunc(ctx, func(tx pgx.Tx) error {
			rows, err := tx.Query(ctx,
				"SELECT outcome, sqlstate, response::text FROM idempotency.claim_batch($1, $2) ORDER BY ordinality",
				append(batchKeys, batchKeys[0]), textArray(&hash0, nil, &hash2, &hashOther))
			if err != nil {
				return err
			}
			defer rows.Close()
			for i := 0; rows.Next(); i++ {
				var outcome string
				var state, response *string
				if err := rows.Scan(&outcome, &state, &response); err != nil {
					return err
				}
				result(fmt.Sprintf("batch_retry.%d", i), "outcome", outcome)
				if response != nil {
					result(fmt.Sprintf("batch_retry.%d", i), "response", *response)
				}
				if state != nil {
					result(fmt.Sprintf("batch_retry.%d", i), "sqlstate", *state)
				}
			}
			return rows.Err()
		})
	})

	key := prefix + "types"
	for _, name := range []string{"types", "types_retry"} {
		reportCall(name, conn, callTypes, key, key, true, stamp, uuid, doc, "12.50")
	}
	key = prefix + "types-null"
	for _, name := range []string{"types_null", "types_null_retry"} {
		reportCall(name, conn, callTypes, key, key, nil, nil, nil, nil, nil)
	}

	for _, p := range []struct {
		name, mode string
		account    int
	}{{"prepared", "auto", account + 4}, {"prepared_generic", "force_generic_plan", account + 5}} {
		step(p.name, func() error {
			if _, err := conn.Exec(ctx, "SET plan_cache_mode = "+p.mode); err != nil {
				return err
			}
			// The extended protocol: pgx's own prepared statement; the
			// simple one: SQL PREPARE with untyped parameters.
			statement := p.name
			if simple {
				statement = "EXECUTE " + p.name + "($1, $2, $3)"
				if _, err := conn.Exec(ctx, "PREPARE "+p.name+" AS "+
					"SELECT idempotency.idempotent_call($1, NULL, 'SELECT withdraw($1, $2)', $2, $3)::text"); err != nil {
					return err
				}
			} else if _, err := conn.Prepare(ctx, p.name,
				"SELECT idempotency.idempotent_call($1, NULL, 'SELECT withdraw($1, $2)', $2, $3)::text"); err != nil {
				return err
			}
			for _, run := range []string{"run", "retry"} {
				for i := 0; i < 20; i++ {
					var response string
					if err := conn.QueryRow(ctx, statement, fmt.Sprintf("%s%s-%d", prefix, p.name, i), p.account, i+1).
						Scan(&response); err != nil {
						return err
					}
					result(fmt.Sprintf("%s.%s.%d", p.name, run, i), "response", response)
				}
			}
			_, err := conn.Exec(ctx, "RESET plan_cache_mode")
			return err
		})
	}

	reportCall("cross", conn, callWithdraw, os.Getenv("CLIENTS_CROSS_KEY"), atoi(os.Getenv("CLIENTS_CROSS_ACCOUNT")), 250)
	reportCall("cross_types", conn, callTypes, os.Getenv("CLIENTS_CROSS_KEY")+"-types", os.Getenv("CLIENTS_CROSS_TAG"),
		true, stamp, uuid, doc, "12.50")
}
