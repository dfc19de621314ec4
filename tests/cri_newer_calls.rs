//! The calls of kubelets newer than cri-imaged and the runtime, on a real containerd and a loopback
//! registry, made by clients we did not write (grpcio, grpc-js, grpcurl) straight to containerd
//! and through cri-imaged, as remembered answers are served and in strict mode:
//! - StreamImages (KEP-5825): containerd before 2.4 does not have it (UNIMPLEMENTED); through
//!   cri-imaged its messages hold exactly the images containerd's ListImages answers, filtered
//!   alike;
//! - an image method neither knows (Kubernetes 1.38's PullSecurityProfile, a streaming one): relayed
//!   to containerd, whose UNIMPLEMENTED comes back as it sent it, and counted.

mod support;

use std::{path::Path, time::Duration};

use serde_json::{Value, json};
use support::{
    clients::{Answer, Call, Client},
    process::{DaemonProcess, grpcurl, metric, metric_with_label, metrics_listen, require_tool},
    stack::LocalStack,
};

const PROTO_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/proto");

fn image_call(method: &str, request: Value) -> Call {
    Call::new(&format!("runtime.v1.ImageService/{method}"), request)
}

fn filtered(image: Option<&str>) -> Value {
    image.map_or_else(|| json!({}), |image| json!({ "filter": { "image": { "image": image } } }))
}

/// A PullSecurityProfileRequest as Kubernetes 1.38 sends it (`image.image`, `profile_kind`
/// Seccomp): bytes no proto of ours describes.
const PULL_SECURITY_PROFILE: &[u8] = b"\x0a\x20\x0a\x1eregistry.test/profiles:seccomp\x20\x01";

/// The images of an answer: ListImages' `images`, or every message's of a stream, sorted by id.
fn images_of(answer: &Answer) -> Vec<Value> {
    let Answer::Ok(response) = answer else { panic!("an answer with images: {answer:?}") };
    let messages = match response {
        Value::Array(messages) => messages.clone(),
        one => vec![one.clone()],
    };
    let mut images: Vec<Value> =
        messages.iter().flat_map(|message| message["images"].as_array().cloned().unwrap_or_default()).collect();
    images.sort_by(|a, b| a["id"].as_str().cmp(&b["id"].as_str()));
    images
}

async fn run_blocking(client: Client, socket: &Path, calls: Vec<Call>) -> Vec<Answer> {
    let socket = socket.to_owned();
    tokio::task::spawn_blocking(move || client.run(&socket, &calls)).await.expect("client task")
}

