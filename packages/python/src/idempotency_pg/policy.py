"""Which responses are stored for their key (and commit the view's work):

- 5xx: never: the server failed, a retry must run the view again;
- 408, 409, 425, 429: never: they say "not now", not "this is the answer";
- the validation statuses (400 and 422 by default): only when the view sets
  store_validation_errors, so a client that fixes a typo can retry with the
  same key;
- everything else (2xx, 3xx, other 4xx such as 402 or 404): stored.

A response that is not stored rolls its transaction back."""

NEVER_STORED = (408, 409, 425, 429)
DEFAULT_VALIDATION_STATUSES = (400, 422)


def is_stored(status, store_validation_errors=False, validation_statuses=DEFAULT_VALIDATION_STATUSES):
    if status >= 500 or status in NEVER_STORED:
        return False
    if status in validation_statuses:
        return store_validation_errors
    return True
