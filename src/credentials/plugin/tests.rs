use std::{os::unix::fs::PermissionsExt, path::Path};

use secrecy::ExposeSecret;

use super::*;

fn answer(key: &str) -> Answer {
    let auth = Arc::new(RegistryAuth::login("user".into(), "password".into()));
    Arc::new(vec![(
        key.to_owned(),
        Arc::new(Credential { auth, source: CredentialSource::Plugin { name: "p".into(), account: None } }),
    )])
}

/// A cache key without a service account.
fn plain(key: &str) -> CacheKey {
    (key.to_owned(), None)
}

fn keys(answer: &Answer) -> Vec<&str> {
    answer.iter().map(|(key, _)| key.as_str()).collect()
}

#[test]
fn cached_answers_are_found_by_image_then_registry_then_globally() {
    let now = Instant::now();
    let hour = Duration::from_secs(3600);
    let mut cache = AnswerCache::default();
    cache.insert(plain("test.registry.io"), answer("by-registry"), now, hour);
    cache.insert(plain("test.registry.io/foo/bar"), answer("by-image"), now, hour);
    assert_eq!(keys(&cache.get("test.registry.io/foo/bar", None, now).expect("cached")), ["by-image"]);
    assert_eq!(keys(&cache.get("test.registry.io/other", None, now).expect("cached")), ["by-registry"]);
    assert!(cache.get("other.registry.io/foo", None, now).is_none());
    // An answer for a registry host named `global` is that registry's only.
    cache.insert(plain("global"), answer("by-registry-global"), now, hour);
    assert_eq!(keys(&cache.get("global/foo", None, now).expect("cached")), ["by-registry-global"]);
    assert!(cache.get("other.registry.io/foo", None, now).is_none(), "not every image's");
    cache.insert(plain(GLOBAL_CACHE_KEY), answer("global"), now, hour);
    assert_eq!(keys(&cache.get("other.registry.io/foo", None, now).expect("cached")), ["global"]);
}

#[test]
fn cached_answers_expire_after_their_duration() {
    let now = Instant::now();
    let mut cache = AnswerCache::default();
    cache.insert(plain("test.registry.io"), answer("a"), now, Duration::from_secs(60));
    assert!(cache.get("test.registry.io/foo", None, now + Duration::from_secs(1)).is_some());
    assert!(cache.get("test.registry.io/foo", None, now + Duration::from_secs(60)).is_some(), "good until its expiry");
    assert!(cache.get("test.registry.io/foo", None, now + Duration::from_secs(61)).is_none());
    assert!(cache.entries.is_empty(), "expired answers are dropped");
    cache.insert(plain("forever"), answer("b"), now, Duration::MAX);
    assert!(cache.get("forever", None, now + Duration::from_secs(3600 * 24 * 365)).is_some());
}

/// A plugin script that counts its runs in `dir/runs` and answers `response` (a JSON object
/// without kind and apiVersion), after `delay` seconds.
fn plugin(dir: &Path, name: &str, response: &str, delay: &str) -> ProviderConfig {
    let executable = dir.join(name);
    let runs = dir.join("runs");
    let script = format!(
        "#!/bin/sh\ncat > {request}\necho run >> {runs}\nsleep {delay}\nprintf '%s' '{{\"kind\":\"CredentialProviderResponse\",\"apiVersion\":\"credentialprovider.kubelet.k8s.io/v1\",{response}}}'\n",
        request = dir.join("request").display(),
        runs = runs.display(),
    );
    std::fs::write(&executable, script).expect("script written");
    std::fs::set_permissions(&executable, std::fs::Permissions::from_mode(0o755)).expect("executable");
    ProviderConfig {
        name: name.into(),
        executable,
        match_images: vec!["*.registry.io".into()],
        default_cache_duration: Duration::from_secs(600),
        api_version: "credentialprovider.kubelet.k8s.io/v1".into(),
        args: Vec::new(),
        env: Vec::new(),
        token_attributes: None,
    }
}

fn runs(dir: &Path) -> usize {
    std::fs::read_to_string(dir.join("runs")).map_or(0, |text| text.lines().count())
}

