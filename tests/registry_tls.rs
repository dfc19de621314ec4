//! The registry client over TLS, against registries of the test's own on loopback with a CA made
//! by `openssl`, as containerd's hosts.toml sends it: a `server` over https trusted through `ca`,
//! a blob redirected to an https storage host, a `header` sent, a mirror that fails passed over,
//! `skip_verify`, and a CA that is not the registry's refused with the TLS error.

#[path = "support/test_ca.rs"]
#[allow(dead_code)] // the harness's CA, of which this test issues server certificates only
mod test_ca;

use std::{
    path::Path,
    sync::{Arc, Mutex},
};

use cri_imaged::registry::{HostsConfig, RegistryClient, RegistryError, Repository};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
use sha2::{Digest, Sha256};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpListener,
};

const MANIFEST: &[u8] = br#"{"schemaVersion":2}"#;
const BLOB: &[u8] = b"the payload";

fn digest(bytes: &[u8]) -> String {
    format!("sha256:{}", Sha256::digest(bytes).iter().map(|byte| format!("{byte:02x}")).collect::<String>())
}

/// A TLS server on loopback answering each request head with `answer(head)`; the heads it got.
async fn serve(
    leaf: &test_ca::Leaf,
    answer: impl Fn(&str) -> Vec<u8> + Send + Sync + 'static,
) -> (u16, Arc<Mutex<Vec<String>>>) {
    let chain = CertificateDer::pem_file_iter(&leaf.cert).expect("cert").collect::<Result<Vec<_>, _>>().expect("pem");
    let key = PrivateKeyDer::from_pem_file(&leaf.key).expect("key");
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .expect("server config");
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let (heads, answer) = (Arc::new(Mutex::new(Vec::new())), Arc::new(answer));
    let seen = heads.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (acceptor, heads, answer) = (acceptor.clone(), heads.clone(), answer.clone());
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(stream).await else { return };
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") && tls.read(&mut byte).await.is_ok_and(|read| read == 1) {
                    head.push(byte[0]);
                }
                let head = String::from_utf8_lossy(&head).into_owned();
                heads.lock().expect("heads").push(head.clone());
                let _ = tls.write_all(&answer(&head)).await;
                let _ = tls.shutdown().await;
            });
        }
    });
    (port, seen)
}

fn response(status: &str, extra: &str, body: &[u8]) -> Vec<u8> {
    let head = format!("HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n{extra}\r\n", body.len());
    [head.as_bytes(), body].concat()
}

/// A registry of one manifest (`repo:v1`) whose blob is at `storage` (`https://localhost:PORT`).
fn registry(storage: u16) -> impl Fn(&str) -> Vec<u8> + Send + Sync + 'static {
    move |head: &str| {
        let path = head.split(' ').nth(1).unwrap_or("");
        if path == "/v2/repo/manifests/v1" {
            response("200 OK", "Content-Type: application/vnd.oci.image.manifest.v1+json\r\n", MANIFEST)
        } else if path == format!("/v2/repo/blobs/{}", digest(BLOB)) {
            response(
                "307 Temporary Redirect",
                &format!("Location: https://localhost:{storage}/storage/x?sig=1\r\n"),
                b"",
            )
        } else {
            response("404 Not Found", "", b"")
        }
    }
}

fn hosts_toml(config: &Path, domain: &str, text: &str) -> HostsConfig {
    let dir = config.join(domain);
    std::fs::create_dir_all(&dir).expect("host dir");
    std::fs::write(dir.join("hosts.toml"), text).expect("hosts.toml");
    HostsConfig::load(config)
}

#[tokio::test]
async fn a_registry_over_https_is_read_as_hosts_toml_says_and_a_wrong_ca_is_refused_with_the_tls_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (ca, other) = (test_ca::TestCa::new(dir.path(), "ca"), test_ca::TestCa::new(dir.path(), "other"));
    let leaf = ca.leaf(dir.path(), "leaf");
    let (storage, _) = serve(&leaf, |_: &str| response("200 OK", "", BLOB)).await;
    let (port, heads) = serve(&leaf, registry(storage)).await;
    let domain = format!("localhost:{port}");
    let repository = Repository { domain: domain.clone(), path: "repo".into() };

    // Loopback, and yet https: hosts.toml says so; a mirror that refuses connections is passed over.
    let config = hosts_toml(
        &dir.path().join("certs.d"),
        &domain,
        &format!(
            "server = \"https://{domain}\"\nca = \"{}\"\n[header]\nx-test = \"yes\"\n\n[host.\"https://127.0.0.1:1\"]\ncapabilities = [\"pull\", \"resolve\"]\nca = \"{}\"\n",
            ca.cert.display(),
            ca.cert.display()
        ),
    );
    let mut client = RegistryClient::new(&repository, None, &config);
    let manifest = client.manifest("v1", 1 << 20).await.expect("the manifest").expect("found");
    assert_eq!((manifest.body.as_ref(), manifest.digest), (MANIFEST, digest(MANIFEST)));
    // The blob comes from the https storage host the registry redirects to, trusted the same way.
    let blob = client.blob(&digest(BLOB), 1 << 20).await.expect("the blob through its redirect");
    assert_eq!(blob.body.as_ref(), BLOB);
    // Not found anywhere, and a host failed: that failure is the answer, as containerd gives it.
    let error = client.manifest("v2", 1 << 20).await.expect_err("the mirror's failure");
    assert!(error.to_string().contains("127.0.0.1:1"), "{error}");
    let heads = heads.lock().expect("heads").clone();
    assert!(heads.iter().all(|head| head.to_ascii_lowercase().contains("x-test: yes")), "{heads:?}");

    // skip_verify: no CA needed.
    let config = hosts_toml(
        &dir.path().join("skip.d"),
        &domain,
        &format!("server = \"https://{domain}\"\nskip_verify = true\n"),
    );
    let mut client = RegistryClient::new(&repository, None, &config);
    assert!(client.manifest("v1", 1 << 20).await.expect("the manifest").is_some());
    assert!(client.manifest("v2", 1 << 20).await.expect("an answer").is_none());

    // Another CA: refused, saying why.
    let config = hosts_toml(
        &dir.path().join("wrong.d"),
        &domain,
        &format!("server = \"https://{domain}\"\nca = \"{}\"\n", other.cert.display()),
    );
    let mut client = RegistryClient::new(&repository, None, &config);
    let error = client.manifest("v1", 1 << 20).await.expect_err("an unknown issuer");
    assert!(matches!(error, RegistryError::Tls { .. }), "{error:?}");
    let message = error.to_string();
    assert!(message.contains("invalid peer certificate") && message.contains("UnknownIssuer"), "{message}");

    // A mirror that may only pull is not asked to resolve a tag.
    let config = hosts_toml(
        &dir.path().join("pull-only.d"),
        &domain,
        &format!("[host.\"https://{domain}\"]\ncapabilities = [\"pull\"]\nca = \"{}\"\n", ca.cert.display()),
    );
    let mut client = RegistryClient::new(&repository, None, &config);
    // Only the default host resolves: loopback, plain HTTP, which this TLS server does not speak.
    let error = client.manifest("v1", 1 << 20).await.expect_err("plain HTTP to a TLS server");
    assert!(matches!(error, RegistryError::Connection { .. } | RegistryError::Status { .. }), "{error:?}");
    let blob = client.blob(&digest(BLOB), 1 << 20).await.expect("pulled from the mirror");
    assert_eq!(blob.body.as_ref(), BLOB);
}
