//! End to end with credentials: the real binary and a real containerd pulling from a loopback
//! registry that demands HTTP Basic auth (htpasswd). Credentials come from the pod's pull secrets,
//! the node's docker config and a credential-provider plugin, as in the kubelet; the registry's
//! own log tells which logins containerd made, in order.
//!
//! Every daemon gets a fresh `--root-dir`, working directory and `$HOME`, so the kubelet's search
//! for the node's docker config finds only what a test wrote (and `/.docker`, `/.dockercfg`,
//! which this machine does not have).

mod support;

use std::{collections::HashSet, path::Path};

use base64::Engine;
use cri_imaged::api::{
    EnsureImageExistsRequest, EnsureImageExistsResponse, PullPolicy, PullSecret, WatchEventsRequest,
    image_manager_client::ImageManagerClient,
};
use support::{
    call,
    private::{self, ALICE, BOB, Private, private_registry},
    reason,
};
use tonic::{Code, Status, transport::Channel};

const IF_NOT_PRESENT: i32 = PullPolicy::IfNotPresent as i32;
const ALWAYS: i32 = PullPolicy::Always as i32;

/// Alice's name with a password the registry refuses.
const ALICE_WRONG: (&str, &str) = ("alice", "not-alices-pw-X9");
const BOB_WRONG: (&str, &str) = ("bob", "not-bobs-pw-Y8");

impl Private {
    /// A config.json giving `user` this registry, as `docker login` writes it (`auth` only).
    fn config_json(&self, (user, password): (&str, &str)) -> String {
        serde_json::json!({ "auths": { &self.stack.registry: { "auth": basic(user, password) } } }).to_string()
    }
}

/// EnsureImageExists (IfNotPresent) for `image` from the pod `pod` with `secrets`.
fn for_pod(pod: &str, image: &str, secrets: Vec<PullSecret>) -> EnsureImageExistsRequest {
    private::for_pod(pod, image, secrets, IF_NOT_PRESENT)
}

/// base64(`user:password`), the `auth` of a docker config and of a Basic Authorization header.
fn basic(user: &str, password: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
}

fn assert_pulled(response: &EnsureImageExistsResponse, image: &str) {
    assert!(response.pulled, "{image} should have been pulled: {response:?}");
    assert!(response.image_ref.starts_with("sha256:"), "containerd's image id: {response:?}");
    assert!(response.message.starts_with(&format!("Successfully pulled image {image:?} in ")), "{response:?}");
}

/// The registry refused the pull: ErrImagePull with containerd's code and words for a 401.
fn assert_unauthorized(status: &Status) {
    assert_eq!((status.code(), reason(status).as_str()), (Code::Unknown, "ErrImagePull"), "{status:?}");
    assert!(support::refused_as_unauthorized(status.message()), "{}", status.message());
}

#[tokio::test]
async fn a_pod_with_the_right_secret_pulls_a_private_image() {
    let Some(p) = private_registry() else { return };
    let image = p.seed("private/app:v1");
    let (_daemon, mut client) = p.daemon(&p.daemon_dir("d"), &[]).await;

    let request = for_pod("web", &image, vec![p.secret("regcred", ALICE)]);
    let pulled = call(&mut client, request).await.expect("pulled with alice's secret");

    assert_pulled(&pulled, &image);
    assert_eq!(p.stack.auth_attempts("private/app"), ["ok alice"]);
    assert_eq!(p.stack.successful_resolutions("private/app", "v1"), 1);
}

#[tokio::test]
async fn a_wrong_secret_is_err_image_pull_with_the_registrys_401_and_never_its_password() {
    let Some(p) = private_registry() else { return };
    let image = p.seed("private/app:v1");
    let (_daemon, mut client) = p.daemon(&p.daemon_dir("d"), &[]).await;

    let request = for_pod("web", &image, vec![p.secret("regcred", ALICE_WRONG)]);
    let status = call(&mut client, request).await.expect_err("alice's wrong password is refused");

    assert_unauthorized(&status);
    // containerd's UNKNOWN, as the kubelet words it: its bare message.
    let containerds = format!("failed to pull and unpack image {image:?}");
    assert!(status.message().starts_with(&containerds), "{}", status.message());
    assert!(!status.message().contains(ALICE_WRONG.1), "{}", status.message());
    assert!(!status.message().contains(&basic(ALICE_WRONG.0, ALICE_WRONG.1)), "{}", status.message());
    assert_eq!(p.stack.auth_attempts("private/app"), ["fail alice"], "one attempt, with the secret");
    assert_eq!(p.stack.successful_resolutions("private/app", "v1"), 0);
}

