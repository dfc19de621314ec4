//! Image signatures read over TLS (issue 49), where containerd pulls from: a docker-registry
//! started by the test with a certificate of a CA made by `openssl` at test time, containerd and
//! cri-imaged given the same hosts.toml directory (`config_path`, `--registry-config-path`) whose
//! file names the registry's `server` over https and its `ca`. An image signed by cosign over TLS is
//! let in (and containerd pulls it over TLS too), an unsigned one refused, and a registry whose
//! hosts.toml names another CA is refused with the TLS error (RegistryUnavailable: the image could
//! not be judged), before containerd is asked.

mod support;

use std::{
    net::TcpListener,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Duration,
};

use serde_json::json;
use support::{
    clients::{Answer, Call, Client},
    process::{DaemonProcess, in_ci},
    stack::LocalStack,
    test_ca::{Leaf, TestCa},
};

const COSIGN: &str = "/opt/cri-imaged-test/cosign-trixie/usr/bin/cosign";

fn cosign() -> Option<PathBuf> {
    let path = std::env::var_os("COSIGN_BIN").map_or_else(|| PathBuf::from(COSIGN), PathBuf::from);
    if path.is_file() {
        return Some(path);
    }
    assert!(!in_ci(), "cosign is not at {}; CI must install it (scripts/install-deps.sh)", path.display());
    eprintln!("SKIPPED: cosign is not installed (outside CI; `make deps` installs it)");
    None
}

/// cosign with an empty key password, trusting `ca` (Go reads `SSL_CERT_FILE`); success, output.
fn run_cosign(cosign: &Path, dir: &Path, ca: &Path, args: &[&str]) -> (bool, String) {
    let output = Command::new(cosign)
        .args(args)
        .current_dir(dir)
        .env("COSIGN_PASSWORD", "")
        .env("SIGSTORE_NO_CACHE", "1")
        .env("SSL_CERT_FILE", ca)
        .env("HOME", dir)
        .output()
        .expect("cosign runs");
    let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    (output.status.success(), text)
}

/// A docker-registry over TLS on a free loopback port, serving the stack's registry's storage (so
/// that what the stack seeds is there too); stopped when dropped.
struct TlsRegistry {
    addr: String,
    child: Child,
}

