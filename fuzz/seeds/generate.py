#!/usr/bin/env python3
"""Writes the fuzz targets' seed corpora (fuzz/seeds/<target>/) from the unit tests' tables.

Each seed is an input the unit tests use (their source is named beside it), in the target's
input format (see each fuzz_targets/<target>.rs). Run it again after changing a table here; the
files it writes are committed, the corpora that fuzzing grows are not.
"""

import base64
import hashlib
import json
import pathlib
import shutil
import struct

SEEDS = pathlib.Path(__file__).resolve().parent

SHA256_FF = "sha256:" + "f" * 64
SHA512_FF = "sha512:" + "f" * 128
HEX64 = "1a3f5e7d9c1b3a5f7e9d1c3b5a7f9e1d3c5b7a9f1e3d5d7c9b1a3f5e7d9c1b3a"


def write(target, seeds):
    directory = SEEDS / target
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    for seed in seeds:
        data = seed if isinstance(seed, bytes) else seed.encode()
        (directory / hashlib.sha1(data).hexdigest()).write_bytes(data)


# --- protobuf, as much as the requests need -------------------------------------------------


def varint(value):
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def field_bytes(number, data):
    data = data.encode() if isinstance(data, str) else data
    return varint(number << 3 | 2) + varint(len(data)) + data


def field_varint(number, value):
    return varint(number << 3) + varint(value)


def string_map(number, entries):
    return b"".join(field_bytes(number, field_bytes(1, key) + field_bytes(2, value)) for key, value in entries.items())


# --- image references: src/reference/tests.rs --------------------------------------------------

REFERENCES = [
    "test_com",
    "test.com:tag",
    "test:5000/repo:tag@" + SHA256_FF,
    "lowercase:Uppercase",
    "sub-dom1.foo.com/bar/baz/quux:some-long-tag",
    "b.gcr.io/test.example.com/my-app:test.example.com",
    "xn--7o8h.com/myimage:xn--7o8h.com@" + SHA512_FF,
    "foo/foo_bar.com:8080",
    "192.168.1.1:5000/repo:5050",
    "[2001:db8::1]:5000/repo:tag@" + SHA256_FF,
    "[::1]:5000/repo",
    "validname@sha384:" + "f" * 96,
    "",
    ":justtag",
    "@" + SHA256_FF,
    "repo@sha256:ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff",
    "validname@invaliddigest:" + "f" * 64,
    "Uppercase:tag",
    "aa/asdf$$^/aa",
    "[fe80::1%eth0]:5000/repo",
    "[2001:db8::1]:tag",
    "a" * 256,
    "docker.io/library/busybox",
    "index.docker.io/library/busybox:1.36",
    "busybox",
    "localhost:5000/app",
    "registry.local:5000/team/app@sha256:e6693c20186f837fc393390135d8a598a96a833917917789d63766cab6c59582",
    "library/ubuntu:latest",
    HEX64,
    "Docker.io/Library/Foo",
]

# --- EnsureImageExists: src/server/request.rs, src/credentials/secrets.rs ---------------------

AUTH = "dXNlcjpwYXNzd29yZA=="  # user:password


def pull_secret(name, content, kind="kubernetes.io/dockerconfigjson", namespace="team", uid="6c1d"):
    return field_bytes(
        5,
        field_bytes(1, name)
        + field_bytes(2, namespace)
        + field_bytes(3, content)
        + field_bytes(4, uid)
        + field_bytes(5, kind),
    )


def pod(namespace="default", name="web", uid="4f2a", annotations=None):
    body = field_bytes(1, namespace) + field_bytes(2, name) + field_bytes(3, uid)
    return field_bytes(3, body + string_map(4, annotations or {}))


def sandbox(field_number, name="web", uid="4f2a", namespace="default"):
    metadata = field_bytes(1, name) + field_bytes(2, uid) + field_bytes(3, namespace) + field_varint(4, 1)
    return field_bytes(field_number, field_bytes(1, metadata) + field_bytes(2, "web-0"))


CONFIG_JSON = json.dumps({"auths": {"registry.example.com": {"auth": AUTH}}})
DOCKERCFG = json.dumps({"registry.example.com": {"username": "user", "password": "password"}})