const REGISTRY_ANSWER: &str =
    r#""cacheKeyType":"Registry","auth":{"*.registry.io":{"username":"plugin-user","password":"plugin-pass"}}"#;

#[tokio::test]
async fn a_plugin_is_asked_once_per_cache_duration_and_gets_the_kubelets_request() {
    let dir = tempfile::tempdir().expect("tempdir");
    let plugins = Plugins::new(vec![plugin(dir.path(), "registry-plugin", REGISTRY_ANSWER, "0")]);
    let first = plugins.provide("test.registry.io/foo/bar", None).await;
    assert_eq!(first.len(), 1);
    let (key, credential) = &first[0];
    assert_eq!(key, "*.registry.io");
    assert_eq!(credential.auth.username.expose_secret(), "plugin-user");
    assert_eq!(credential.auth.password.expose_secret(), "plugin-pass");
    assert_eq!(credential.source, CredentialSource::Plugin { name: "registry-plugin".into(), account: None });
    let request = std::fs::read_to_string(dir.path().join("request")).expect("request read");
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&request).expect("JSON"),
        serde_json::json!({"kind": "CredentialProviderRequest", "apiVersion": "credentialprovider.kubelet.k8s.io/v1", "image": "test.registry.io/foo/bar"})
    );
    assert_eq!(plugins.provide("test.registry.io/other", None).await.len(), 1, "same registry, from the cache");
    assert_eq!(runs(dir.path()), 1);
    assert!(plugins.provide("registry.local/app", None).await.is_empty(), "not in matchImages");
    assert_eq!(runs(dir.path()), 1, "not run for an image it does not cover");
}

#[tokio::test]
async fn concurrent_asks_for_one_image_share_one_run() {
    let dir = tempfile::tempdir().expect("tempdir");
    let plugins = Plugins::new(vec![plugin(dir.path(), "slow", REGISTRY_ANSWER, "0.3")]);
    let asks = (0..5).map(|_| plugins.provide("test.registry.io/foo/bar", None));
    let answers = futures_util::future::join_all(asks).await;
    assert!(answers.iter().all(|answer| answer.len() == 1));
    assert_eq!(runs(dir.path()), 1);
}

#[tokio::test]
async fn a_zero_or_negative_cache_duration_caches_nothing() {
    for duration in ["0s", "-1m"] {
        let dir = tempfile::tempdir().expect("tempdir");
        let response = REGISTRY_ANSWER.replace("\"Registry\"", &format!("\"Global\",\"cacheDuration\":\"{duration}\""));
        let plugins = Plugins::new(vec![plugin(dir.path(), "uncached", &response, "0")]);
        for _ in 0..2 {
            assert_eq!(plugins.provide("test.registry.io/foo", None).await.len(), 1, "{duration}");
        }
        assert_eq!(runs(dir.path()), 2, "{duration}");
    }
}

#[tokio::test]
async fn a_failing_or_confused_plugin_gives_nothing_and_the_others_still_answer() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut failing = plugin(dir.path(), "failing", REGISTRY_ANSWER, "0");
    std::fs::write(&failing.executable, "#!/bin/sh\necho 'no credentials for you' >&2\nexit 3\n").expect("script");
    let wrong_version = plugin(dir.path(), "wrong-version", REGISTRY_ANSWER, "0");
    let bad_key_type = plugin(dir.path(), "bad-key-type", &REGISTRY_ANSWER.replace("Registry", "Pod"), "0");
    let mut missing = plugin(dir.path(), "missing", REGISTRY_ANSWER, "0");
    missing.executable = dir.path().join("not-there");
    let wrong_version =
        ProviderConfig { api_version: "credentialprovider.kubelet.k8s.io/v1beta1".into(), ..wrong_version };
    failing.name = "failing".into();
    let good = plugin(&tempfile::tempdir().expect("tempdir").keep(), "good", REGISTRY_ANSWER, "0");
    let plugins = Plugins::new(vec![failing, wrong_version, bad_key_type, missing, good]);
    let answer = plugins.provide("test.registry.io/foo", None).await;
    let sources: Vec<_> = answer.iter().map(|(_, credential)| credential.source.clone()).collect();
    assert_eq!(sources, [CredentialSource::Plugin { name: "good".into(), account: None }]);
}

