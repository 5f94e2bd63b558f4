package idempotency

import (
	"errors"

	"github.com/jackc/pgconn"
)

// The codes of the errors this package returns.
const (
	CodeKeyInProgress = "IK409" // the key is held by another open transaction
	CodeKeyGone       = "IK410" // the request already ran; its response is no longer kept
	CodeKeyReused     = "IK422" // the key was used for another request
	CodeInvalidKey    = "ERR_IDEMPOTENCY_INVALID_KEY"
)

// Error is an error of the claim or of the key header. Status is the HTTP
// status it maps to; Err the database error behind it, if any.
type Error struct {
	Code    string
	Status  int
	Message string
	Err     error
}

func (e *Error) Error() string { return e.Message }
func (e *Error) Unwrap() error { return e.Err }

// Is makes errors.Is(err, ErrKeyInProgress) (and the others) true for
// every error of that code.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Message == "" && t.Code == e.Code
}

// Sentinels for errors.Is.
var (
	ErrKeyInProgress = &Error{Code: CodeKeyInProgress, Status: 409}
	ErrKeyGone       = &Error{Code: CodeKeyGone, Status: 410}
	ErrKeyReused     = &Error{Code: CodeKeyReused, Status: 422}
	ErrInvalidKey    = &Error{Code: CodeInvalidKey, Status: 400}
)

// fromClaimError is the package's error for a database error raised by
// the claim itself (IK409, IK410, IK422; 22023 and 22004: an empty,
// over-long or NULL key), or the error unchanged.
func fromClaimError(err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return err
	}
	switch pgErr.Code {
	case "IK409":
		return &Error{Code: CodeKeyInProgress, Status: 409, Message: pgErr.Message, Err: err}
	case "IK410":
		return &Error{Code: CodeKeyGone, Status: 410, Message: pgErr.Message, Err: err}
	case "IK422":
		return &Error{Code: CodeKeyReused, Status: 422, Message: pgErr.Message, Err: err}
	case "22023", "22004":
		return &Error{Code: CodeInvalidKey, Status: 400, Message: pgErr.Message, Err: err}
	}
	return err
}