ENSURE_REQUESTS = [
    b"",
    field_bytes(1, "busybox"),
    field_bytes(1, "busybox") + field_varint(2, 9),
    field_bytes(1, "busybox") + field_varint(2, 1),
    field_bytes(1, "registry.example.com/team/app:1.0") + field_varint(2, 2) + pod() + field_bytes(4, "app"),
    field_bytes(1, "busybox") + pull_secret("regcred", '{"auths": {}}', kind="kubernetes.io/dockercfg"),
    field_bytes(1, "registry.example.com/team/app")
    + field_varint(2, 2)
    + pod(annotations={"io.kubernetes.cri.x": "1"})
    + pull_secret("regcred", CONFIG_JSON)
    + pull_secret("old", DOCKERCFG, kind="kubernetes.io/dockercfg")
    + pull_secret("other", "not json", kind="Opaque")
    + field_bytes(6, "runc")
    + sandbox(7),
    field_bytes(1, "registry.example.com/team/app") + pull_secret("broken", '{"auths": ["hunter2"]}'),
    field_bytes(1, "Invalid/Name") + field_varint(2, 3),
    # src/messages.rs: a long name is echoed bounded.
    field_bytes(1, "registry.example.com/" + "a" * 300),
    field_bytes(1, HEX64),
]

# --- CRI PullImage: src/server/cri_image_service.rs, src/pull/key.rs -------------------------


def image_spec(image, runtime_handler="", annotations=None):
    body = field_bytes(1, image) + string_map(2, annotations or {})
    if runtime_handler:
        body += field_bytes(19, runtime_handler)
    return field_bytes(1, body)


def auth_config(**fields):
    numbers = {"username": 1, "password": 2, "auth": 3, "server_address": 4, "identity_token": 5, "registry_token": 6}
    return field_bytes(2, b"".join(field_bytes(numbers[name], value) for name, value in fields.items()))


CRI_PULLS = [
    b"",
    image_spec("busybox"),
    image_spec("docker.io/library/busybox:latest"),
    image_spec("busybox") + auth_config(username="alice", password="secret"),
    image_spec("registry.local:5000/app", runtime_handler="runc") + auth_config(auth=AUTH, server_address="registry.local:5000"),
    image_spec("registry.local:5000/app@" + SHA256_FF, annotations={"a": "b"}) + auth_config(identity_token="t") + sandbox(3),
    image_spec("sha256:" + HEX64),
    image_spec("not a reference!"),
]

# --- docker config and keyring: src/credentials/dockercfg/tests.rs, keyring/tests.rs --------


def docker_config(shape, image, document):
    return bytes([shape]) + image.encode() + b"\n" + document.encode()