#[tokio::test]
async fn exec_errors_say_what_went_wrong() {
    let dir = tempfile::tempdir().expect("tempdir");
    let failing = plugin(dir.path(), "failing", REGISTRY_ANSWER, "0");
    std::fs::write(&failing.executable, "#!/bin/sh\necho 'token endpoint refused' >&2\nexit 3\n").expect("script");
    let error = exec::run(&failing, "test.registry.io/foo", None).await.err().expect("fails");
    assert_eq!(error.to_string(), "exited with exit status: 3: token endpoint refused");
    let wrong = ProviderConfig {
        api_version: "credentialprovider.kubelet.k8s.io/v1beta1".into(),
        ..plugin(dir.path(), "ok", REGISTRY_ANSWER, "0")
    };
    let error = exec::run(&wrong, "test.registry.io/foo", None).await.err().expect("fails");
    assert_eq!(
        error.to_string(),
        "apiVersion from credential plugin response did not match expected apiVersion:credentialprovider.kubelet.k8s.io/v1beta1, actual apiVersion:credentialprovider.kubelet.k8s.io/v1"
    );
}

#[tokio::test]
async fn a_plugin_gets_the_host_environment_with_its_own_on_top() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = plugin(dir.path(), "env", REGISTRY_ANSWER, "0");
    let script = std::fs::read_to_string(&config.executable).expect("script");
    let script = script.replacen("cat >", &format!("env > {}\ncat >", dir.path().join("env").display()), 1);
    std::fs::write(&config.executable, script).expect("script");
    config.env = vec![("PLUGIN_REGION".into(), "eu-1".into()), ("HOME".into(), "/plugin-home".into())];
    config.args = vec!["get-credentials".into()];
    assert_eq!(Plugins::new(vec![config]).provide("test.registry.io/foo", None).await.len(), 1);
    let env = std::fs::read_to_string(dir.path().join("env")).expect("env written");
    assert!(env.lines().any(|line| line == "PLUGIN_REGION=eu-1"), "{env}");
    assert!(env.lines().any(|line| line == "HOME=/plugin-home"), "the config overrides the host: {env}");
    assert!(env.lines().any(|line| line.starts_with("PATH=")), "the host's environment is kept: {env}");
}

/// `plugin` with its script replaced by `body` (after `#!/bin/sh`).
fn scripted(dir: &Path, name: &str, body: &str) -> ProviderConfig {
    let config = plugin(dir, name, REGISTRY_ANSWER, "0");
    std::fs::write(&config.executable, format!("#!/bin/sh\n{body}\n")).expect("script");
    config
}

/// Whether the process whose pid is in `file` is gone (a zombie is), waiting up to 2 s for it.
async fn gone(file: &Path) -> bool {
    let pid = std::fs::read_to_string(file).expect("the pid was written");
    let alive =
        || std::fs::read_to_string(format!("/proc/{}/stat", pid.trim())).is_ok_and(|stat| !stat.contains(") Z "));
    for _ in 0..100 {
        if !alive() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

const ANSWER_JSON: &str = r#"{"kind":"CredentialProviderResponse","apiVersion":"credentialprovider.kubelet.k8s.io/v1","cacheKeyType":"Image","auth":{}}"#;

#[tokio::test]
async fn a_plugin_that_writes_past_the_cap_is_killed_and_gives_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    // 100 MiB of output, read whole it would be held in memory.
    let config = scripted(dir.path(), "flood", "cat >/dev/null; head -c 104857600 /dev/zero");
    let started = tokio::time::Instant::now();
    let error = exec::run(&config, "test.registry.io/foo", None).await.err().expect("refused");
    assert_eq!(error.to_string(), "wrote more than 1048576 bytes to stdout; killed");
    assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());
}

