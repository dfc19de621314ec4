"""A Python node agent as one would write it: grpcio with generated stubs, default options.

Usage: grpcio_client.py SOCKET PROTO_DIR IMAGE...
Compiles the cri-imaged API with grpc_tools, dials unix://SOCKET with grpcio's default
:authority, checks health (the server and imagemanager.v1.ImageManager), then calls
EnsureImageExists (IfNotPresent) once per IMAGE on one channel. With WATCH_EVENTS=1, it watches
its pod's events first and reads them after, up to the last IMAGE's first event. Prints one JSON
object per line.
"""

import importlib
import json
import os
import sys
import tempfile

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_status import rpc_status
from grpc_tools import protoc
from google.rpc import error_details_pb2


def compile_api(proto_dir, out_dir):
    include = os.path.join(os.path.dirname(protoc.__file__), "_proto")
    args = ["protoc", f"-I{proto_dir}", f"-I{include}", f"--python_out={out_dir}", f"--grpc_python_out={out_dir}"]
    for proto in ("imagemanager/v1/image_manager.proto", "runtime/v1/api.proto"):
        if protoc.main(args + [os.path.join(proto_dir, proto)]) != 0:
            sys.exit(f"protoc failed on {proto}")
    sys.path.insert(0, out_dir)
    return (
        importlib.import_module("imagemanager.v1.image_manager_pb2"),
        importlib.import_module("imagemanager.v1.image_manager_pb2_grpc"),
    )


def error_reason(error):
    status = rpc_status.from_call(error)
    for detail in status.details if status else []:
        info = error_details_pb2.ErrorInfo()
        if detail.Unpack(info):
            return info.reason
    return None


def expand(image):
    """`LONG:N` stands for an image name of N letters: longer than a command line may carry."""
    return "a" * int(image[5:]) if image.startswith("LONG:") else image


def shown(image):
    return image if len(image) <= 100 else f"<{len(image)} bytes>"


def main():
    socket, proto_dir, images = sys.argv[1], sys.argv[2], sys.argv[3:]
    with tempfile.TemporaryDirectory() as out_dir:
        api, api_grpc = compile_api(proto_dir, out_dir)
        with grpc.insecure_channel(f"unix://{socket}") as channel:
            health = health_pb2_grpc.HealthStub(channel)
            for service in ("", "imagemanager.v1.ImageManager"):
                answer = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
                status = health_pb2.HealthCheckResponse.ServingStatus.Name(answer.status)
                print(json.dumps({"health": service, "status": status}), flush=True)
            manager = api_grpc.ImageManagerStub(channel)
            pod = api.PodRef(namespace="default", name="agent", uid="python-agent-uid")
            watching = os.environ.get("WATCH_EVENTS") == "1"
            if watching:
                events = manager.WatchEvents(api.WatchEventsRequest(pod_uid=pod.uid), timeout=30)
                # The response's headers come once the daemon has subscribed the watch.
                events.initial_metadata()
            for image in map(expand, images):
                request = api.EnsureImageExistsRequest(
                    image=image, pull_policy=api.IF_NOT_PRESENT, pod=pod, container_name="app"
                )
                try:
                    answer = manager.EnsureImageExists(request, timeout=10)
                    print(json.dumps({"image": shown(image), "pulled": answer.pulled, "message": answer.message}), flush=True)
                except grpc.RpcError as error:
                    line = {"image": shown(image), "code": error.code().name, "message": error.details()}
                    print(json.dumps(dict(line, reason=error_reason(error))), flush=True)
            if watching:
                for event in events:
                    line = {"event": event.reason, "type": event.type, "image": shown(event.image), "pod": event.pod.uid}
                    print(json.dumps(line), flush=True)
                    if event.image == expand(images[-1]):
                        break
                events.cancel()


if __name__ == "__main__":
    main()