#[tokio::test]
async fn with_two_secrets_the_first_is_tried_first_and_the_second_pulls_when_it_fails() {
    let Some(p) = private_registry() else { return };
    let image = p.seed("private/app:v1");
    let (_daemon, mut client) = p.daemon(&p.daemon_dir("d"), &[]).await;

    let secrets = vec![p.secret("stale", ALICE_WRONG), p.secret("current", BOB)];
    let pulled = call(&mut client, for_pod("web", &image, secrets)).await.expect("bob's secret pulls");

    assert_pulled(&pulled, &image);
    assert_eq!(p.stack.auth_attempts("private/app"), ["fail alice", "ok bob"]);
    assert_eq!(p.stack.successful_resolutions("private/app", "v1"), 1);
}

#[tokio::test]
async fn when_every_secret_is_refused_the_error_is_the_registrys_401_said_once() {
    let Some(p) = private_registry() else { return };
    let image = p.seed("private/app:v1");
    let (_daemon, mut client) = p.daemon(&p.daemon_dir("d"), &[]).await;

    let secrets = vec![p.secret("one", ALICE_WRONG), p.secret("two", BOB_WRONG)];
    let status = call(&mut client, for_pod("web", &image, secrets)).await.expect_err("both refused");

    assert_unauthorized(&status);
    // The kubelet's aggregate of two identical messages is the message alone, not `[e1, e2]`.
    assert!(!status.message().starts_with('['), "{}", status.message());
    assert_eq!(status.message().matches("401 Unauthorized").count(), 1, "{}", status.message());
    assert_eq!(p.stack.auth_attempts("private/app"), ["fail alice", "fail bob"], "each secret tried, in order");
}

#[tokio::test]
async fn without_credentials_one_anonymous_pull_is_refused() {
    let Some(p) = private_registry() else { return };
    let image = p.seed("private/app:v1");
    let (_daemon, mut client) = p.daemon(&p.daemon_dir("d"), &[]).await;

    let status = call(&mut client, for_pod("web", &image, vec![])).await.expect_err("anonymous is refused");

    assert_unauthorized(&status);
    assert_eq!(p.stack.manifest_resolutions("private/app", "v1"), 1, "one anonymous request, answered 401");
    assert_eq!(p.stack.auth_attempts("private/app"), Vec::<String>::new(), "no login");
}

#[tokio::test]
async fn a_secret_for_another_registry_is_not_sent_to_this_one() {
    let Some(p) = private_registry() else { return };
    let image = p.seed("private/app:v1");
    let (_daemon, mut client) = p.daemon(&p.daemon_dir("d"), &[]).await;

    let mut elsewhere = p.secret("elsewhere", ALICE);
    elsewhere.docker_config_json = elsewhere.docker_config_json.replace(&p.stack.registry, "registry.example.com");
    let status = call(&mut client, for_pod("web", &image, vec![elsewhere])).await.expect_err("anonymous");

    assert_unauthorized(&status);
    assert_eq!(p.stack.manifest_resolutions("private/app", "v1"), 1, "one anonymous request");
    assert_eq!(p.stack.auth_attempts("private/app"), Vec::<String>::new());
}

#[tokio::test]
async fn a_kubernetes_io_dockercfg_secret_pulls_too() {
    let Some(p) = private_registry() else { return };
    let image = p.seed("private/app:v1");
    let (_daemon, mut client) = p.daemon(&p.daemon_dir("d"), &[]).await;

    // The older format: the bare registry map, credentials as `auth`.
    let dockercfg = serde_json::json!({ &p.stack.registry: { "auth": basic(BOB.0, BOB.1), "email": "" } });
    let secret = PullSecret {
        name: "legacy".into(),
        namespace: "default".into(),
        docker_config_json: dockercfg.to_string(),
        uid: "uid-legacy".into(),
        r#type: "kubernetes.io/dockercfg".into(),
    };
    let pulled = call(&mut client, for_pod("web", &image, vec![secret])).await.expect("bob's dockercfg pulls");

    assert_pulled(&pulled, &image);
    assert_eq!(p.stack.auth_attempts("private/app"), ["ok bob"]);
}