#[tokio::test]
async fn a_plugin_that_leaves_a_child_holding_its_stdout_answers_at_once_and_the_child_is_killed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let child_pid = dir.path().join("child.pid");
    let body = format!("cat >/dev/null\nsleep 60 &\necho $! > {}\nprintf '%s' '{ANSWER_JSON}'", child_pid.display());
    let config = scripted(dir.path(), "leaves-a-child", &body);
    let started = tokio::time::Instant::now();
    let answer = exec::run(&config, "test.registry.io/foo", None).await.map_err(|error| error.to_string());
    assert!(answer.is_ok(), "{:?}", answer.err());
    assert!(started.elapsed() < Duration::from_secs(10), "not at the 60 s timeout: {:?}", started.elapsed());
    assert!(gone(&child_pid).await, "what the plugin left running was killed with its group");
}

#[tokio::test]
async fn at_its_timeout_a_plugin_and_everything_it_started_are_killed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let child_pid = dir.path().join("child.pid");
    let body = format!("sleep 60 &\necho $! > {}\nsleep 60", child_pid.display());
    let config = scripted(dir.path(), "hangs", &body);
    let error =
        exec::run_within(&config, "test.registry.io/foo", None, Duration::from_secs(1)).await.err().expect("times out");
    assert_eq!(error.to_string(), "did not finish within 1s; killed");
    assert!(gone(&child_pid).await, "the plugin's child outlived its timeout");
}

#[tokio::test]
async fn at_most_four_runs_of_a_plugin_are_under_way_and_the_others_wait_their_turn() {
    let dir = tempfile::tempdir().expect("tempdir");
    let running = dir.path().join("running");
    std::fs::create_dir(&running).expect("dir");
    let counts = dir.path().join("counts");
    let body = format!(
        "cat >/dev/null\ntouch {running}/$$\nls {running} | wc -l >> {counts}\nsleep 0.3\nrm {running}/$$\nprintf '%s' '{ANSWER_JSON}'",
        running = running.display(),
        counts = counts.display()
    );
    let plugins = Plugins::new(vec![scripted(dir.path(), "counted", &body)]);
    let plugins = &plugins;
    let asks = (0..16).map(|i| async move { plugins.provide(&format!("test.registry.io/image-{i}"), None).await });
    futures_util::future::join_all(asks).await;
    let counts = std::fs::read_to_string(&counts).expect("counted");
    let counts: Vec<usize> = counts.lines().map(|line| line.trim().parse().expect("a count")).collect();
    assert_eq!(counts.len(), 16, "every image's run ran");
    let most = counts.iter().copied().max().unwrap_or_default();
    assert!(
        (2..=MAX_RUNS_PER_PLUGIN).contains(&most),
        "at most {MAX_RUNS_PER_PLUGIN} at once, and some at once: {counts:?}"
    );
}

/// `plugin` given tokens for the audience `registry.io`, cached by `cache_type`, requiring a
/// service account with the annotation `example.com/role`, and sending `example.com/tenant` too.
fn token_plugin(dir: &Path, response: &str, cache_type: config::CacheType) -> ProviderConfig {
    ProviderConfig {
        token_attributes: Some(config::TokenAttributes {
            audience: "registry.io".into(),
            cache_type,
            require_service_account: true,
            required_annotation_keys: vec!["example.com/role".into()],
            optional_annotation_keys: vec!["example.com/tenant".into()],
        }),
        ..plugin(dir, "token-plugin", response, "0")
    }
}

/// The service account `builder` (uid `uid`) in `team`, with `token` for `registry.io`.
fn account(uid: &str, token: &str) -> ServiceAccount {
    ServiceAccount {
        namespace: "team".into(),
        name: "builder".into(),
        uid: uid.into(),
        annotations: [("example.com/role", "pull"), ("example.com/tenant", "blue"), ("unrelated", "x")]
            .into_iter()
            .map(|(key, value)| (key.to_owned(), value.to_owned()))
            .collect(),
        tokens: vec![
            crate::credentials::account::AudienceToken { audience: "other.io".into(), token: "not-ours".into() },
            crate::credentials::account::AudienceToken { audience: "registry.io".into(), token: token.into() },
        ],
    }
}

