package idempotency

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
)

// ScopedKey is the key the database holds for a client's key within a
// scope (the request's principal: the user, API client or tenant it comes
// from), by the rule shared with the Node and Python packages
// (packages/shared/scope-vectors.json holds its vectors):
//
//	"§" S ":" key       when that is at most 255 bytes of UTF-8
//	"§" S "#" H         otherwise
//
// S is the first 32 hex digits of SHA-256 over the scope's UTF-8 text, H
// the 64 hex digits of SHA-256 over the key. An integer principal is
// written in decimal (strconv.FormatInt), so 42 and "42" are one principal.
// The scope must not be empty.
func ScopedKey(scope, key string) (string, error) {
	if scope == "" {
		return "", errors.New("idempotency.ScopedKey: the scope is empty")
	}
	sum := sha256.Sum256([]byte(scope))
	prefix := "§" + hex.EncodeToString(sum[:])[:32]
	plain := prefix + ":" + key
	if len(plain) <= MaxKeyBytes {
		return plain, nil
	}
	keySum := sha256.Sum256([]byte(key))
	return prefix + "#" + hex.EncodeToString(keySum[:]), nil
}
