"""One call through Stripe's official Python client, as an application makes it.

Reads a JSON request on stdin:
  {"api_base": "http://127.0.0.1:PORT", "idempotency_key": "...", "params": {...},
   "headers": {...}, "max_network_retries": 0}
calls stripe.Customer.create(**params, idempotency_key=..., headers=...) against api_base, and
prints what the application saw, as JSON: the object it got back, or the exception it raised.
"""

import json
import sys

import stripe


def main():
    req = json.load(sys.stdin)
    stripe.api_key = "sk_test_dedupe_gateway"
    stripe.api_base = req["api_base"]
    stripe.max_network_retries = req.get("max_network_retries", 0)
    try:
        customer = stripe.Customer.create(
            **req["params"],
            idempotency_key=req["idempotency_key"],
            headers=req.get("headers") or {},
        )
    except stripe.StripeError as e:
        error = e.error
        out = {
            "raised": type(e).__name__,
            "is_idempotency_error": isinstance(e, stripe.IdempotencyError),
            # The old spelling, still exported.
            "is_error_module_idempotency_error": isinstance(e, stripe.error.IdempotencyError),
            "http_status": e.http_status,
            # IdempotencyError keeps no code of its own; the error object has it.
            "code": error.code if error is not None else e.code,
            "type": error.type if error is not None else None,
            "message": e.user_message,
            "retry_after": (e.headers or {}).get("retry-after"),
            "should_retry": (e.headers or {}).get("stripe-should-retry"),
        }
    else:
        response = customer.last_response
        out = {
            "object": customer.to_dict(),
            "http_status": response.code,
            "replayed": response.headers.get("idempotent-replayed"),
        }
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