fn last_request(dir: &Path) -> serde_json::Value {
    let request = std::fs::read_to_string(dir.join("request")).expect("request read");
    serde_json::from_str(&request).expect("JSON")
}

const IMAGE: &str = "test.registry.io/foo/bar";

#[tokio::test]
async fn a_plugin_with_token_attributes_gets_the_token_for_its_audience_and_only_the_annotations_it_names() {
    let dir = tempfile::tempdir().expect("tempdir");
    let plugins = Plugins::new(vec![token_plugin(dir.path(), REGISTRY_ANSWER, config::CacheType::ServiceAccount)]);
    let answer = plugins.provide(IMAGE, Some(&account("uid-1", "sa-token-1"))).await;
    assert_eq!(answer.len(), 1, "the plugin's credentials");
    assert_eq!(
        last_request(dir.path()),
        serde_json::json!({
            "kind": "CredentialProviderRequest",
            "apiVersion": "credentialprovider.kubelet.k8s.io/v1",
            "image": IMAGE,
            "serviceAccountToken": "sa-token-1",
            "serviceAccountAnnotations": {"example.com/role": "pull", "example.com/tenant": "blue"},
        })
    );
}

#[tokio::test]
async fn without_a_service_account_an_optional_one_is_asked_without_token_fields_and_cached_apart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = token_plugin(dir.path(), REGISTRY_ANSWER, config::CacheType::ServiceAccount);
    let attributes = config.token_attributes.as_mut().expect("set");
    (attributes.require_service_account, attributes.required_annotation_keys) = (false, Vec::new());
    let plugins = Plugins::new(vec![config]);
    assert_eq!(plugins.provide(IMAGE, None).await.len(), 1);
    assert_eq!(
        last_request(dir.path()),
        serde_json::json!({"kind": "CredentialProviderRequest", "apiVersion": "credentialprovider.kubelet.k8s.io/v1", "image": IMAGE})
    );
    assert_eq!(plugins.provide(IMAGE, Some(&account("uid-1", "t"))).await.len(), 1);
    assert_eq!(runs(dir.path()), 2, "the answer without an account is not the account's");
    assert_eq!(
        last_request(dir.path())["serviceAccountAnnotations"],
        serde_json::json!({"example.com/tenant": "blue"})
    );
    plugins.provide(IMAGE, None).await;
    plugins.provide(IMAGE, Some(&account("uid-1", "t"))).await;
    assert_eq!(runs(dir.path()), 2, "each from its own cache entry");
}

#[tokio::test]
async fn a_plugin_is_not_run_without_the_account_annotation_or_token_it_requires() {
    let dir = tempfile::tempdir().expect("tempdir");
    let plugins = Plugins::new(vec![token_plugin(dir.path(), REGISTRY_ANSWER, config::CacheType::ServiceAccount)]);
    assert!(plugins.provide(IMAGE, None).await.is_empty(), "no service account");
    let nameless = ServiceAccount { name: String::new(), ..account("uid-1", "t") };
    assert!(plugins.provide(IMAGE, Some(&nameless)).await.is_empty(), "an empty name is no service account");
    let mut unannotated = account("uid-1", "t");
    unannotated.annotations.remove("example.com/role");
    assert!(plugins.provide(IMAGE, Some(&unannotated)).await.is_empty(), "a required annotation missing");
    let mut tokenless = account("uid-1", "t");
    tokenless.tokens.retain(|token| token.audience != "registry.io");
    assert!(plugins.provide(IMAGE, Some(&tokenless)).await.is_empty(), "no token for the audience");
    assert_eq!(runs(dir.path()), 0);
}

