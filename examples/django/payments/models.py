from django.db import models


class Account(models.Model):
    owner = models.CharField(max_length=100)
    balance_cents = models.BigIntegerField()


class Payment(models.Model):
    """One payment attempt, declined ones included. Nothing in the table ties
    a payment to a request: exactly-once is the idempotency key's job."""

    class Status(models.TextChoices):
        SUCCEEDED = "succeeded"
        DECLINED = "declined"

    account = models.ForeignKey(Account, on_delete=models.PROTECT, related_name="payments")
    amount_cents = models.BigIntegerField()
    status = models.CharField(max_length=10, choices=Status.choices)
    created_at = models.DateTimeField(auto_now_add=True)