CONFIG_JSON_SHAPE, DOCKERCFG_SHAPE = 0, 1
REGISTRIES = {
    "http://foo.example.com": {"username": "foo", "password": "bar", "email": "foo@example.com"},
    "http://bar.example.com": {"username": "bar", "password": "baz", "email": "bar@example.com"},
}
DOCKER_CONFIGS = [
    docker_config(CONFIG_JSON_SHAPE, "foo.example.com/app", json.dumps({"auths": REGISTRIES, "HttpHeaders": {"X-Ignored": "1"}})),
    docker_config(DOCKERCFG_SHAPE, "bar.example.com/app", json.dumps(REGISTRIES)),
    docker_config(DOCKERCFG_SHAPE, "registry.local/app", json.dumps({"registry.local": {"auth": "Zm9vOmJhcg==", "email": "foo@example.com"}})),
    docker_config(DOCKERCFG_SHAPE, "registry.local", json.dumps({"registry.local": {"username": "foo", "password": "bar", "auth": "cGluZzpwb25n"}})),
    docker_config(DOCKERCFG_SHAPE, "registry.local", json.dumps({"registry.local": {"Username": "foo", "PASSWORD": "bar"}})),
    docker_config(DOCKERCFG_SHAPE, "registry.local", json.dumps({"registry.local": {"auth": "Zm9vOm\nJhcg==\n"}})),
    docker_config(DOCKERCFG_SHAPE, "registry.local", json.dumps({"registry.local": None})),
    docker_config(DOCKERCFG_SHAPE, "registry.local", json.dumps({"registry.local": {"auth": "cGFudHM="}})),
    docker_config(DOCKERCFG_SHAPE, "registry.local", json.dumps({"registry.local": {"auth": "/w=="}})),
    docker_config(DOCKERCFG_SHAPE, "registry.local", '{"r.local": {"password": 1234}}'),
    docker_config(CONFIG_JSON_SHAPE, "busybox", '{"auths": null}'),
    docker_config(CONFIG_JSON_SHAPE, "busybox", '{"credsStore": "desktop"}'),
    docker_config(CONFIG_JSON_SHAPE, "busybox", '{"auths": '),
    docker_config(CONFIG_JSON_SHAPE, "busybox", json.dumps({"auths": {"https://index.docker.io/v1/": {"auth": AUTH}}})),
    docker_config(
        CONFIG_JSON_SHAPE,
        "prefix.kubernetes.io:1111/foo/bar",
        json.dumps({"auths": {"prefix.*.io:1111/foo": {"auth": AUTH}, "*.kubernetes.io:1111": {"auth": AUTH}}}),
    ),
    docker_config(
        CONFIG_JSON_SHAPE,
        "prefix.docker.io/path/subpath",
        json.dumps({"auths": {"https://prefix.*.io/path": {"auth": AUTH}, "https://*.docker.io/v2/": {"auth": AUTH}}}),
    ),
    docker_config(
        CONFIG_JSON_SHAPE,
        "a.b.c.kubernetes.io",
        json.dumps({"auths": {"*.*.*.kubernetes.io": {"auth": AUTH}, "[a-c].b.c.kubernetes.io": {"auth": AUTH}}}),
    ),
    docker_config(
        CONFIG_JSON_SHAPE,
        "[2001:db8::1]:5000/repo",
        json.dumps({"auths": {"[2001:db8::1]:5000": {"auth": AUTH}, "user:pass@registry.local/%41": {"auth": AUTH}}}),
    ),
]

# --- credential-provider responses: src/credentials/plugin/tests.rs, duration.rs ------------

V1, V1BETA1 = 0, 1


def plugin(selector, image, stdout):
    return bytes([selector]) + image.encode() + b"\n" + stdout.encode()


def response(api_version="credentialprovider.kubelet.k8s.io/v1", **fields):
    return json.dumps({"kind": "CredentialProviderResponse", "apiVersion": api_version, **fields})


PLUGIN_AUTH = {"*.registry.io": {"username": "plugin-user", "password": "plugin-pass"}}
PLUGIN_RESPONSES = [
    plugin(V1, "test.registry.io/foo/bar", response(cacheKeyType="Registry", auth=PLUGIN_AUTH)),
    plugin(V1, "test.registry.io/foo/bar", response(cacheKeyType="Image", cacheDuration="12h", auth=PLUGIN_AUTH)),
    plugin(V1, "x.registry.io", response(cacheKeyType="Global", cacheDuration="0s", auth=PLUGIN_AUTH)),
    plugin(V1, "x.registry.io", response(cacheKeyType="Global", cacheDuration="-1m", auth={})),
    plugin(V1, "x", response(cacheKeyType="Global", cacheDuration="1h30m0.5s")),
    plugin(V1, "x", response(cacheKeyType="Global", cacheDuration="2µs")),
    plugin(V1, "x", response(cacheKeyType="Global", cacheDuration="9999999999h")),
    plugin(V1, "x", response(cacheKeyType="Whatever")),
    plugin(V1BETA1, "x", response(cacheKeyType="Image")),
    plugin(V1BETA1, "x", response(api_version="credentialprovider.kubelet.k8s.io/v1beta1", cacheKeyType="Image", cacheDuration=".5s")),
    plugin(V1, "x", json.dumps({"kind": "CredentialProviderRequest", "apiVersion": "credentialprovider.kubelet.k8s.io/v1"})),
    plugin(V1, "x", "not json"),
]

# --- record files: src/records/format.rs, src/records/tests.rs ------------------------------