#[tokio::test]
async fn under_the_service_account_cache_type_any_token_of_one_account_shares_an_answer() {
    let dir = tempfile::tempdir().expect("tempdir");
    let plugins = Plugins::new(vec![token_plugin(dir.path(), REGISTRY_ANSWER, config::CacheType::ServiceAccount)]);
    plugins.provide(IMAGE, Some(&account("uid-1", "token-a"))).await;
    plugins.provide(IMAGE, Some(&account("uid-1", "token-b"))).await;
    assert_eq!(runs(dir.path()), 1, "two tokens of one account");
    let mut unnamed_change = account("uid-1", "token-c");
    unnamed_change.annotations.insert("unrelated".into(), "changed".into());
    plugins.provide(IMAGE, Some(&unnamed_change)).await;
    assert_eq!(runs(dir.path()), 1, "an annotation the plugin does not get is not in the key");
    plugins.provide(IMAGE, Some(&account("uid-2", "token-a"))).await;
    assert_eq!(runs(dir.path()), 2, "a recreated account (another uid)");
    let mut changed = account("uid-1", "token-a");
    changed.annotations.insert("example.com/tenant".into(), "green".into());
    plugins.provide(IMAGE, Some(&changed)).await;
    assert_eq!(runs(dir.path()), 3, "a changed annotation the plugin gets");
}

#[tokio::test]
async fn under_the_token_cache_type_each_token_is_asked_about_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let plugins = Plugins::new(vec![token_plugin(dir.path(), REGISTRY_ANSWER, config::CacheType::Token)]);
    plugins.provide(IMAGE, Some(&account("uid-1", "token-a"))).await;
    plugins.provide(IMAGE, Some(&account("uid-1", "token-b"))).await;
    assert_eq!(runs(dir.path()), 2, "two tokens");
    assert_eq!(last_request(dir.path())["serviceAccountToken"], "token-b");
    plugins.provide(IMAGE, Some(&account("uid-1", "token-a"))).await;
    plugins.provide(IMAGE, Some(&account("uid-1", "token-b"))).await;
    assert_eq!(runs(dir.path()), 2, "each token again, from the cache");
}

#[tokio::test]
async fn the_token_echoed_as_the_password_is_dropped_unless_cached_per_token() {
    let echoing = REGISTRY_ANSWER.replace("plugin-pass", "sa-token-1");
    for (cache_type, kept) in [(config::CacheType::ServiceAccount, 0), (config::CacheType::Token, 1)] {
        let dir = tempfile::tempdir().expect("tempdir");
        let plugins = Plugins::new(vec![token_plugin(dir.path(), &echoing, cache_type)]);
        let answer = plugins.provide(IMAGE, Some(&account("uid-1", "sa-token-1"))).await;
        assert_eq!(answer.len(), kept, "{cache_type:?}");
        plugins.provide(IMAGE, Some(&account("uid-1", "sa-token-1"))).await;
        let expected_runs = if kept == 0 { 2 } else { 1 };
        assert_eq!(runs(dir.path()), expected_runs, "{cache_type:?}: a dropped answer is not cached");
    }
}

#[tokio::test]
async fn concurrent_asks_with_one_token_share_one_run() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = ProviderConfig {
        token_attributes: token_plugin(dir.path(), REGISTRY_ANSWER, config::CacheType::Token).token_attributes,
        ..plugin(dir.path(), "slow", REGISTRY_ANSWER, "0.3")
    };
    let plugins = Plugins::new(vec![config]);
    let account = account("uid-1", "sa-token-1");
    let answers = futures_util::future::join_all((0..5).map(|_| plugins.provide(IMAGE, Some(&account)))).await;
    assert!(answers.iter().all(|answer| answer.len() == 1));
    assert_eq!(runs(dir.path()), 1);
}

#[test]
fn the_token_is_never_printed_nor_in_a_key() {
    let token = "sa-token-secret-value";
    let account = account("uid-1", token);
    assert!(!format!("{account:?}").contains(token), "{account:?}");
    for cache_type in [config::CacheType::ServiceAccount, config::CacheType::Token] {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = token_plugin(dir.path(), REGISTRY_ANSWER, cache_type);
        let ask = account::ask(config.token_attributes.as_ref(), Some(&account), "p").expect("asked");
        for key in [&ask.cache_key, &ask.flight_key] {
            assert!(!format!("{key:?}").contains(token), "{key:?}");
        }
        assert_ne!(ask.cache_key, None);
    }
}