impl TlsRegistry {
    fn start(stack: &LocalStack, leaf: &Leaf, name: &str) -> Self {
        let port = TcpListener::bind("127.0.0.1:0").expect("a free port").local_addr().expect("addr").port();
        let addr = format!("127.0.0.1:{port}");
        let config = stack.dir().join(format!("{name}.yml"));
        let storage = stack.dir().join("registry-data");
        let yaml = format!(
            "version: 0.1\nlog:\n  level: info\n  accesslog:\n    disabled: false\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: {addr}\n",
            storage.display()
        );
        std::fs::write(&config, yaml).expect("registry config");
        let log = std::fs::File::create(stack.dir().join(format!("{name}.log"))).expect("registry log");
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(&config)
            .env("REGISTRY_HTTP_TLS_CERTIFICATE", &leaf.cert)
            .env("REGISTRY_HTTP_TLS_KEY", &leaf.key)
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .stdin(Stdio::null())
            .spawn()
            .expect("docker-registry starts");
        let registry = Self { addr, child };
        for _ in 0..100 {
            if std::net::TcpStream::connect(&registry.addr).is_ok() {
                return registry;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("docker-registry over TLS did not listen on {}", registry.addr);
    }
}

impl Drop for TlsRegistry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `DIR/certs.d/HOST/hosts.toml` of the stack (containerd's `config_path`): `server` over https,
/// trusting `ca`. The empty `[host]` table is what containerd 1.6 needs to read a file without one.
fn route_over_tls(stack: &LocalStack, host: &str, ca: &Path) {
    let dir = stack.dir().join("certs.d").join(host);
    std::fs::create_dir_all(&dir).expect("host dir");
    let text = format!("server = \"https://{host}\"\nca = \"{}\"\n\n[host]\n", ca.display());
    std::fs::write(dir.join("hosts.toml"), text).expect("hosts.toml");
}

fn ensure(image: &str, uid: &str) -> Call {
    let pod = json!({ "namespace": "prod", "name": "web", "uid": uid });
    Call::new(
        "imagemanager.v1.ImageManager/EnsureImageExists",
        json!({ "image": image, "pull_policy": "IF_NOT_PRESENT", "pod": pod }),
    )
}

fn cri_pull(image: &str) -> Call {
    let sandbox = json!({ "metadata": { "name": "web", "uid": "u-1", "namespace": "prod" } });
    Call::new("runtime.v1.ImageService/PullImage", json!({ "image": { "image": image }, "sandbox_config": sandbox }))
}

async fn run(client: Client, socket: &Path, calls: Vec<Call>) -> Vec<Answer> {
    let socket = socket.to_owned();
    tokio::task::spawn_blocking(move || client.run(&socket, &calls)).await.expect("client task")
}

#[tokio::test]
async fn a_signed_image_over_tls_is_let_in_an_unsigned_one_refused_and_a_wrong_ca_refused_with_the_tls_error() {
    let Some(cosign) = cosign() else { return };
    let Some(stack) = LocalStack::start() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let (ca, other) = (TestCa::new(dir.path(), "ca"), TestCa::new(dir.path(), "other"));
    let leaf = ca.leaf(dir.path(), "registry");
    let registry = TlsRegistry::start(&stack, &leaf, "tls-registry");
    let wrong = TlsRegistry::start(&stack, &leaf, "tls-registry-wrong-ca");
    route_over_tls(&stack, &registry.addr, &ca.cert);
    route_over_tls(&stack, &wrong.addr, &other.cert);

    let signed = stack.seed("tls/signed:v1", "signed over TLS");
    stack.seed("tls/unsigned:v1", "not signed");
    let keys = dir.path().join("keys");
    std::fs::create_dir_all(&keys).expect("keys");
    let (made, text) = run_cosign(&cosign, &keys, &ca.cert, &["generate-key-pair"]);
    assert!(made, "cosign generate-key-pair: {text}");
    let key = keys.join("cosign.key");
    let image = format!("{}/tls/signed@{signed}", registry.addr);
    let args = ["sign", "--key", key.to_str().expect("utf-8"), "--tlog-upload=false", "-y", &image];
    let (signed_ok, text) = run_cosign(&cosign, &keys, &ca.cert, &args);
    assert!(signed_ok, "cosign sign over TLS: {text}");

    let requirement = json!([{
        "type": "sigstoreSigned",
        "keyPath": keys.join("cosign.pub"),
        "signedIdentity": { "type": "matchRepository" },
    }]);
    let policy = json!({
        "default": [{ "type": "reject" }],
        "transports": { "docker": {
            format!("{}/tls", registry.addr): requirement,
            format!("{}/tls", wrong.addr): requirement,
        } }
    });
    let file = dir.path().join("policy.json");
    std::fs::write(&file, policy.to_string()).expect("policy");
    let certs_d = stack.dir().join("certs.d");
    let flags = [
        "--signature-policy",
        file.to_str().expect("utf-8"),
        "--registry-config-path",
        certs_d.to_str().expect("utf-8"),
    ];
    let daemon = DaemonProcess::start(&dir.path().join("cri-imaged.sock"), &stack.containerd_socket, &flags).await;

    let client = Client::available()[0];
    // Signed, over TLS: verified, and containerd pulls it over TLS with the same hosts.toml.
    let image = format!("{}/tls/signed:v1", registry.addr);
    let answers = run(client, &daemon.socket, vec![ensure(&image, "signed"), cri_pull(&image)]).await;
    assert!(answers.iter().all(|answer| answer.code() == "OK"), "{answers:?}");

    // Unsigned, over TLS: refused for want of a signature, not for the connection.
    let image = format!("{}/tls/unsigned:v1", registry.addr);
    let answers = run(client, &daemon.socket, vec![ensure(&image, "unsigned")]).await;
    let Answer::Error { code, message } = &answers[0] else { panic!("the unsigned image let in: {answers:?}") };
    assert_eq!(code, "PERMISSION_DENIED", "{message}");
    assert!(message.contains("no signature for sha256:"), "{message}");

    // The same registry behind a hosts.toml naming another CA: refused, the TLS error said. The
    // image was never judged (its registry could not be read, as containerd's pull could not
    // read it): the pod gets RegistryUnavailable, as for a pull, and the breaker counts it.
    let image = format!("{}/tls/signed:v1", wrong.addr);
    let answers = run(client, &daemon.socket, vec![ensure(&image, "wrong-ca")]).await;
    let Answer::Error { code, message } = &answers[0] else { panic!("let in past a wrong CA: {answers:?}") };
    assert_eq!(code, "UNAVAILABLE", "{message}");
    assert!(message.contains("because the registry is unavailable: reading signatures: "), "{message}");
    assert!(message.contains("TLS") && message.contains("UnknownIssuer"), "{message}");
    let direct = run(
        client,
        &stack.containerd_socket,
        vec![Call::new("runtime.v1.ImageService/ImageStatus", json!({ "image": { "image": image } }))],
    )
    .await;
    assert_eq!(direct[0], Answer::Ok(json!({})), "containerd was never asked for it");
    drop((registry, wrong));
}
