package idempotency

// Which responses are stored for their key (and commit the handler's work):
//
//   - 5xx: never: the server failed, a retry must run the handler again;
//   - 408, 409, 425, 429: never: they say "not now", not "this is the answer";
//   - the validation statuses (400 and 422 by default): only when the route
//     sets StoreValidationErrors, so a client that fixes a typo can retry
//     with the same key;
//   - everything else (2xx, 3xx, other 4xx such as 402 or 404): stored.
//
// A response that is not stored rolls its transaction back.

// NeverStored are the statuses below 500 that are never stored.
var NeverStored = []int{408, 409, 425, 429}

// DefaultValidationStatuses are stored only with StoreValidationErrors.
var DefaultValidationStatuses = []int{400, 422}

func contains(list []int, status int) bool {
	for _, s := range list {
		if s == status {
			return true
		}
	}
	return false
}

// IsStored says whether a response with this status is stored (and its
// work committed). validationStatuses nil means DefaultValidationStatuses.
func IsStored(status int, storeValidationErrors bool, validationStatuses []int) bool {
	if status >= 500 || contains(NeverStored, status) {
		return false
	}
	if validationStatuses == nil {
		validationStatuses = DefaultValidationStatuses
	}
	if contains(validationStatuses, status) {
		return storeValidationErrors
	}
	return true
}

// notStoredReason says why a response of this status is not stored
// ("server-error", "not-now", "validation"), or "" when it is.
func notStoredReason(status int, storeValidationErrors bool, validationStatuses []int) string {
	switch {
	case IsStored(status, storeValidationErrors, validationStatuses):
		return ""
	case status >= 500:
		return "server-error"
	case contains(NeverStored, status):
		return "not-now"
	}
	return "validation"
}
