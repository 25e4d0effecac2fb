"""A gRPC client (grpcio, bytes in and out) making one call, as an application would.

Reads a JSON object from stdin: {"target": "127.0.0.1:port", "method": "/pkg.Svc/M",
"kind": "unary" | "stream" | "bidi", "messages": [text...], "metadata": [[k, v]...],
"retry": bool (service config retrying ABORTED and UNAVAILABLE), "timeout": seconds}.
Prints what the application saw as JSON: {"code", "details", "responses",
"initial_metadata", "trailing_metadata"}.
"""
import json
import sys

import grpc

RETRY = {
    "methodConfig": [
        {
            "name": [{"service": "test.Payments"}],
            "retryPolicy": {
                "maxAttempts": 5,
                "initialBackoff": "0.2s",
                "maxBackoff": "2s",
                "backoffMultiplier": 2,
                "retryableStatusCodes": ["ABORTED", "UNAVAILABLE"],
            },
        }
    ]
}


def pairs(md):
    return [[k, v.decode("latin-1") if isinstance(v, bytes) else v] for k, v in (md or ())]


def main():
    spec = json.load(sys.stdin)
    options = [("grpc.enable_retries", 1 if spec.get("retry") else 0)]
    if spec.get("retry"):
        options.append(("grpc.service_config", json.dumps(RETRY)))
    channel = grpc.insecure_channel(spec["target"], options=options)
    messages = [m.encode() for m in spec.get("messages", [])]
    metadata = [tuple(p) for p in spec.get("metadata", [])]
    timeout = spec.get("timeout", 10)
    kind = spec.get("kind", "unary")
    out = {"responses": []}
    try:
        if kind == "unary":
            stub = channel.unary_unary(spec["method"])
            resp, call = stub.with_call(messages[0], metadata=metadata, timeout=timeout)
            out["responses"] = [resp.decode()]
        elif kind == "stream":
            call = channel.unary_stream(spec["method"])(
                messages[0], metadata=metadata, timeout=timeout
            )
            for r in call:
                out["responses"].append(r.decode())
        else:
            call = channel.stream_stream(spec["method"])(
                iter(messages), metadata=metadata, timeout=timeout
            )
            for r in call:
                out["responses"].append(r.decode())
        out["code"] = call.code().name
        out["details"] = call.details()
        out["initial_metadata"] = pairs(call.initial_metadata())
        out["trailing_metadata"] = pairs(call.trailing_metadata())
    except grpc.RpcError as e:
        out["code"] = e.code().name
        out["details"] = e.details()
        out["initial_metadata"] = pairs(e.initial_metadata())
        out["trailing_metadata"] = pairs(e.trailing_metadata())
    print(json.dumps(out))


if __name__ == "__main__":
    main()
