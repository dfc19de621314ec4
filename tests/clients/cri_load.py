"""cri_load.py: the bench's Python grpcio caller, one unary call made back to back on command.

Usage: python3 cri_load.py SOCKET PROTO_DIR CALL

CALL is one call as cri_calls.py takes it ({"method": ..., "request": {...}}), or @FILE holding
it (a request too big for the command line). Dials
unix://SOCKET with grpcio's default options, as a node agent would, and makes the call once (a
failure exits 2). Then, for each line on stdin holding a number of seconds, makes the call back
to back for that long and prints one JSON line: {"latencies_us": [...], "errors": N,
"first_error": "..."}. Exits 0 at the end of stdin.
"""

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import grpc  # noqa: E402

import cri_calls  # noqa: E402


def main():
    if len(sys.argv) != 4:
        cri_calls.fail("usage: cri_load.py SOCKET PROTO_DIR CALL")
    socket, proto_dir, call = sys.argv[1:]
    try:
        if call.startswith("@"):
            with open(call[1:], encoding="utf-8") as file:
                call = file.read()
        call = json.loads(call)
    except json.JSONDecodeError as error:
        cri_calls.fail(f"CALL is not JSON: {error}")
    [(method, request, timeout, _, response_class, streaming, _)] = cri_calls.parse([call], cri_calls.load(proto_dir))
    if streaming or response_class is None:
        cri_calls.fail(f"{method}: cri_load.py makes unary calls of the protos")
    with grpc.insecure_channel(f"unix://{socket}") as channel:
        stub = channel.unary_unary(f"/{method}", type(request).SerializeToString, response_class.FromString)
        try:
            stub(request, timeout=timeout)
        except grpc.RpcError as error:
            cri_calls.fail(f"{method}: {error.code().name}: {error.details()}")
        for line in sys.stdin:
            seconds = float(line)
            latencies, errors, first_error = [], 0, ""
            end = time.perf_counter() + seconds
            while (sent := time.perf_counter()) < end:
                try:
                    stub(request, timeout=timeout)
                    latencies.append(int((time.perf_counter() - sent) * 1e6))
                except grpc.RpcError as error:
                    errors += 1
                    first_error = first_error or f"{error.code().name}: {error.details()}"
            print(json.dumps({"latencies_us": latencies, "errors": errors, "first_error": first_error}), flush=True)


if __name__ == "__main__":
    main()
