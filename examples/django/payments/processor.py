"""The card processor that captures successful payments. This example has no
real one; tests replace capture() to make the processor fail."""


class Unavailable(Exception):
    """The processor cannot take payments now; the same request may be
    retried later."""


def capture(payment):
    """Captures the payment at the processor; raises Unavailable when it
    cannot."""