RECORDS = [
    '{"kind":"ImagePullIntent","apiVersion":"kubelet.config.k8s.io/v1beta1","image":"registry.example.com/team/app:1.0"}\n',
    '{"kind":"ImagePullIntent","apiVersion":"kubelet.config.k8s.io/v1alpha1","image":"repo.repo/test/test:v1"}',
    '{"kind":"ImagePulledRecord","apiVersion":"kubelet.config.k8s.io/v1beta1","lastUpdatedTime":"2025-11-03T10:00:00Z","imageRef":"sha256:4c2f"}\n',
    '{"kind":"ImagePulledRecord","apiVersion":"kubelet.config.k8s.io/v1beta1","lastUpdatedTime":"2025-11-03T10:00:00Z","imageRef":"sha256:4c2f",'
    '"credentialMapping":{"docker.io/testing/test":{"nodePodsAccessible":true},"registry.example.com/team/app":{"kubernetesSecrets":'
    '[{"uid":"6f1c","namespace":"default","name":"pull-secret","credentialHash":"a554"}]}}}\n',
    '{"kind":"ImagePulledRecord","apiVersion":"kubelet.config.k8s.io/v1alpha1","lastUpdatedTime":"2024-10-21T12:26:40Z","imageRef":"testimageref",'
    '"credentialMapping":{"docker.io/testing/test":{"kubernetesServiceAccounts":[{"uid":"u","namespace":"n","name":"sa"}]}}}',
    '{"kind":"ImagePulledRecord","apiVersion":"kubelet.config.k8s.io/v1beta1","lastUpdatedTime":"x","imageRef":"r",'
    '"credentialMapping":{"a":{"kubernetesSecrets":[{"uid":"1","namespace":"n","name":"s","credentialHash":""},'
    '{"uid":"2","namespace":"n","name":"t","credentialHash":"h"}]}}}',
    '{"kind":"ImagePulledRecord","apiVersion":"kubelet.config.k8s.io/v1beta1","lastUpdatedTime":"x","imageRef":"r","kubernetesSecretCoordinates":[]}',
    '{"kind":"ImagePulledRecord","apiVersion":"kubelet.config.k8s.io/v2","lastUpdatedTime":"x","imageRef":"r"}',
    '{"kind":"ImagePulledRecord","apiVersion":"kubelet.config.k8s.io/v1beta1","lastUpdatedTime":"x","imageRef":"r"',
    "",
]

# --- HTTP/2 :authority: src/server/authority/tests.rs, frames/tests.rs ------------------------

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY_FRAME, SETTINGS, PUSH_PROMISE, GOAWAY, CONTINUATION = 0x0, 0x1, 0x2, 0x4, 0x5, 0x7, 0x9
END_STREAM, END_HEADERS, PADDED, PRIORITY = 0x1, 0x4, 0x8, 0x20


def frame(kind, flags, stream, payload):
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def connection(step, *frames, preface=True):
    """The control byte (bit 7: the target prepends the preface; the rest: the piece size)."""
    return bytes([(0x80 if preface else 0) | step]) + b"".join(frames)


# :method POST, :scheme http, :authority /run/x.sock (incrementally indexed), :path /
REQUEST_BLOCK = bytes.fromhex("8386410b") + b"/run/x.sock" + b"\x84"
SOCKET_BLOCK = bytes([0x83, 0x86, 0x41, 20]) + b"/run/cri-imaged.sock" + bytes([0x44, 0x05]) + b"/a/b1"
SETTINGS_FRAME = frame(SETTINGS, 0, 0, bytes([0, 4, 0, 0, 0xFF, 0xFF]))
HUFFMAN_BLOCK = bytes.fromhex("828684418cf1e3c2e5f23a6ba0ab90f4ff")  # RFC 7541 C.4.1: :authority www.example.com

