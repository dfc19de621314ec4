"""cri_calls.py: the integration tests' Python grpcio client, a generic runner of unary and
server-streaming calls.

Usage: python3 cri_calls.py SOCKET PROTO_DIR < CALLS

Loads runtime/v1/api.proto and imagemanager/v1/image_manager.proto from PROTO_DIR (compiled by
grpc_tools' protoc once per content of the protos and library version, into a descriptor set
cached in the temp dir) and dials unix://SOCKET with grpcio's default options, as a node agent
would. CALLS (stdin) is a JSON array of
  {"method": "runtime.v1.ImageService/PullImage", "request": {...}, "timeout_ms": N, "cancel_after_ms": N}
any unary or server-streaming method of the protos' services; request uses the proto's field
names (64-bit integers as strings, enums by name); timeout_ms is the call's deadline (default
60000); with cancel_after_ms the client itself cancels the call after that long (unary calls).
Instead of request, "raw": BASE64 makes a call no proto describes: those bytes are the request,
and the response is printed as base64; with "stream": true it is server-streaming. "metadata":
{"key": "value"} is sent with the call. The calls are made in order over one channel, each
awaited before the next. Prints one JSON line per call, keys sorted:
  {"ok": RESPONSE}  or  {"error": {"code": "NOT_FOUND", "message": "..."}}
where a server-streaming call's RESPONSE is the list of its messages (none are printed when it
fails, as the kubelet keeps none of a failed stream).
RESPONSE is protobuf's JSON mapping with the proto's field names (json_format.MessageToDict:
64-bit integers as strings, enums by name, bytes in base64, fields at their default left out,
Timestamp and Duration as RFC 3339 / "1.5s" strings), whole doubles printed as integers (as
JavaScript does); code is the status code's name, message its details. Exits 0 when every call
was made, failed or not; 2, before any call, on bad input or protos that do not load.
"""

import base64
import binascii
import hashlib
import json
import os
import shutil
import sys
import tempfile

import grpc
import google.protobuf as protobuf
from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory
from google.protobuf import duration_pb2, timestamp_pb2  # noqa: F401 (the imports' descriptors)
from google.protobuf.message import DecodeError
from grpc_tools import grpc_version

PROTOS = ("runtime/v1/api.proto", "imagemanager/v1/image_manager.proto")  # dependencies first
KEYS = {"method", "request", "timeout_ms", "cancel_after_ms", "raw", "stream", "metadata"}


def fail(message):
    sys.stderr.write(f"cri_calls.py: {message}\n")
    sys.exit(2)


def descriptor_set(proto_dir):
    """The protos' serialized FileDescriptorSet, compiled when the cache has none for them."""
    digest = hashlib.sha256(f"{grpc_version.VERSION} {protobuf.__version__}".encode())
    for proto in PROTOS:
        with open(os.path.join(proto_dir, proto), "rb") as source:
            digest.update(proto.encode() + b"\0" + source.read() + b"\0")
    cache = os.path.join(tempfile.gettempdir(), f"cri_calls-{digest.hexdigest()[:24]}.pb")
    try:
        if os.stat(cache).st_uid == os.getuid():  # someone else's file is not trusted
            with open(cache, "rb") as cached:
                return cached.read()
    except FileNotFoundError:
        pass
    from grpc_tools import protoc

    # Compiled into a fresh directory, then renamed into place: a runner alongside never reads half a file.
    work = tempfile.mkdtemp(prefix="cri_calls.")
    try:
        out = os.path.join(work, "set.pb")
        include = os.path.join(os.path.dirname(protoc.__file__), "_proto")
        if protoc.main(["protoc", f"-I{proto_dir}", f"-I{include}", f"--descriptor_set_out={out}", *PROTOS]) != 0:
            fail(f"protoc failed on {PROTOS} in {proto_dir}")
        with open(out, "rb") as compiled:
            data = compiled.read()
        try:
            os.replace(out, cache)
        except OSError:
            pass  # another user's file: used by nobody here, left alone
        return data
    finally:
        shutil.rmtree(work, ignore_errors=True)


def load(proto_dir):
    """Every unary and server-streaming method by `package.Service/Method`: (request class, response
    class, whether the response is a stream)."""
    pool = descriptor_pool.Default()
    for file in descriptor_pb2.FileDescriptorSet.FromString(descriptor_set(proto_dir)).file:
        pool.AddSerializedFile(file.SerializeToString())
    methods = {}
    for proto in PROTOS:
        for service in pool.FindFileByName(proto).services_by_name.values():
            for method in service.methods:
                if not method.client_streaming:
                    classes = map(message_factory.GetMessageClass, (method.input_type, method.output_type))
                    methods[f"{service.full_name}/{method.name}"] = (*classes, method.server_streaming)
    return methods