/// Both clients, both ways, with cri-imaged started with `flags`.
async fn differential(flags: &[&str]) {
    let Some(stack) = LocalStack::start() else { return };
    stack.seed("newer/a:v1", "a");
    stack.seed("newer/b:v1", "b");
    let (a, b) = (stack.image("newer/a:v1"), stack.image("newer/b:v1"));
    let dir = tempfile::tempdir().expect("tempdir");
    let (port, listen) = metrics_listen();
    let mut all = vec!["--metrics-listen", listen.as_str()];
    all.extend_from_slice(flags);
    let daemon = DaemonProcess::start(&dir.path().join("cri-imaged.sock"), &stack.containerd_socket, &all).await;
    let watching = || metric(port, "cri_imaged_presence_cache_watching") == 1.0;
    support::eventually("cri-imaged watches containerd's image events", Duration::from_secs(10), watching).await;

    let clients = Client::available();
    for &client in &clients {
        let pulls = [&a, &b].map(|image| image_call("PullImage", json!({ "image": { "image": image } })));
        let pulled = run_blocking(client, &daemon.socket, pulls.to_vec()).await;
        assert!(pulled.iter().all(|answer| answer.code() == "OK"), "{client:?}: {pulled:?}");
        let unknown = [
            Call::raw("runtime.v1.ImageService/PullSecurityProfile", PULL_SECURITY_PROFILE).metadata("x-node", "n1"),
            Call::raw("runtime.v1.ImageService/ListSecurityProfiles", b"").streaming(),
        ];
        let reads = |list: &str| {
            let mut calls = vec![image_call(list, filtered(None)), image_call(list, filtered(Some(&a)))];
            calls.extend(unknown.iter().cloned());
            calls
        };
        // Asked twice through cri-imaged: the second may be remembered.
        let direct = run_blocking(client, &stack.containerd_socket, reads("ListImages")).await;
        let streamed_direct = run_blocking(client, &stack.containerd_socket, reads("StreamImages")).await;
        let mut through = run_blocking(client, &daemon.socket, reads("StreamImages")).await;
        let again = run_blocking(client, &daemon.socket, reads("StreamImages")).await;

        assert_eq!(images_of(&direct[0]).len(), 2, "{client:?}: {direct:?}");
        for through in [&through, &again] {
            assert_eq!(
                images_of(&through[0]),
                images_of(&direct[0]),
                "{client:?} {flags:?}: the images ListImages has"
            );
            // containerd's ListImages reads no filter: the answer is its own either way.
            assert_eq!(images_of(&through[1]), images_of(&direct[1]), "{client:?} {flags:?}: filtered alike");
        }
        // containerd before 2.4 has no StreamImages; one that has must agree with its ListImages.
        match &streamed_direct[0] {
            Answer::Error { code, .. } => assert_eq!(code, "UNIMPLEMENTED", "{client:?}: {streamed_direct:?}"),
            answer => assert_eq!(images_of(answer), images_of(&direct[0]), "{client:?}: containerd's own stream"),
        }
        // What neither knows: containerd's own answer, whatever it is, byte for byte.
        let relayed = through.split_off(2);
        assert_eq!(relayed, direct[2..].to_vec(), "{client:?} {flags:?}: relayed to containerd");
        assert!(relayed.iter().all(|answer| answer.code() == "UNIMPLEMENTED"), "{client:?}: {relayed:?}");
        println!("{client:?} {flags:?}: StreamImages {:?}; relayed {relayed:?}", streamed_direct[0].code());

        let removals = [&a, &b].map(|image| image_call("RemoveImage", json!({ "image": { "image": image } })));
        run_blocking(client, &daemon.socket, removals.to_vec()).await;
    }
    assert_eq!(clients.len(), 2, "grpcio and grpc-js both ran");
    for method in ["PullSecurityProfile", "ListSecurityProfiles"] {
        let counted = metric_with_label(port, "cri_imaged_cri_relayed_calls_total", &format!(r#"method="{method}""#));
        assert_eq!(counted, 4.0, "{method}: two calls by each client");
    }
}

#[tokio::test]
async fn stream_images_and_unknown_calls_answer_through_cri_imaged_with_grpcio_and_grpc_js() {
    differential(&[]).await;
}

#[tokio::test]
async fn in_strict_mode_stream_images_and_unknown_calls_answer_alike() {
    differential(&["--presence-cache-max-staleness", "0s"]).await;
}

/// A proto of the calls Kubernetes 1.38 adds, as a grpc-go client (grpcurl) would be built with:
/// cri-imaged's reflection does not list them, containerd serves none.
const SECURITY_PROFILES_PROTO: &str = r#"
syntax = "proto3";
package runtime.v1;
message ImageSpec { string image = 1; }
message PullSecurityProfileRequest { ImageSpec image = 1; int32 profile_kind = 4; }
message PullSecurityProfileResponse { bool cached = 1; }
service ImageService {
    rpc PullSecurityProfile(PullSecurityProfileRequest) returns (PullSecurityProfileResponse) {}
}
"#;

/// grpcurl with its default flags: StreamImages through cri-imaged (by reflection) prints the
/// images containerd's ListImages prints; PullSecurityProfile gets containerd's own refusal both
/// ways.
#[tokio::test]
async fn grpcurl_streams_images_through_cri_imaged_and_gets_containerds_answer_to_what_neither_knows() {
    let Some(grpcurl_bin) = require_tool("grpcurl") else { return };
    let Some(stack) = LocalStack::start() else { return };
    stack.seed("newer/a:v1", "a");
    let image = stack.image("newer/a:v1");
    stack.pull(&image);
    let dir = tempfile::tempdir().expect("tempdir");
    let daemon = DaemonProcess::start(&dir.path().join("cri-imaged.sock"), &stack.containerd_socket, &[]).await;
    let cri_proto = ["-import-path", PROTO_DIR, "-proto", "runtime/v1/api.proto", "-d", "{}"];
    let (listed, out, err) =
        grpcurl(&grpcurl_bin, &stack.containerd_socket, &cri_proto, &["runtime.v1.ImageService/ListImages"]);
    assert!(listed, "{out}{err}");
    let (streamed, stream_out, err) =
        grpcurl(&grpcurl_bin, &daemon.socket, &["-d", "{}"], &["runtime.v1.ImageService/StreamImages"]);
    assert!(streamed, "{stream_out}{err}");
    let parse = |text: &str| -> Vec<Value> {
        let messages = serde_json::Deserializer::from_str(text).into_iter::<Value>();
        let mut images: Vec<Value> = messages
            .flat_map(|message| message.expect("grpcurl prints JSON")["images"].as_array().cloned().unwrap_or_default())
            .collect();
        images.sort_by(|a, b| a["id"].as_str().cmp(&b["id"].as_str()));
        images
    };
    assert_eq!(parse(&stream_out), parse(&out), "grpcurl prints the same images");
    assert!(!parse(&out).is_empty(), "{out}");

    std::fs::write(dir.path().join("profiles.proto"), SECURITY_PROFILES_PROTO).expect("proto");
    let proto_dir = dir.path().to_string_lossy().into_owned();
    let request = json!({ "image": { "image": "registry.test/profiles:seccomp" }, "profile_kind": 1 }).to_string();
    let profiles = ["-import-path", proto_dir.as_str(), "-proto", "profiles.proto", "-d", request.as_str()];
    let verb = ["runtime.v1.ImageService/PullSecurityProfile"];
    let direct = grpcurl(&grpcurl_bin, &stack.containerd_socket, &profiles, &verb);
    let through = grpcurl(&grpcurl_bin, &daemon.socket, &profiles, &verb);
    assert!(!direct.0 && direct.2.contains("Unimplemented"), "{direct:?}");
    assert_eq!(through, direct, "containerd's answer, as grpcurl prints it");

    // A registry that refuses the connection: containerd's own words, named RegistryUnavailable
    // through cri-imaged (UNKNOWN both ways, as grpcurl prints it).
    let refused = json!({ "image": { "image": "127.0.0.1:1/newer/refused:v1" } }).to_string();
    let verb = ["runtime.v1.ImageService/PullImage"];
    let (_, _, direct) =
        grpcurl(&grpcurl_bin, &stack.containerd_socket, &[&cri_proto[..4], &["-d", &refused]].concat(), &verb);
    let (_, _, through) = grpcurl(&grpcurl_bin, &daemon.socket, &["-d", &refused], &verb);
    assert!(direct.contains("Code: Unknown") && direct.contains("connection refused"), "{direct}");
    let named = direct.replace("Message: ", "Message: RegistryUnavailable: ");
    assert_eq!(through, named, "containerd's answer with the name before its message");
}