#[tokio::test]
async fn a_secret_that_does_not_parse_is_invalid_argument_naming_it_and_not_its_content() {
    let Some(p) = private_registry() else { return };
    let image = p.seed("private/app:v1");
    let (_daemon, mut client) = p.daemon(&p.daemon_dir("d"), &[]).await;

    let mut broken = p.secret("broken", ALICE);
    let cut = broken.docker_config_json.len() - 3;
    broken.docker_config_json.truncate(cut);
    assert!(broken.docker_config_json.contains(ALICE.1), "the broken content still holds the password");
    let status = call(&mut client, for_pod("web", &image, vec![broken])).await.expect_err("refused");

    assert_eq!((status.code(), reason(&status).as_str()), (Code::InvalidArgument, "ErrImagePull"), "{status:?}");
    let message = status.message();
    assert!(message.starts_with("pull secret default/broken: its .dockerconfigjson is not valid JSON ("), "{message}");
    assert!(!message.contains(ALICE.1) && !message.contains("auths"), "{message}");
    assert_eq!(p.stack.manifest_resolutions("private/app", "v1"), 0, "nothing was pulled");
}

#[tokio::test]
async fn the_nodes_docker_config_alone_pulls_and_a_changed_password_is_used_without_a_restart() {
    let Some(p) = private_registry() else { return };
    let first = p.seed("private/first:v1");
    let dir = p.daemon_dir("d");
    let config = dir.join("node-config.json");
    std::fs::write(&config, p.config_json(ALICE_WRONG)).expect("write config.json");
    let (_daemon, mut client) = p.daemon(&dir, &["--node-docker-config", config.to_str().expect("utf-8")]).await;

    let status = call(&mut client, for_pod("web", &first, vec![])).await.expect_err("a wrong password");
    assert_unauthorized(&status);
    assert!(!status.message().contains(ALICE_WRONG.1), "{}", status.message());
    assert_eq!(p.stack.auth_attempts("private/first"), ["fail alice"]);

    // The node's credentials are fixed in place; the daemon keeps running. (Another pod: the
    // first is backing off from its failed pull, as the kubelet would.)
    std::fs::write(&config, p.config_json(ALICE)).expect("rewrite config.json");
    let pulled = call(&mut client, for_pod("api", &first, vec![])).await.expect("the new password pulls");

    assert_pulled(&pulled, &first);
    assert_eq!(p.stack.auth_attempts("private/first"), ["fail alice", "ok alice"]);
}

#[tokio::test]
async fn a_config_json_in_the_root_dir_is_found_by_the_kubelets_search() {
    let Some(p) = private_registry() else { return };
    let before = p.seed("private/before:v1");
    let after = p.seed("private/after:v1");
    let dir = p.daemon_dir("d");
    let (_daemon, mut client) = p.daemon(&dir, &[]).await;

    // Nothing to find yet: one anonymous attempt.
    let status = call(&mut client, for_pod("web", &before, vec![])).await.expect_err("no credentials yet");
    assert_unauthorized(&status);
    assert_eq!(p.stack.manifest_resolutions("private/before", "v1"), 1);

    // `--root-dir DIR` is where the search looks first; a file that appears is used.
    std::fs::write(dir.join("root/config.json"), p.config_json(BOB)).expect("write ROOT_DIR/config.json");
    let pulled = call(&mut client, for_pod("web", &after, vec![])).await.expect("the node's config pulls");

    assert_pulled(&pulled, &after);
    assert_eq!(p.stack.auth_attempts("private/after"), ["ok bob"]);
}

