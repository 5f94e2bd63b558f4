import json

from django.http import JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST
from idempotency_pg.django import SHARED_KEYS, idempotent

from . import processor
from .models import Account, Payment


def payment_json(payment, status):
    return JsonResponse({
        "payment_id": payment.pk,
        "account_id": payment.account_id,
        "amount_cents": payment.amount_cents,
        "status": payment.status,
        "balance_cents": payment.account.balance_cents,
    }, status=status)


def parse_payment(body):
    """(account_id, amount_cents), or None when the body is not valid."""
    try:
        data = json.loads(body)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    account_id, amount = data.get("account_id"), data.get("amount_cents")
    if type(account_id) is not int or type(amount) is not int or amount <= 0:
        return None
    return account_id, amount


@csrf_exempt  # an API for token-authenticated clients, not a cookie-session form
@require_POST
# The example has no user accounts, so its keys are shared by every client.
# With users, the bare @idempotent scopes each user's keys to that user
# (request.user), so that one user's key never replays another's answer.
@idempotent(scope=SHARED_KEYS)
def create_payment(request):
    """Pays amount_cents from an account. Insufficient funds is an answer
    too (402), kept with its declined payment and replayed to retries; an
    unavailable processor is 503, so nothing is kept and a retry pays again."""
    parsed = parse_payment(request.body)
    if parsed is None:
        return JsonResponse({"title": 'The body must be {"account_id": <int>, "amount_cents": <int > 0>}'},
                            status=400)
    account_id, amount = parsed
    account = Account.objects.select_for_update().filter(pk=account_id).first()
    if account is None:
        return JsonResponse({"title": f"No account {account_id}"}, status=404)

    if account.balance_cents < amount:
        payment = Payment.objects.create(account=account, amount_cents=amount,
                                         status=Payment.Status.DECLINED)
        return payment_json(payment, 402)

    account.balance_cents -= amount
    account.save(update_fields=["balance_cents"])
    payment = Payment.objects.create(account=account, amount_cents=amount,
                                     status=Payment.Status.SUCCEEDED)
    try:
        processor.capture(payment)
    except processor.Unavailable:
        return JsonResponse({"title": "The card processor is unavailable; retry later"},
                            status=503, headers={"Retry-After": "1"})
    response = payment_json(payment, 201)
    response["Location"] = f"/payments/{payment.pk}"
    return response
