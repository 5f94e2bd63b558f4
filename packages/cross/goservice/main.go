// The Go service of the cross-package tests (packages/cross/cross.test.js):
// the routes of the Node service, through the Go package's middleware, on
// the database PGHOST, PGPORT, PGUSER and PGDATABASE name. Keys are scoped
// to the API client the X-Client header names. Prints
// "listening on http://127.0.0.1:PORT" once it listens.
//
//	goservice PORT      (0: chosen by the system)
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"

	"github.com/jackc/pgx/v4/pgxpool"

	"idempotency/packages/go/idempotency"
)

func main() {
	ctx := context.Background()
	pool, err := pgxpool.Connect(ctx, "")
	if err != nil {
		log.Fatal(err)
	}
	scoped := idempotency.Middleware(idempotency.Options{
		DB:    pool,
		Scope: func(r *http.Request) string { return r.Header.Get("X-Client") },
	})
	mux := http.NewServeMux()
	mux.Handle("/api/orders", scoped(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var order struct {
			Item     string
			Quantity float64
		}
		if err := json.NewDecoder(r.Body).Decode(&order); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		var id int64
		if err := idempotency.Tx(r.Context()).QueryRow(r.Context(),
			"INSERT INTO cross_orders (item, quantity) VALUES ($1, $2) RETURNING id", order.Item, int(order.Quantity)).Scan(&id); err != nil {
			panic(err)
		}
		w.Header().Set("Content-Type", "application/json; charset=utf-8")
		w.Header().Set("Location", fmt.Sprintf("/api/orders/%d", id))
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"order_id":%d,"served_by":"go"}`, id)
	})))
	mux.Handle("/api/binary", scoped(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := idempotency.Tx(r.Context()).Exec(r.Context(),
			"INSERT INTO cross_orders (item, quantity) VALUES ('binary', 1)"); err != nil {
			panic(err)
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		_, _ = w.Write([]byte{0x47, 0x4f, 0xff, 0x00, 0xfe})
	})))
	port := "0"
	if len(os.Args) > 1 {
		port = os.Args[1]
	}
	listener, err := net.Listen("tcp", "127.0.0.1:"+port)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("listening on http://%s\n", listener.Addr())
	log.Fatal(http.Serve(listener, mux))
}