def parse(calls, methods):
    """The calls as (method, request, timeout in s, cancel after s or None, response class or None
    for raw bytes, whether the response is a stream, metadata)."""
    if not isinstance(calls, list):
        fail("the calls must be a JSON array")
    parsed = []
    for i, call in enumerate(calls):
        if not isinstance(call, dict) or not KEYS.issuperset(call) or not isinstance(call.get("method"), str):
            fail(f"call {i}: an object with a method and only {sorted(KEYS)} expected: {json.dumps(call)[:300]}")
        metadata = call.get("metadata") or {}
        if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
            fail(f"call {i}: metadata is an object of strings")
        if "raw" in call:
            if "request" in call or not isinstance(call["raw"], str) or call.get("stream", False) not in (True, False):
                fail(f"call {i}: raw is base64 in place of request, stream true or false")
            try:
                request = base64.b64decode(call["raw"], validate=True)
            except binascii.Error as error:
                fail(f"call {i}: raw is not base64: {error}")
            response_class, streaming = None, call.get("stream", False)
        else:
            if "stream" in call:
                fail(f"call {i}: stream goes with raw; a proto method's shape is its own")
            if call["method"] not in methods:
                fail(f"call {i}: no unary or server-streaming method {call['method']!r} in {PROTOS}")
            request_class, response_class, streaming = methods[call["method"]]
            try:
                request = json_format.ParseDict(call.get("request") or {}, request_class())
            except json_format.ParseError as error:
                fail(f"call {i}: bad {request_class.DESCRIPTOR.full_name}: {error}")
        times = [call.get(key) for key in ("timeout_ms", "cancel_after_ms")]
        if any(t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or t < 0) for t in times):
            fail(f"call {i}: timeout_ms and cancel_after_ms are numbers of milliseconds")
        if streaming and times[1] is not None:
            fail(f"call {i}: cancel_after_ms is for unary calls")
        timeout = (60000 if times[0] is None else times[0]) / 1000
        cancel_after = None if times[1] is None else times[1] / 1000
        parsed.append((call["method"], request, timeout, cancel_after, response_class, streaming, list(metadata.items())))
    return parsed


def whole(value):
    """JavaScript's printing of numbers: a double with an integral value is an integer."""
    if isinstance(value, dict):
        return {key: whole(item) for key, item in value.items()}
    if isinstance(value, list):
        return [whole(item) for item in value]
    return int(value) if isinstance(value, float) and value.is_integer() else value


def printable(response, response_class):
    """A response as printed: protobuf's JSON mapping, or base64 for raw bytes."""
    if response_class is None:
        return base64.b64encode(response).decode()
    return whole(json_format.MessageToDict(response, preserving_proto_field_name=True))


def make(channel, method, request, timeout, cancel_after, response_class, streaming, metadata):
    raw = response_class is None
    serialize = None if raw else type(request).SerializeToString
    deserialize = None if raw else response_class.FromString
    if streaming:
        stub = channel.unary_stream(f"/{method}", serialize, deserialize)
        received = []
        try:
            for response in stub(request, timeout=timeout, metadata=metadata):
                received.append(printable(response, response_class))
        except grpc.RpcError as error:
            return {"error": {"code": error.code().name, "message": error.details() or ""}}
        return {"ok": received}
    stub = channel.unary_unary(f"/{method}", serialize, deserialize)
    future = stub.future(request, timeout=timeout, metadata=metadata)
    if cancel_after is not None:
        try:
            future.result(timeout=cancel_after)
        except grpc.FutureTimeoutError:
            future.cancel()
        except (grpc.RpcError, grpc.FutureCancelledError):
            pass
    if future.code() == grpc.StatusCode.OK:
        return {"ok": printable(future.result(), response_class)}
    return {"error": {"code": future.code().name, "message": future.details() or ""}}


def main():
    if len(sys.argv) != 3:
        fail("usage: python3 cri_calls.py SOCKET PROTO_DIR < CALLS")
    socket, proto_dir = sys.argv[1:]
    try:
        calls = json.load(sys.stdin.buffer)
    except ValueError as error:
        fail(f"the calls are not JSON: {error}")
    try:
        methods = load(proto_dir)
    except (OSError, TypeError, KeyError, DecodeError) as error:
        fail(f"cannot load {PROTOS} from {proto_dir}: {error}")
    calls = parse(calls, methods)
    sys.stdout.reconfigure(encoding="utf-8")
    with grpc.insecure_channel(f"unix://{os.path.abspath(socket)}") as channel:
        for call in calls:
            answer = make(channel, *call)
            print(json.dumps(answer, sort_keys=True, ensure_ascii=False, separators=(",", ":")), flush=True)


if __name__ == "__main__":
    main()
