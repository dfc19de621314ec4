"""Makes gRPC calls with Python grpcio, as a node agent would: default channel options.

Usage: cri_calls.py SOCKET PROTO_DIR < CALLS

CALLS is a JSON array of {"method": "package.Service/Method", "request": {...},
"timeout_ms": N, "cancel_after_ms": N}: any unary method of runtime/v1/api.proto or
imagemanager/v1/image_manager.proto under PROTO_DIR, the request with the proto's field names;
timeout_ms is the call's deadline (default 60000), cancel_after_ms has the client cancel the call
itself. The calls are made in order over one channel to unix://SOCKET, each awaited before the
next. Prints one JSON line per call: {"ok": RESPONSE} (proto field names, 64-bit integers as
strings, enums by name, defaults left out) or {"error": {"code": "NOT_FOUND", "message": "..."}}.
Exits non-zero only when the calls cannot be made at all (bad input, protos that do not compile).

The stubs are compiled once per content of the protos, into a cache under the temp dir.
"""

import hashlib
import importlib
import json
import os
import shutil
import sys
import tempfile
import threading

import grpc
from google.protobuf import json_format
from grpc_tools import protoc

PROTOS = ("runtime/v1/api.proto", "imagemanager/v1/image_manager.proto")


def compiled_stubs(proto_dir):
    """The directory of the stubs for these protos, compiled the first time."""
    digest = hashlib.sha256()
    for proto in PROTOS:
        with open(os.path.join(proto_dir, proto), "rb") as source:
            digest.update(source.read())
    cache = os.path.join(tempfile.gettempdir(), f"cri-imaged-grpcio-stubs-{digest.hexdigest()[:16]}")
    if not os.path.isdir(cache):
        # Compiled aside and renamed into place: a runner alongside never sees half a cache.
        work = tempfile.mkdtemp(prefix="cri-imaged-grpcio-stubs.")
        include = os.path.join(os.path.dirname(protoc.__file__), "_proto")
        for proto in PROTOS:
            args = ["protoc", f"-I{proto_dir}", f"-I{include}", f"--python_out={work}", os.path.join(proto_dir, proto)]
            if protoc.main(args) != 0:
                sys.exit(f"cri_calls.py: protoc failed on {proto}")
        try:
            os.rename(work, cache)
        except OSError:
            shutil.rmtree(work, ignore_errors=True)  # another runner was first
    return cache


def methods(proto_dir):
    """Every unary method, by `package.Service/Method`: (request class, response class)."""
    sys.path.insert(0, compiled_stubs(proto_dir))
    found = {}
    for proto in PROTOS:
        module = importlib.import_module(proto[: -len(".proto")].replace("/", ".") + "_pb2")
        for service in module.DESCRIPTOR.services_by_name.values():
            for method in service.methods:
                if method.client_streaming or method.server_streaming:
                    continue
                request = getattr(module, method.input_type.name, None) or class_of(method.input_type)
                response = getattr(module, method.output_type.name, None) or class_of(method.output_type)
                found[f"{service.full_name}/{method.name}"] = (request, response)
    return found


def class_of(descriptor):
    from google.protobuf import message_factory

    return message_factory.GetMessageClass(descriptor)


def make_call(channel, known, call):
    method = call["method"]
    if method not in known:
        sys.exit(f"cri_calls.py: no unary method {method!r}")
    request_class, response_class = known[method]
    request = json_format.ParseDict(call.get("request", {}), request_class())
    stub = channel.unary_unary(
        "/" + method, request_serializer=request_class.SerializeToString, response_deserializer=response_class.FromString
    )
    future = stub.future(request, timeout=call.get("timeout_ms", 60000) / 1000)
    cancel_after = call.get("cancel_after_ms")
    if cancel_after is not None:
        threading.Timer(cancel_after / 1000, future.cancel).start()
    try:
        response = future.result()
        return {"ok": json_format.MessageToDict(response, preserving_proto_field_name=True)}
    except grpc.FutureCancelledError:
        return {"error": {"code": "CANCELLED", "message": "cancelled by the client"}}
    except grpc.RpcError as error:
        return {"error": {"code": error.code().name, "message": error.details() or ""}}


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: cri_calls.py SOCKET PROTO_DIR < CALLS")
    socket, proto_dir = sys.argv[1], sys.argv[2]
    calls = json.load(sys.stdin)
    if not isinstance(calls, list):
        sys.exit("cri_calls.py: the calls are a JSON array")
    known = methods(proto_dir)
    with grpc.insecure_channel(f"unix://{socket}") as channel:
        for call in calls:
            print(json.dumps(make_call(channel, known, call), sort_keys=True), flush=True)


if __name__ == "__main__":
    main()
