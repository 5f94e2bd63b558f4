"""idempotency_pg: retry-safe request handlers on PostgreSQL's idempotency
extension, for psycopg 2/3 and Django (idempotency_pg.django), and for
asyncpg / psycopg 3 async with Starlette and FastAPI (idempotency_pg.aio,
idempotency_pg.starlette)."""
from .db import Claim, Sealable, claim, complete, release, set_ttl, set_wait_timeout, with_idempotency
from .errors import IdempotencyError, InvalidKey, KeyGone, KeyInProgress, KeyReused, SealedError
from .fingerprint import canonical_json, fingerprint, fingerprint_of_parts, wsgi_fingerprint
from .key import MAX_KEY_BYTES, parse_key, read_key
from .log import LOGGER_NAME, key_ref
from .problems import DEFAULT_PROBLEM_BASE
from .scope import NO_PRINCIPAL_ERRORS, SHARED_KEYS, scope_text, scoped_key
from .policy import DEFAULT_VALIDATION_STATUSES, NEVER_STORED, is_stored
from .stored import decode_body, stored_document

__version__ = "1.1.0"

__all__ = [
    "Claim", "Sealable", "claim", "complete", "release", "set_ttl", "set_wait_timeout", "with_idempotency",
    "IdempotencyError", "InvalidKey", "KeyGone", "KeyInProgress", "KeyReused", "SealedError",
    "canonical_json", "fingerprint", "fingerprint_of_parts", "wsgi_fingerprint",
    "LOGGER_NAME", "key_ref", "DEFAULT_PROBLEM_BASE", "NO_PRINCIPAL_ERRORS",
    "SHARED_KEYS", "scope_text", "scoped_key", "MAX_KEY_BYTES", "parse_key", "read_key", "DEFAULT_VALIDATION_STATUSES", "NEVER_STORED", "is_stored",
    "decode_body", "stored_document", "__version__",
]
