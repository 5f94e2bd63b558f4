"""Keys a test retries after their response expired: claimed with
SHORT_TTL, then, once lookup says 'gone', a retry of the same request gets
IK410 (within idempotency.remember) and another request IK422. Long enough
that the first request commits within it on a loaded machine."""
import time

SHORT_TTL = "1 second"


def wait_until_gone(state_of, key, timeout=15):
    """Waits until state_of(key), the key's lookup state, is 'gone'."""
    deadline = time.monotonic() + timeout
    while state_of(key) != "gone":
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for key {key!r} to be gone")
        time.sleep(0.02)