AUTHORITY = [
    connection(0, SETTINGS_FRAME, frame(HEADERS, END_HEADERS, 1, REQUEST_BLOCK), frame(DATA, END_STREAM, 1, b"\0\0\0\0\x05hello")),
    connection(1, SETTINGS_FRAME, frame(HEADERS, END_HEADERS, 1, REQUEST_BLOCK)),
    connection(7, frame(HEADERS, PADDED | PRIORITY | END_STREAM, 3, bytes([3, 0x80, 0, 0, 0, 15]) + REQUEST_BLOCK[:5] + bytes(3)),
               frame(CONTINUATION, 0, 3, REQUEST_BLOCK[5:9]), frame(CONTINUATION, END_HEADERS, 3, REQUEST_BLOCK[9:])),
    connection(5, frame(SETTINGS, 0, 0, b""), frame(HEADERS, PADDED | END_STREAM, 1, bytes([4]) + SOCKET_BLOCK[:3] + bytes(4)),
               frame(CONTINUATION, 0, 1, SOCKET_BLOCK[3:10]), frame(CONTINUATION, END_HEADERS, 1, SOCKET_BLOCK[10:]),
               frame(HEADERS, END_HEADERS | END_STREAM, 3, bytes([0x83, 0x86, 0xBF, 0xBE])), frame(GOAWAY, 0, 0, bytes(8))),
    connection(9, frame(HEADERS, END_HEADERS, 1, HUFFMAN_BLOCK), frame(HEADERS, END_HEADERS, 3, bytes([0x82, 0x86, 0x84, 0xBE]))),
    connection(3, frame(HEADERS, END_HEADERS, 1, bytes([0x3F, 0xE1, 0x1F]) + REQUEST_BLOCK)),  # a table size update to 4096
    connection(0, frame(HEADERS, END_HEADERS, 1, bytes([0x20]) + REQUEST_BLOCK), frame(HEADERS, END_HEADERS, 3, bytes([0x83, 0x86, 0x84]))),
    connection(0, frame(HEADERS, END_HEADERS, 1, bytes([0x83, 0x86, 0x81, 0x84])), frame(PRIORITY_FRAME, 0, 1, bytes(5))),
    connection(0, frame(HEADERS, END_HEADERS, 1, bytes([0x83, 0x86, 0x10, 0x0A]) + b":authority" + bytes([0x03]) + b"a b" + b"\x84")),
    connection(0, frame(HEADERS, 0, 1, REQUEST_BLOCK), frame(DATA, 0, 1, b"x")),
    connection(5, frame(CONTINUATION, END_HEADERS, 1, b"\x82")),
    connection(5, frame(PUSH_PROMISE, END_HEADERS, 1, bytes([0, 0, 0, 2, 0x82]))),
    connection(5, frame(HEADERS, PADDED | END_HEADERS, 1, bytes([9, 0x82]))),
    connection(5, frame(HEADERS, END_HEADERS, 1, bytes([0xBE]))),
    connection(5, frame(HEADERS, END_HEADERS, 1, bytes([0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x7F]))),
    connection(3, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", preface=False),
    connection(0, PREFACE[:10], preface=False),
]


# --- the config file: deploy/cri-imaged.yaml, src/config/file/tests.rs -------------------------

CONFIG_FILES = [
    (SEEDS.parent.parent / "deploy" / "cri-imaged.yaml").read_text(),
    "registry-qps: 0.5\nregistry-burst: 4\npresence-cache: false\nimage-pull-backoff-max: 5m\n"
    "registry-qps-per-host:\n  - docker.io=2:5\n  - quay.io=1:1\n",
    "",
    "# only comments\n",
    "metrics-listen:\nregistry-qps-per-host: []\n",
    "registry-qps: 1\n\nregistryBurst: 4\n",
    "image_gc_period: 1m\n",
    "\"quoted-field\": 1\n",
    "{colour: blue}",
    "listen: /run/x.sock\nworker-threads: 0\n",
    "presence-cache: yes\n",
    "registry-rate-limit-mode: sometimes\n",
    "shutdown-timeout: 0s\n",
    "registry-qps-per-host:\n  - docker.io=0:5\n",
    "registry-qps: [1, 2]\n",
    "registry-qps: {a: 1}\n",
    "registry-qps-per-host: [[docker.io=1:1]]\n",
    "- registry-qps\n",
    "registry-qps: [\n",
    "registry-qps: 1\nregistry-qps: 2\n",
    "config: other.yaml\n",
    "image-pull-backoff-initial: 10m\nimage-pull-backoff-max: 1m\n",
    "image-gc-high-threshold: 50\nimage-gc-low-threshold: 80\n",
    "image-credential-provider-config: /etc/providers.yaml\n",
    "serialize-image-pulls: true\nmax-parallel-image-pulls: 4\n",
    "a: &x [1, 2]\nb: *x\n",
]

# src/policy/sigstore/testdata: the test keys and the openssl-made test vector.
TESTDATA = SEEDS.parent.parent / "src" / "policy" / "sigstore" / "testdata"
P256_DATA = base64.b64encode((TESTDATA / "p256.pub").read_bytes()).decode()

# src/policy/tests.rs: containers-policy.json(5) documents, each after an image to judge.
POLICY_EXAMPLE = """{
    "default": [{"type": "reject"}],
    "transports": {
        "docker": {
            "docker.io/library/busybox": [{"type": "insecureAcceptAnything"}],
            "registry.example.com": [{"type": "insecureAcceptAnything"}],
            "registry.example.com/legacy": [{"type": "reject"}],
            "registry.example.com/legacy/tool:v2": [{"type": "insecureAcceptAnything"}],
            "*.trusted.example": [{"type": "insecureAcceptAnything"}],
            "registry.signed.example": [
                {"type": "sigstoreSigned", "keyPath": "/etc/pki/signed.pub", "signedIdentity": {"type": "matchRepository"}}
            ]
        },
        "docker-daemon": {"": [{"type": "insecureAcceptAnything"}]}
    }
}"""
POLICY_FILES = [
    "busybox:1.36\n" + POLICY_EXAMPLE,
    "registry.example.com/legacy/tool:v2\n" + POLICY_EXAMPLE,
    "eu.trusted.example/app\n" + POLICY_EXAMPLE,
    "registry.signed.example/app@" + SHA256_FF + "\n" + POLICY_EXAMPLE,
    'alpine\n{"default": [{"type": "reject"}], "transports": {"docker": {"": [{"type": "insecureAcceptAnything"}]}}}',
    'localhost:5000/app\n{"default": [{"type": "insecureAcceptAnything"}, {"type": "reject"}]}',
    'a.example.com/x\n{"default": [{"type": "reject"}], "transports": {"docker": {"a.example.com": [{"type": "sigstoreSigned", "fulcio": {"caData": "YQ==", "oidcIssuer": "https://i", "subjectEmail": "a@b"}, "rekorPublicKeyData": "' + P256_DATA + '"}]}}}',
    'b.example.com/x\n{"default": [{"type": "sigstoreSigned", "keyDatas": ["' + P256_DATA + '"], "signedIdentity": {"type": "remapIdentity", "prefix": "b.example.com", "signedPrefix": "m.example/b"}}]}',
    'busybox\n{"default": [{"type": "signedBy", "keyType": "GPGKeys", "keyPath": "/k.gpg"}]}',
    'busybox\n{"default": [{"type": "reject"}], "transports": {"docker": {"busybox": [{"type": "reject"}]}}}',
    'busybox\n{"default": []}',
    'busybox\n{"default": [{"type": "sigstoreSigned", "keyPath": "/k.pub", "rekorPublicKeyPath": "/r.pub"}]}',
]

# src/policy/sigstore/tests.rs: a .sig manifest, NUL, a payload, NUL, a signature (base64).
PAYLOAD = (TESTDATA / "payload.json").read_text()
RSA_SIGNATURE = (TESTDATA / "rsa-2048.sig").read_text().strip()
P384_SIGNATURE = (TESTDATA / "p384-sha256.sig").read_text().strip()
MANIFEST_DIGEST = "sha256:a8e87c3b20f50688f5156a664736f33dcc8a81e83c63156df15bb00d01f2c758"


def sig_manifest(layers, media_type="application/vnd.oci.image.manifest.v1+json"):
    return json.dumps({
        "schemaVersion": 2,
        "mediaType": media_type,
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": MANIFEST_DIGEST, "size": 233},
        "layers": layers,
    })


def cosign_layer(payload, signature, **annotations):
    digest = "sha256:" + hashlib.sha256(payload.encode()).hexdigest()
    annotations = {"dev.cosignproject.cosign/signature": signature, **annotations}
    return {"mediaType": "application/vnd.dev.cosign.simplesigning.v1+json", "digest": digest, "size": len(payload),
            "annotations": annotations}


OTHER_LAYER = {"mediaType": "application/vnd.in-toto+json", "digest": SHA256_FF, "size": 1}
TAGGED_PAYLOAD = PAYLOAD.replace('team/app"', 'team/app:v1"')
ANNOTATED_PAYLOAD = PAYLOAD.replace('"optional":null', '"optional":{"creator":"ci","timestamp":1700000000}')
# A Sigstore bundle as cosign 2.5's `attest --new-bundle-format --type https://sigstore.dev/cosign/
# sign/v1` writes it (the signature is a placeholder), and one with a certificate and a Rekor entry.
STATEMENT = (
    '{"_type":"https://in-toto.io/Statement/v1","predicateType":"https://sigstore.dev/cosign/sign/v1",'
    '"subject":[{"name":"registry.example.com/team/app","digest":{"sha256":"'
    + MANIFEST_DIGEST.removeprefix("sha256:") + '"}}],"predicate":{}}'
)
ENVELOPE = {
    "payload": base64.b64encode(STATEMENT.encode()).decode(),
    "payloadType": "application/vnd.in-toto+json",
    "signatures": [{"sig": "MEUCIQ=="}],
}
KEY_BUNDLE = json.dumps({
    "mediaType": "application/vnd.dev.sigstore.bundle.v0.3+json",
    "verificationMaterial": {"publicKey": {"hint": "r+QgYl9nc3c5VhYFKiztOMhHRs19JyW5zbrzU8Hu2yA="}},
    "dsseEnvelope": ENVELOPE,
})
CERTIFICATE_BUNDLE = json.dumps({
    "mediaType": "application/vnd.dev.sigstore.bundle+json;version=0.1",
    "verificationMaterial": {
        "x509CertificateChain": {"certificates": [{"rawBytes": "MIIB"}, {"rawBytes": "MIIC"}]},
        "tlogEntries": [{
            "logIndex": "1", "logId": {"keyId": "AAAA"}, "kindVersion": {"kind": "dsse", "version": "0.0.1"},
            "integratedTime": "1700000000", "inclusionPromise": {"signedEntryTimestamp": "MEUC"},
            "canonicalizedBody": base64.b64encode(b'{"apiVersion":"0.0.1","kind":"dsse","spec":{}}').decode(),
        }],
    },
    "dsseEnvelope": ENVELOPE,
})


def bundle_manifest(bundle):
    layer = {"mediaType": "application/vnd.dev.sigstore.bundle.v0.3+json", "size": len(bundle),
             "digest": "sha256:" + hashlib.sha256(bundle.encode()).hexdigest()}
    return json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                       "artifactType": "application/vnd.dev.sigstore.bundle.v0.3+json", "layers": [layer]})


