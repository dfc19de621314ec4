//! What the image policy shows people and agents (issue 49), on a real containerd and a loopback
//! registry with cosign-signed images: `cri-imaged policy check` run as a process (text, JSON,
//! exit statuses), the CheckImagePolicy call made by grpcurl and by Python's grpcio, GetStatus's
//! policy in force, and `cri-imaged images` saying which policy an image was verified under.

mod support;

use std::{
    path::Path,
    process::{Command, Stdio},
};

use base64::Engine;
use serde_json::{Value, json};
use support::{
    clients::{Answer, Client},
    cosign::{cosign, key_pair, sign},
    process::{DaemonProcess, grpcurl, metric_with_label, metrics_listen, require_tool},
    stack::LocalStack,
};

const BIN: &str = env!("CARGO_BIN_EXE_cri-imaged");
const CHECK: &str = "imagemanager.v1.ImageManager/CheckImagePolicy";

/// `cri-imaged ARGS --socket SOCKET`: its exit status, stdout, stderr.
fn cli(socket: &Path, args: &[&str]) -> (i32, String, String) {
    let output = Command::new(BIN)
        .args(args)
        .arg(format!("--socket={}", socket.display()))
        .stdin(Stdio::null())
        .output()
        .expect("cri-imaged runs");
    let text = |bytes: Vec<u8>| String::from_utf8(bytes).expect("UTF-8 output");
    (output.status.code().unwrap_or(-1), text(output.stdout), text(output.stderr))
}

fn json_line(stdout: &str) -> Value {
    serde_json::from_str(stdout.trim()).expect("one JSON object")
}

