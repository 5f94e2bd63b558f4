"""Keeps each API client's keys apart. The database scopes keys by role, and
an application calls it as one pool role for every client; so the key the
decorators send to the database is derived from the request's scope (its
principal: the user, API client or tenant it comes from) and the client's
Idempotency-Key, by one rule shared with the Node package
(packages/shared/scope-vectors.json holds its vectors):

    "§" S ":" key       when that is at most 255 bytes of UTF-8
    "§" S "#" H         otherwise

- S: the first 32 hex digits (lower case) of SHA-256 over the scope's UTF-8
  text; a scope is a non-empty str, or an int written in decimal;
- H: the 64 hex digits of SHA-256 over the key's UTF-8 text.

"§" (U+00A7) is not printable ASCII, so no Idempotency-Key header holds it:
a client's key can never be another client's derived key, even on a route
whose keys are shared. The derived key is what idempotency.lookup() and the
stored rows show."""
import hashlib

from .key import MAX_KEY_BYTES


class _SharedKeys:
    """The opt-out: a route whose keys are shared by every client that calls
    it (one trusted caller, say): scope=SHARED_KEYS."""

    __slots__ = ()

    def __repr__(self):
        return "SHARED_KEYS"


SHARED_KEYS = _SharedKeys()


# What a scope function raises when the request has no principal, answered
# 401 principal-required like a None: AttributeError (request.state.user
# unset, None.id), LookupError (a missing header or claim: KeyError,
# IndexError) and NotImplementedError (Starlette's UnauthenticatedUser has
# no identity). Anything else (TypeError, Starlette's AssertionError for a
# missing AuthenticationMiddleware, Django's ImproperlyConfigured, an
# HTTPException) is a fault or an answer of its own, and propagates.
NO_PRINCIPAL_ERRORS = (AttributeError, LookupError, NotImplementedError)


def _sha256hex(text):
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def scope_text(scope):
    """The scope's text: a non-empty str, or an int in decimal. None and ''
    mean "no principal" and give None."""
    if scope is None or scope == "":
        return None
    if isinstance(scope, str):
        return scope
    if isinstance(scope, int) and not isinstance(scope, bool):
        return str(scope)
    raise TypeError(f"an idempotency scope must be a str or an int, not {type(scope).__name__}")


def scoped_key(scope, key):
    """The database key of a client's key within a scope (SHARED_KEYS: the
    key itself)."""
    if scope is SHARED_KEYS:
        return key
    text = scope_text(scope)
    if text is None:
        raise TypeError("scoped_key(scope, key): the scope is empty")
    prefix = "\u00a7" + _sha256hex(text)[:32]
    plain = f"{prefix}:{key}"
    return plain if len(plain.encode("utf-8")) <= MAX_KEY_BYTES else f"{prefix}#{_sha256hex(key)}"
