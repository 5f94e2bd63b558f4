"""The card processor that captures successful payments. This example has no
real one; tests replace capture() to make the processor fail."""


def capture(payment):
    """Captures the payment at the processor; raises when it cannot."""