#[tokio::test]
async fn policy_check_status_and_images_say_what_the_policy_in_force_decides_and_why() {
    let Some(cosign) = cosign() else { return };
    let Some(grpcurl_bin) = require_tool("grpcurl") else { return };
    let Some(stack) = LocalStack::start() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let keys = key_pair(&cosign, &dir.path().join("keys"));
    let signed_digest = stack.seed("pc/signed:v1", "signed");
    sign(&cosign, &keys, &format!("{}@{signed_digest}", stack.image("pc/signed")));
    stack.seed("pc/unsigned:v1", "unsigned");
    let (signed, unsigned) = (stack.image("pc/signed:v1"), stack.image("pc/unsigned:v1"));

    // The node: signatures required under the registry's pc/, everything else refused; the
    // namespace `team` has its own file, which takes anything.
    let scope = format!("{}/pc", stack.registry);
    let policy = json!({
        "default": [{ "type": "reject" }],
        "transports": { "docker": { scope.clone(): [{
            "type": "sigstoreSigned",
            "keyPath": keys.join("cosign.pub"),
            "signedIdentity": { "type": "matchRepository" },
        }] } }
    });
    let file = dir.path().join("policy.json");
    std::fs::write(&file, policy.to_string()).expect("policy");
    let namespaces = dir.path().join("namespaces");
    std::fs::create_dir(&namespaces).expect("dir");
    std::fs::write(namespaces.join("team.json"), r#"{"default": [{"type": "insecureAcceptAnything"}]}"#).expect("ns");
    let (port, listen) = metrics_listen();
    let flags = [
        "--signature-policy",
        file.to_str().expect("utf-8"),
        "--signature-policy-dir",
        namespaces.to_str().expect("utf-8"),
        "--metrics-listen",
        &listen,
    ];
    let daemon = DaemonProcess::start(&dir.path().join("cri-imaged.sock"), &stack.containerd_socket, &flags).await;
    let socket = daemon.socket.clone();

    // A signed image: allowed, its tag resolved at the registry, the key and signature named.
    let (code, text, _) = cli(&socket, &["policy", "check", &signed]);
    assert_eq!(code, 0, "{text}");
    assert!(text.starts_with(&format!("{signed}: allowed\n")), "{text}");
    assert!(text.contains(&format!("  scope        {scope:?}\n")), "{text}");
    assert!(text.contains("  requirement  sigstoreSigned (keyPath "), "{text}");
    assert!(text.contains("signedIdentity matchRepository)"), "{text}");
    assert!(
        text.contains(&format!("  digest       {signed_digest} (its tag, resolved at the registry now)")),
        "{text}"
    );
    assert!(text.contains("  verified by  key "), "{text}");
    // With a pull secret, as a pod's (a docker config.json): the same verdict, as JSON.
    let secret = dir.path().join("config.json");
    let auth = base64::engine::general_purpose::STANDARD.encode("someone:secret");
    std::fs::write(&secret, json!({ "auths": { stack.registry.clone(): { "auth": auth } } }).to_string())
        .expect("secret");
    let secret_flag = format!("--secret={}", secret.display());
    let (code, out, _) = cli(&socket, &["policy", "check", &signed, &secret_flag, "-o", "json"]);
    assert_eq!(code, 0, "{out}");
    let answer = json_line(&out);
    assert_eq!(
        (&answer["result"], &answer["policy"], &answer["scope"]),
        (&json!("allowed"), &json!("default"), &json!(scope))
    );
    assert_eq!((&answer["digest"], &answer["digestSource"]), (&json!(signed_digest), &json!("registry")));
    assert!(
        answer["verifiedBy"][0]["signature"].as_str().is_some_and(|layer| layer.starts_with("sha256:")),
        "{answer}"
    );
    assert!(!out.contains("secret") && !out.contains(&auth), "no credential in the output: {out}");

    // An unsigned one: refused (exit 1), saying why, with the kubelet's reason on stderr.
    let (code, text, error) = cli(&socket, &["policy", "check", &unsigned]);
    assert_eq!(code, 1, "{text}");
    assert!(text.starts_with(&format!("{unsigned}: refused\n")), "{text}");
    assert!(text.contains("  why          Running image docker://"), "{text}");
    assert!(text.contains("no signature for sha256:"), "{text}");
    assert!(error.starts_with("cri-imaged: SignatureValidationFailed: Running image"), "{error}");
    // The same image for `team`'s pods: its own policy lets it in.
    let (code, text, _) = cli(&socket, &["policy", "check", &unsigned, "--namespace", "team"]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("  policy       namespace team's own\n"), "{text}");
    // Bad input: an image that does not parse (the daemon's INVALID_ARGUMENT), a secret file that
    // does not (the command line's, exit 2, its content never shown).
    let (code, _, error) = cli(&socket, &["policy", "check", "Not An Image"]);
    assert_eq!(code, 1);
    assert!(error.contains("InvalidImageName"), "{error}");
    std::fs::write(&secret, "{\"auths\": [hunter2").expect("broken secret");
    let (code, _, error) = cli(&socket, &["policy", "check", &signed, &secret_flag]);
    assert_eq!(code, 2, "{error}");
    assert!(!error.contains("hunter2"), "{error}");

    // grpcurl, by reflection.
    let request = json!({ "image": unsigned }).to_string();
    let (ok, out, err) = grpcurl(&grpcurl_bin, &socket, &["-d", &request], &[CHECK]);
    assert!(ok, "{err}");
    let answer: Value = serde_json::from_str(&out).expect("grpcurl's JSON");
    assert_eq!(answer["result"], "refused", "{answer}");
    assert!(answer["refusal"].as_str().is_some_and(|why| why.contains("no signature for")), "{answer}");
    let (ok, _, err) = grpcurl(&grpcurl_bin, &socket, &["-d", r#"{"image": "Not An Image"}"#], &[CHECK]);
    assert!(!ok && err.contains("InvalidArgument"), "{err}");

    // Python's grpcio, by name with JSON; a pull secret that does not parse is INVALID_ARGUMENT.
    if Client::Grpcio.installed() {
        let answer = Client::Grpcio.ok(&socket, CHECK, json!({ "image": signed, "namespace": "prod" }));
        assert_eq!((&answer["result"], &answer["digest_source"]), (&json!("allowed"), &json!("registry")), "{answer}");
        assert_eq!(answer["verified_by"].as_array().map(Vec::len), Some(1), "{answer}");
        let bad_secret = json!({ "image": signed, "pull_secrets": [{ "name": "s", "docker_config_json": "{[" }] });
        let Answer::Error { code, message } = Client::Grpcio.call(&socket, CHECK, bad_secret) else {
            panic!("a bad pull secret was taken")
        };
        assert_eq!(code, "INVALID_ARGUMENT", "{message}");
        assert!(!message.contains("{["), "{message}");

        // GetStatus: the files, their digest, the mode, when loaded, the verifications.
        let status = Client::Grpcio.ok(&socket, "imagemanager.v1.ImageManager/GetStatus", json!({}));
        let policy = &status["image_policy"];
        assert_eq!(policy["policy_file"], json!(file.display().to_string()), "{status}");
        assert_eq!(policy["namespace_dir"], json!(namespaces.display().to_string()));
        assert_eq!((&policy["namespace_files"], &policy["mode"]), (&json!(1), &json!("enforce")));
        assert!(policy["digest"].as_str().is_some_and(|digest| digest.len() == 71), "{policy}");
        assert!(policy["loaded"].is_string(), "{policy}");
        assert_ne!(policy["verifications_verified"], json!("0"), "{policy}");
    }

    // `status`, text and JSON.
    let (code, text, _) = cli(&socket, &["status"]);
    assert_eq!(code, 0);
    assert!(text.contains(&format!("image policy   enforce: {}, 1 namespace files in", file.display())), "{text}");
    assert!(text.contains("policy digest  sha256:"), "{text}");
    let (_, out, _) = cli(&socket, &["status", "-o", "json"]);
    let status = json_line(&out);
    assert_eq!(status["imagePolicy"]["namespaceFiles"], 1, "{status}");
    assert!(status["imagePolicy"]["verifications"]["rejected"].as_u64() >= Some(1), "{status}");

    // Pulled, `images` says under which policy it was verified.
    let (code, _, error) = cli(&socket, &["pull", &signed]);
    assert_eq!(code, 0, "{error}");
    let (code, text, _) = cli(&socket, &["images", "-o", "wide", "pc/"]);
    assert_eq!(code, 0);
    assert!(text.lines().next().is_some_and(|header| header.trim_end().ends_with("VERIFIED")), "{text}");
    let row = text.lines().find(|line| line.contains("pc/signed")).expect("the signed image listed");
    assert!(row.trim_end().ends_with("default"), "{text}");
    let (_, out, _) = cli(&socket, &["images", "-o", "json", "pc/signed"]);
    let image = json_line(&out);
    assert_eq!(image["verifications"][0]["policy"], "default", "{image}");
    assert_eq!(image["verifications"][0]["scope"], json!(scope), "{image}");
    assert_eq!(image["verifications"][0]["digest"], json!(signed_digest), "{image}");

    // Counted by policy (the default's: one verified, one refused at least), never by namespace.
    let by_policy = |policy: &str| {
        metric_with_label(port, "cri_imaged_signature_verifications_total", &format!("policy=\"{policy}\""))
    };
    assert!(by_policy("default") >= 2.0);
    assert_eq!(by_policy("namespace"), 0.0);
}
