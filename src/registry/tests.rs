//! The client against a registry of the test's own on loopback (axum): the token flow with the
//! pull's credentials, Basic, bounds, digests checked, a 404 as "none".

use std::sync::{Arc, Mutex};

use axum::{
    Router,
    extract::{Path, State},
    http::{HeaderMap, StatusCode, header},
    response::{IntoResponse, Response},
    routing::get,
};
use base64::Engine as _;
use secrecy::SecretString;

use super::*;
use crate::credentials::RegistryAuth;

const MANIFEST: &[u8] = br#"{"schemaVersion":2}"#;

/// What the registry saw: each request's path and `Authorization`.
type Seen = Arc<Mutex<Vec<(String, Option<String>)>>>;

#[derive(Clone)]
struct Registry {
    seen: Seen,
    /// The challenge a request without the right `Authorization` gets.
    challenge: String,
    /// The `Authorization` the registry takes.
    accepts: String,
}

async fn manifests(State(registry): State<Registry>, Path(reference): Path<String>, headers: HeaderMap) -> Response {
    let auth = headers.get(header::AUTHORIZATION).and_then(|value| value.to_str().ok()).map(str::to_owned);
    registry.seen.lock().expect("seen").push((format!("manifests/{reference}"), auth.clone()));
    if auth.as_deref() != Some(registry.accepts.as_str()) {
        return (StatusCode::UNAUTHORIZED, [(header::WWW_AUTHENTICATE, registry.challenge.clone())]).into_response();
    }
    match reference.as_str() {
        "v1" => MANIFEST.into_response(),
        "big" => vec![b' '; 2048].into_response(),
        // Any digest: the same bytes, whose own digest it is not.
        digest if digest.starts_with("sha256:") => MANIFEST.into_response(),
        _ => StatusCode::NOT_FOUND.into_response(),
    }
}

/// The referrers API, for the one digest of `sha256:1…1`: its query echoed back, so the test
/// sees how the artifact type was sent.
async fn referrers(
    State(registry): State<Registry>,
    Path(digest): Path<String>,
    axum::extract::RawQuery(query): axum::extract::RawQuery,
) -> Response {
    registry.seen.lock().expect("seen").push((format!("referrers/{digest}"), None));
    if digest != format!("sha256:{}", "1".repeat(64)) {
        return StatusCode::NOT_FOUND.into_response();
    }
    serde_json::json!({ "schemaVersion": 2, "manifests": [], "query": query }).to_string().into_response()
}

