"""The errors this package raises. The ones the claim raises carry the HTTP
status they map to; the database error is their __cause__."""


class IdempotencyError(Exception):
    code = None
    status = None


class KeyInProgress(IdempotencyError):
    """The key is held by another open transaction (SQLSTATE IK409)."""
    code, status = "IK409", 409


class KeyGone(IdempotencyError):
    """The request already ran and its response is no longer kept (SQLSTATE
    IK410): it must not run again."""
    code, status = "IK410", 410


class KeyReused(IdempotencyError):
    """The key was used for another request (SQLSTATE IK422)."""
    code, status = "IK422", 422


class InvalidKey(IdempotencyError):
    """The key is NULL, empty or longer than 255 bytes (22004, 22023)."""
    code, status = "invalid-key", 400


class SealedError(IdempotencyError):
    """A transaction handle was used after its transaction ended."""
    code = "sealed"


_CLAIM_ERRORS = {"IK409": KeyInProgress, "IK410": KeyGone, "IK422": KeyReused,
                 "22023": InvalidKey, "22004": InvalidKey}


def sqlstate_of(error):
    """The SQLSTATE of a psycopg2 or psycopg 3 error, or of one a Django
    DatabaseError wraps."""
    while error is not None:
        code = getattr(error, "pgcode", None) or getattr(error, "sqlstate", None)
        if code:
            return code
        error = error.__cause__
    return None


def claim_error(error):
    """The package's error for a database error the claim raised, or None."""
    kind = _CLAIM_ERRORS.get(sqlstate_of(error))
    return None if kind is None else kind(str(error).strip())