SIGNATURE_ARTIFACTS = [
    bundle_manifest(KEY_BUNDLE) + "\0" + KEY_BUNDLE + "\0",
    bundle_manifest(CERTIFICATE_BUNDLE) + "\0" + CERTIFICATE_BUNDLE + "\0",
    sig_manifest([cosign_layer(PAYLOAD, RSA_SIGNATURE)]) + "\0" + PAYLOAD + "\0" + RSA_SIGNATURE,
    sig_manifest([OTHER_LAYER, cosign_layer(PAYLOAD, P384_SIGNATURE, **{"dev.sigstore.cosign/bundle": "{}"})])
    + "\0" + PAYLOAD + "\0" + P384_SIGNATURE,
    sig_manifest([cosign_layer(TAGGED_PAYLOAD, "MEUCIQ==")] * 3, "application/vnd.docker.distribution.manifest.v2+json")
    + "\0" + TAGGED_PAYLOAD + "\0MEUCIQ==",
    sig_manifest([cosign_layer(ANNOTATED_PAYLOAD, RSA_SIGNATURE)]) + "\0" + ANNOTATED_PAYLOAD + "\0" + RSA_SIGNATURE,
    sig_manifest([], "application/vnd.oci.image.index.v1+json") + "\0\0",
    '{"schemaVersion": 2, "layers": [{"mediaType": "application/vnd.dev.cosign.simplesigning.v1+json", "digest": "sha256:..", "size": 1}]}\0{}\0',
    "\0" + (TESTDATA / "p384.pub").read_text() + "\0",
    "\0" + (TESTDATA / "rsa-2048.pub").read_text() + "\0",
]


def main():
    write("reference", REFERENCES)
    write("ensure_request", ENSURE_REQUESTS)
    write("cri_pull_request", CRI_PULLS)
    write("docker_config", DOCKER_CONFIGS)
    write("plugin_response", PLUGIN_RESPONSES)
    write("records", RECORDS)
    write("authority", AUTHORITY)
    write("config_file", CONFIG_FILES)
    write("policy_file", POLICY_FILES)
    write("signature_artifact", SIGNATURE_ARTIFACTS)


if __name__ == "__main__":
    main()