async fn token(State(registry): State<Registry>, headers: HeaderMap) -> Response {
    let auth = headers.get(header::AUTHORIZATION).and_then(|value| value.to_str().ok()).map(str::to_owned);
    registry.seen.lock().expect("seen").push(("token".to_owned(), auth.clone()));
    let expected = format!("Basic {}", base64::engine::general_purpose::STANDARD.encode("user:secret"));
    if auth.as_deref() != Some(expected.as_str()) {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    serde_json::json!({ "token": "t0ken" }).to_string().into_response()
}

/// Serves `registry` on loopback; its address.
async fn serve(registry: Registry) -> String {
    let app = Router::new()
        .route("/v2/app/manifests/{reference}", get(manifests))
        .route("/v2/app/referrers/{digest}", get(referrers))
        .route("/token", get(token))
        .with_state(registry);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address").to_string();
    tokio::spawn(async move { axum::serve(listener, app).await });
    address
}

fn login() -> RegistryAuth {
    RegistryAuth::login(SecretString::from("user"), SecretString::from("secret"))
}

#[tokio::test]
async fn a_bearer_challenge_is_answered_with_a_token_got_with_the_pulls_credentials() {
    let seen = Seen::default();
    let registry = Registry { seen: seen.clone(), challenge: String::new(), accepts: "Bearer t0ken".into() };
    // The realm names the registry's own address, known once it listens: a second registry
    // shares `seen` and is the one asked.
    let address = serve(registry.clone()).await;
    let challenge = format!(r#"Bearer realm="http://{address}/token",service="test",scope="repository:app:pull""#);
    let address = serve(Registry { challenge, ..registry }).await;
    let repository = Repository { domain: address, path: "app".into() };
    let credentials = login();
    let mut client = RegistryClient::new(&repository, Some(&credentials), &HostsConfig::default());
    let fetched = client.manifest("v1", 1024).await.expect("read").expect("found");
    assert_eq!(&fetched.body[..], MANIFEST);
    assert_eq!(fetched.digest, format!("sha256:{}", client::hex(&<sha2::Sha256 as sha2::Digest>::digest(MANIFEST))));
    // Asked once for a token, then every request carries it.
    assert!(client.manifest("absent", 1024).await.expect("read").is_none(), "a 404 is none");
    let seen = seen.lock().expect("seen").clone();
    let paths: Vec<&str> = seen.iter().map(|(path, _)| path.as_str()).collect();
    assert_eq!(paths, ["manifests/v1", "token", "manifests/v1", "manifests/absent"]);
    assert_eq!(seen[3].1.as_deref(), Some("Bearer t0ken"));
}

#[tokio::test]
async fn without_credentials_a_challenge_is_refused_clearly_and_nothing_secret_is_said() {
    let registry =
        Registry { seen: Seen::default(), challenge: r#"Basic realm="r""#.into(), accepts: "Basic nothing".into() };
    let repository = Repository { domain: serve(registry).await, path: "app".into() };
    let mut client = RegistryClient::new(&repository, None, &HostsConfig::default());
    let refused = client.manifest("v1", 1024).await.expect_err("refused");
    assert!(matches!(refused, RegistryError::Unauthorized { .. }), "{refused}");
    assert!(refused.to_string().contains("asks for credentials for manifest v1, and the pull has none"), "{refused}");
}

#[tokio::test]
async fn basic_credentials_are_sent_when_asked_for_and_a_refusal_names_no_secret() {
    let accepts = format!("Basic {}", base64::engine::general_purpose::STANDARD.encode("user:secret"));
    let registry = Registry { seen: Seen::default(), challenge: r#"Basic realm="r""#.into(), accepts };
    let repository = Repository { domain: serve(registry).await, path: "app".into() };
    let credentials = login();
    let mut client = RegistryClient::new(&repository, Some(&credentials), &HostsConfig::default());
    assert!(client.manifest("v1", 1024).await.expect("read").is_some());
    let wrong = RegistryAuth::login(SecretString::from("user"), SecretString::from("wrong"));
    let mut client = RegistryClient::new(&repository, Some(&wrong), &HostsConfig::default());
    let refused = client.manifest("v1", 1024).await.expect_err("refused");
    assert!(!format!("{refused} {refused:?}").contains("wrong"), "{refused:?}");
}

#[tokio::test]
async fn an_answer_past_its_bound_or_not_of_its_digest_is_refused() {
    let registry = Registry { seen: Seen::default(), challenge: r#"Basic realm="r""#.into(), accepts: String::new() };
    let accepts = format!("Basic {}", base64::engine::general_purpose::STANDARD.encode("user:secret"));
    let repository = Repository { domain: serve(Registry { accepts, ..registry }).await, path: "app".into() };
    let credentials = login();
    let mut client = RegistryClient::new(&repository, Some(&credentials), &HostsConfig::default());
    let large = client.manifest("big", 1024).await.expect_err("too large");
    assert!(matches!(large, RegistryError::TooLarge { limit: 1024, .. }), "{large}");
    let digest = format!("sha256:{}", "0".repeat(64));
    let other = client.manifest(&digest, 1024).await.expect_err("not its digest");
    assert!(matches!(other, RegistryError::DigestMismatch { .. }), "{other}");
}

#[tokio::test]
async fn an_unreachable_registry_is_an_error_that_says_so() {
    let repository = Repository { domain: "127.0.0.1:1".into(), path: "app".into() };
    let refused = RegistryClient::new(&repository, None, &HostsConfig::default())
        .manifest("v1", 1024)
        .await
        .expect_err("refused");
    assert!(matches!(refused, RegistryError::Connection { .. }), "{refused}");
}

/// The referrers API: its index read (not content-addressed, so not checked against a digest),
/// the artifact type asked for intact in the query (none: no query), and a 404 as "no referrers
/// API".
#[tokio::test]
async fn the_referrers_of_a_digest_are_read_and_a_404_means_none() {
    let registry = Registry { seen: Seen::default(), challenge: String::new(), accepts: String::new() };
    let repository = Repository { domain: serve(registry).await, path: "app".into() };
    let mut client = RegistryClient::new(&repository, None, &HostsConfig::default());
    let artifact_type = "application/vnd.dev.cosign.artifact.sig.v1+json";
    let listed = format!("sha256:{}", "1".repeat(64));
    let index = client.referrers(&listed, Some(artifact_type), 1024).await.expect("read").expect("served");
    let index: serde_json::Value = serde_json::from_slice(&index.body).expect("json");
    // `+` sent as `%2B`: a registry reads a `+` in a query as a space.
    assert_eq!(index["query"], "artifactType=application/vnd.dev.cosign.artifact.sig.v1%2Bjson");
    // Unfiltered, as signatures are read (cosign's type and Sigstore bundles at once): no query.
    let index = client.referrers(&listed, None, 1024).await.expect("read").expect("served");
    let index: serde_json::Value = serde_json::from_slice(&index.body).expect("json");
    assert_eq!(index["query"], serde_json::Value::Null);
    let other = format!("sha256:{}", "2".repeat(64));
    assert!(client.referrers(&other, Some(artifact_type), 1024).await.expect("read").is_none());
}

/// Connections accepted in front of a registry, each forwarded to it: how many a client opened,
/// and a way to close every one of them (as a registry's keep-alive timeout does).
struct CountingProxy {
    address: String,
    accepted: Arc<std::sync::atomic::AtomicUsize>,
    open: Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>>,
}

impl CountingProxy {
    async fn before(registry: String) -> Self {
        let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let open = Arc::new(Mutex::new(Vec::new()));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("address").to_string();
        let (counter, forwarding) = (accepted.clone(), open.clone());
        tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let registry = registry.clone();
                forwarding.lock().expect("open").push(tokio::spawn(async move {
                    let mut server = tokio::net::TcpStream::connect(registry).await.expect("the registry");
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                }));
            }
        });
        Self { address, accepted, open }
    }

    fn accepted(&self) -> usize {
        self.accepted.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Closes every connection (the tasks holding both ends are ended).
    async fn close_all(&self) {
        for task in self.open.lock().expect("open").drain(..) {
            task.abort();
        }
        tokio::task::yield_now().await;
    }
}

/// A session's requests to one host share a connection (a long link's connection round trips
/// saved); one the registry closed meanwhile is replaced, the request asked again on a new one.
#[tokio::test]
async fn a_sessions_requests_share_one_connection_and_a_closed_one_is_replaced() {
    let registry = Registry { seen: Seen::default(), challenge: r#"Basic realm="r""#.into(), accepts: String::new() };
    let accepts = format!("Basic {}", base64::engine::general_purpose::STANDARD.encode("user:secret"));
    let proxy = CountingProxy::before(serve(Registry { accepts, ..registry }).await).await;
    let repository = Repository { domain: proxy.address.clone(), path: "app".into() };
    let credentials = login();
    let mut client = RegistryClient::new(&repository, Some(&credentials), &HostsConfig::default());
    // The challenge (a 401 whose empty body is complete), then three answers, on one connection.
    for _ in 0..3 {
        client.manifest("v1", 1024).await.expect("read").expect("found");
    }
    assert_eq!(proxy.accepted(), 1, "one connection for the challenge and the three answers");
    proxy.close_all().await;
    client.manifest("v1", 1024).await.expect("asked again on a new connection").expect("found");
    assert_eq!(proxy.accepted(), 2);
    // An answer past its bound, dropped unread: the next request is answered all the same.
    client.manifest("big", 1024).await.expect_err("too large");
    client.manifest("v1", 1024).await.expect("read").expect("found");
}
