// Package idempotency makes net/http handlers safe to retry with an
// Idempotency-Key header, over the PostgreSQL extension idempotency and
// pgx v4. It follows the rules of the Node (idempotency-pg) and Python
// (idempotency_pg) packages: the same key header, scope, request
// fingerprint, stored document and problem documents, so a retry may reach
// a service written in any of the three.
//
//	mux.Handle("/charges", idempotency.Middleware(idempotency.Options{
//		DB:    pool, // a *pgxpool.Pool
//		Scope: func(r *http.Request) string { return userOf(r).ID },
//	})(http.HandlerFunc(createCharge)))
//
//	func createCharge(w http.ResponseWriter, r *http.Request) {
//		tx := idempotency.Tx(r.Context()) // the request's transaction
//		tx.Exec(r.Context(), "INSERT INTO charges ...")
//		w.Header().Set("Location", "/charges/17")
//		w.WriteHeader(http.StatusCreated)
//		...
//	}
//
// The building blocks (ParseKey, ScopedKey, Fingerprint, IsStored,
// NewStoredDocument, Claim, Complete, Release) are exported for other
// routers and for queue consumers.
package idempotency

// Version is the package's version, the extension's release.
const Version = "1.1.0"