/// A credential-provider plugin, `/bin/sh` answering `user` for the registry, cached by registry
/// for 5 minutes, and the flags that configure it for images matching `match_image`. Each run
/// appends its request (one line) to `DIR/plugin-requests`.
fn credential_plugin(p: &Private, dir: &Path, match_image: &str, (user, password): (&str, &str)) -> Vec<String> {
    let bin_dir = dir.join("plugins");
    std::fs::create_dir_all(&bin_dir).expect("plugin dir");
    let requests = dir.join("plugin-requests");
    let response = serde_json::json!({
        "kind": "CredentialProviderResponse",
        "apiVersion": "credentialprovider.kubelet.k8s.io/v1",
        "cacheKeyType": "Registry",
        "cacheDuration": "5m",
        "auth": { &p.stack.registry: { "username": user, "password": password } },
    });
    let script = format!(
        "#!/bin/sh\ncat >>'{requests}'\necho >>'{requests}'\nprintf '%s\\n' '{response}'\n",
        requests = requests.display()
    );
    let plugin = bin_dir.join("loopback-credentials");
    std::fs::write(&plugin, script).expect("write the plugin");
    let mut permissions = std::fs::metadata(&plugin).expect("plugin").permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut permissions, 0o755);
    std::fs::set_permissions(&plugin, permissions).expect("chmod the plugin");

    let config = dir.join("credential-providers.yaml");
    let yaml = format!(
        "apiVersion: kubelet.config.k8s.io/v1\n\
         kind: CredentialProviderConfig\n\
         providers:\n\
         - name: loopback-credentials\n  \
           matchImages: [\"{match_image}\"]\n  \
           defaultCacheDuration: 1m\n  \
           apiVersion: credentialprovider.kubelet.k8s.io/v1\n"
    );
    std::fs::write(&config, yaml).expect("write the provider config");
    let path = |path: &Path| path.to_str().expect("utf-8 path").to_owned();
    vec![
        "--image-credential-provider-config".into(),
        path(&config),
        "--image-credential-provider-bin-dir".into(),
        path(&bin_dir),
    ]
}

/// The requests the plugin got, one a run.
fn plugin_requests(dir: &Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(dir.join("plugin-requests")).unwrap_or_default();
    text.lines().map(|line| serde_json::from_str(line).expect("a JSON request")).collect()
}

#[tokio::test]
async fn a_credential_provider_plugin_alone_pulls_and_is_not_run_again_while_its_answer_is_cached() {
    let Some(p) = private_registry() else { return };
    let app = p.seed("private/app:v1");
    let other = p.seed("private/other:v1");
    let dir = p.daemon_dir("d");
    let flags = credential_plugin(&p, &dir, &p.stack.registry, ALICE);
    let (_daemon, mut client) = p.daemon(&dir, &flags.iter().map(String::as_str).collect::<Vec<_>>()).await;

    let pulled = call(&mut client, for_pod("web", &app, vec![])).await.expect("the plugin's credentials pull");
    assert_pulled(&pulled, &app);
    let expected = serde_json::json!({
        "kind": "CredentialProviderRequest",
        "apiVersion": "credentialprovider.kubelet.k8s.io/v1",
        "image": p.stack.image("private/app"),
    });
    assert_eq!(plugin_requests(&dir), [expected], "the plugin ran once, for the repository");

    // Another image of the same registry, and the first again with Always: both pulled with the
    // answer cached for the registry.
    let second = call(&mut client, for_pod("web", &other, vec![])).await.expect("cached credentials pull");
    assert_pulled(&second, &other);
    let mut always = for_pod("web", &app, vec![]);
    always.pull_policy = ALWAYS;
    let again = call(&mut client, always).await.expect("always pulls");
    assert_pulled(&again, &app);

    assert_eq!(plugin_requests(&dir).len(), 1, "no second run within the cache duration");
    assert_eq!(p.stack.auth_attempts("private/other"), ["ok alice"]);
    assert_eq!(p.stack.successful_resolutions("private/app", "v1"), 2, "Always resolved the tag again");
}

