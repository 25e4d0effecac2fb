"""A gRPC server (grpcio, generic handlers: bytes in, bytes out) that counts executions.

Prints "PORT <n>" once it listens on 127.0.0.1. Methods of `test.Payments`:
- Create (unary): answers b"created <n>: <request>", n the execution count of Create;
  metadata `x-test-status` (a code name) fails the call with that status and the message
  "server says <NAME> #<n>", with trailing metadata `x-test-trailer`; `x-test-delay-ms`
  sleeps once the execution is counted.
- List (server streaming): three messages b"item <i> of <request> #<n>".
- Chat (bidi streaming): echoes each message as b"echo <message>", then trailing metadata.
`test.Counter/Get` (unary, never routed) answers the counts as JSON.
"""
import json
import sys
import threading
import time
from concurrent import futures

import grpc

counts = {"Create": 0, "List": 0, "Chat": 0}
lock = threading.Lock()


def count(name):
    with lock:
        counts[name] += 1
        return counts[name]


def meta(context, name):
    for k, v in context.invocation_metadata():
        if k == name:
            return v
    return None


def create(request, context):
    n = count("Create")
    delay = meta(context, "x-test-delay-ms")
    if delay:
        time.sleep(int(delay) / 1000)
    status = meta(context, "x-test-status")
    context.set_trailing_metadata((("x-test-trailer", "t%d" % n),))
    if status:
        context.abort(getattr(grpc.StatusCode, status), "server says %s #%d" % (status, n))
    return b"created %d: " % n + request


def list_items(request, context):
    n = count("List")
    for i in range(3):
        yield b"item %d of " % i + request + b" #%d" % n


def chat(requests, context):
    count("Chat")
    for m in requests:
        yield b"echo " + m
    context.set_trailing_metadata((("x-chat", "done"),))


def counter(request, context):
    with lock:
        return json.dumps(counts).encode()


def main():
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
    payments = grpc.method_handlers_generic_handler(
        "test.Payments",
        {
            "Create": grpc.unary_unary_rpc_method_handler(create),
            "List": grpc.unary_stream_rpc_method_handler(list_items),
            "Chat": grpc.stream_stream_rpc_method_handler(chat),
        },
    )
    counter_service = grpc.method_handlers_generic_handler(
        "test.Counter", {"Get": grpc.unary_unary_rpc_method_handler(counter)}
    )
    server.add_generic_rpc_handlers((payments, counter_service))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print("PORT %d" % port, flush=True)
    # Until the test closes stdin (or dies).
    sys.stdin.read()
    server.stop(0)


if __name__ == "__main__":
    main()
