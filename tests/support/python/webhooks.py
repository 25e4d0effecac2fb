"""The providers' own libraries, for the gateway's webhook tests (tests/webhooks.rs).

Reads one JSON request on stdin, answers one JSON value on stdout:

  {"op": "sign-standard", "secret": S, "id": I, "timestamp": T, "body": B}
      -> the webhook-signature value the standardwebhooks library makes
  {"op": "verify-standard", "secrets": [S...], "deliveries": [{"headers": {...}, "body": B}...]}
      -> for each delivery, whether the standardwebhooks library accepts it under any secret
  {"op": "verify-stripe", "secrets": [S...], "tolerance": N, "deliveries": [{"header": H, "body": B}...]}
      -> for each delivery, whether stripe.Webhook.construct_event accepts it under any secret

(A list at a time: importing stripe takes most of a second.)

Run by scripts/test's virtual environment (target/pyenv), which has both libraries.
"""

import json
import sys
from datetime import datetime, timezone


def sign_standard(req):
    from standardwebhooks.webhooks import Webhook

    at = datetime.fromtimestamp(req["timestamp"], tz=timezone.utc)
    return Webhook(req["secret"]).sign(req["id"], at, req["body"])


def verify_standard(req):
    from standardwebhooks.webhooks import Webhook, WebhookVerificationError

    def accepted(delivery):
        for secret in req["secrets"]:
            try:
                Webhook(secret).verify(delivery["body"], delivery["headers"])
                return True
            except WebhookVerificationError:
                pass
        return False

    return [accepted(d) for d in req["deliveries"]]


def verify_stripe(req):
    import stripe

    def accepted(delivery):
        for secret in req["secrets"]:
            try:
                stripe.Webhook.construct_event(
                    delivery["body"], delivery["header"], secret, tolerance=req["tolerance"]
                )
                return True
            except stripe.SignatureVerificationError:
                pass
        return False

    return [accepted(d) for d in req["deliveries"]]


OPS = {
    "sign-standard": sign_standard,
    "verify-standard": verify_standard,
    "verify-stripe": verify_stripe,
}


def main():
    req = json.load(sys.stdin)
    json.dump(OPS[req["op"]](req), sys.stdout)


if __name__ == "__main__":
    main()