/// Sends one request per pod at once, pod `i` with `secret_of(i)`; every one must succeed.
async fn herd(
    client: &ImageManagerClient<Channel>,
    image: &str,
    pods: usize,
    secret_of: impl Fn(usize) -> PullSecret,
) -> Vec<EnsureImageExistsResponse> {
    let calls: Vec<_> = (0..pods)
        .map(|pod| {
            let mut client = client.clone();
            let request = for_pod(&format!("herd-{pod}"), image, vec![secret_of(pod)]);
            tokio::spawn(async move { call(&mut client, request).await })
        })
        .collect();
    let mut responses = Vec::with_capacity(pods);
    for call in calls {
        responses.push(call.await.expect("task").expect("every request succeeds"));
    }
    responses
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_herd_of_two_hundred_pods_with_the_same_secret_makes_one_resolution() {
    let Some(p) = private_registry() else { return };
    let image = p.seed("herd/app:v1");
    let (_daemon, client) = p.daemon(&p.daemon_dir("d"), &[]).await;

    let responses = herd(&client, &image, 200, |pod| p.secret(&format!("regcred-{pod}"), ALICE)).await;

    let refs: HashSet<_> = responses.iter().map(|response| response.image_ref.clone()).collect();
    assert_eq!(refs.len(), 1, "one image for everyone: {refs:?}");
    assert!(responses.iter().any(|response| response.pulled), "someone pulled");
    assert_eq!(p.stack.successful_resolutions("herd/app", "v1"), 1, "one shared pull");
    assert_eq!(p.stack.auth_attempts("herd/app"), ["ok alice"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_herd_with_two_credentials_makes_one_resolution_per_credential() {
    let Some(p) = private_registry() else { return };
    let image = p.seed("herd/app:v1");
    let (_daemon, client) = p.daemon(&p.daemon_dir("d"), &[]).await;

    // Alice's and bob's pods take turns, so that both pulls are asked for before either ends.
    let user = |pod: usize| if pod.is_multiple_of(2) { ALICE } else { BOB };
    let responses = herd(&client, &image, 200, |pod| p.secret(&format!("regcred-{pod}"), user(pod))).await;

    let refs: HashSet<_> = responses.iter().map(|response| response.image_ref.clone()).collect();
    assert_eq!(refs.len(), 1, "one image for everyone: {refs:?}");
    assert_eq!(p.stack.successful_resolutions("herd/app", "v1"), 2, "one pull per credential, never shared");
    let logins: HashSet<_> = p.stack.auth_attempts("herd/app").into_iter().collect();
    assert_eq!(logins, HashSet::from(["ok alice".to_owned(), "ok bob".to_owned()]));
}

#[tokio::test]
async fn no_password_reaches_the_daemons_log_even_at_trace_level() {
    let Some(p) = private_registry() else { return };
    let right = p.seed("private/right:v1");
    let wrong = p.seed("private/wrong:v1");
    let by_plugin = p.seed("viaplugin/app:v1");
    let dir = p.daemon_dir("d");
    let flags = credential_plugin(&p, &dir, &p.stack.image("viaplugin"), BOB);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let (daemon, mut client) = p.daemon_logging(&dir, &flags, "trace").await;
    let mut events = client.watch_events(WatchEventsRequest::default()).await.expect("watching").into_inner();

    // As `docker login` writes it: base64(user:password) in `auth`.
    let mut right_secret = p.secret("right", ALICE);
    right_secret.docker_config_json = p.config_json(ALICE);
    let pulled = call(&mut client, for_pod("web", &right, vec![right_secret])).await.expect("right");
    assert_pulled(&pulled, &right);
    let status =
        call(&mut client, for_pod("web", &wrong, vec![p.secret("wrong", BOB_WRONG)])).await.expect_err("wrong");
    assert_unauthorized(&status);
    let pulled = call(&mut client, for_pod("web", &by_plugin, vec![])).await.expect("plugin");
    assert_pulled(&pulled, &by_plugin);
    assert_eq!(p.stack.auth_attempts("viaplugin/app"), ["ok bob"]);

    // Nor does any event.
    let mut told = Vec::new();
    while let Ok(Ok(Some(event))) = tokio::time::timeout(std::time::Duration::from_millis(500), events.message()).await
    {
        told.push(format!("{event:?}"));
    }
    assert!(told.len() >= 6, "Pulling and Pulled or Failed for each of the three: {told:#?}");
    let told = told.join("\n");
    for (user, password) in [ALICE, BOB_WRONG, BOB] {
        assert_eq!(told.matches(password).count(), 0, "{user}'s password is in an event:\n{told}");
        assert_eq!(told.matches(&basic(user, password)).count(), 0, "{user}'s auth is in an event:\n{told}");
    }

    let (_exit, log) = daemon.terminate().await;
    assert!(log.contains("TRACE"), "the log is at trace level:\n{log}");
    for (user, password) in [ALICE, BOB_WRONG, BOB] {
        assert_eq!(log.matches(password).count(), 0, "{user}'s password {password:?} is in the log:\n{log}");
        let basic = basic(user, password);
        assert_eq!(log.matches(&basic).count(), 0, "base64 of {user}:{password} is in the log:\n{log}");
    }
}
