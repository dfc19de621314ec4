//! Pull credentials at scale: a pod with 100 pull secrets of 50 registries each. On the presence
//! path they are carried but never read, unless the present image must be verified (KEP-2535,
//! AlwaysVerify): then they are read and matched against its record; on the pull path they are
//! read and matched, once per pull. Each is compared with the same calls without secrets, or
//! (verification) with the same request not read.

use std::time::{Duration, Instant};

use cri_imaged::{
    api::{self, EnsureImageExistsRequest},
    credentials::{self, NodeCredentials, SecretCoordinates, secrets},
};

use crate::{
    Bench, Daemon, Findings, calling, ensure_request,
    load::Run,
    memory::CountingAllocator,
    report::{self, Table, Verdict},
    take_turns,
};

/// Secrets per pod.
pub const SECRETS: usize = 100;
/// Registries per secret.
pub const ENTRIES: usize = 50;

/// The pod's secrets on the wire: every entry for a registry of its own, except the last one of
/// the last secret, which is for `registry` (so that a lookup walks them all and finds one).
pub fn pull_secrets(registry: &str) -> Vec<api::PullSecret> {
    (0..SECRETS)
        .map(|secret| {
            let auths: serde_json::Map<String, serde_json::Value> = (0..ENTRIES)
                .map(|entry| {
                    let key = if secret == SECRETS - 1 && entry == ENTRIES - 1 {
                        registry.to_owned()
                    } else {
                        format!("registry-{secret}-{entry}.example.com/team-{entry}")
                    };
                    let login =
                        serde_json::json!({"username": format!("user-{secret}-{entry}"), "password": "s3cret-pw"});
                    (key, login)
                })
                .collect();
            api::PullSecret {
                name: format!("regcred-{secret}"),
                namespace: "bench".into(),
                docker_config_json: serde_json::json!({ "auths": auths }).to_string(),
                uid: format!("uid-{secret}"),
                r#type: secrets::DOCKER_CONFIG_JSON.into(),
            }
        })
        .collect()
}

/// `measured`'s p50 against `baseline`'s: at most 1.10.
pub fn ratio_verdict(what: String, measured: &Run, baseline: &Run) -> Verdict {
    let (p50, base) = (measured.quantile_us(0.5), baseline.quantile_us(0.5));
    let ratio = f64::from(p50) / f64::from(base);
    Verdict {
        what,
        target: "≤ 1.10".into(),
        measured: format!("{ratio:.2} ({} vs {})", report::micros(p50), report::micros(base)),
        met: ratio <= 1.1,
    }
}

/// The presence path when the pod's secrets must be read: an image pulled with one of the secrets
/// under AlwaysVerify, so that every later pod's right to it is checked against its record with
/// the pod's own secrets; against the same requests to a daemon that does not verify (the secrets
/// carried, never read).
pub async fn verified_presence(bench: &Bench, wire: &[api::PullSecret], findings: &mut Findings) {
    bench.stack.seed("bench/verified:v1", "verified with a pull secret");
    let image = bench.stack.image("bench/verified:v1");
    let always =
        Daemon::start(bench, "verified", &["--image-pull-credentials-verification-policy", "AlwaysVerify"]).await;
    let never =
        Daemon::start(bench, "not-verified", &["--image-pull-credentials-verification-policy", "NeverVerify"]).await;
    let request = EnsureImageExistsRequest { pull_secrets: wire.to_vec(), ..ensure_request(&image, "verified") };
    let mut first = always.client.clone();
    let pulled = first.ensure_image_exists(request.clone()).await.expect("pulled with the secrets").into_inner();
    assert!(pulled.pulled, "the image was absent: pulled with the pod's secrets, and recorded");
    let sides = [
        ("AlwaysVerify: read and matched against the record", calling(&always.client, request.clone(), false)),
        ("NeverVerify: carried, not read", calling(&never.client, request, false)),
    ];
    let mut table = Table::new(
        format!(
            "Presence with {SECRETS} secrets × {ENTRIES} registries verified (each secret read once, then only compared) against the same requests not verified"
        ),
        &["concurrency", "path", "p50", "p99", "req/s", "p50 / not verified"],
    );
    for &concurrency in bench.sizes.concurrencies {
        let runs = take_turns(&sides, concurrency, bench.sizes).await;
        for ((path, _), run) in sides.iter().zip(&runs) {
            table.row(report::side_row(concurrency, path, run, &[&runs[1]]));
        }
        if concurrency == 1 || concurrency == 64 {
            let what = format!(
                "presence p50 with {SECRETS} secrets × {ENTRIES} registries, verified / not verified, concurrency {concurrency}"
            );
            findings.verdicts.push(ratio_verdict(what, &runs[0], &runs[1]));
        }
    }
    let checked = always.metric("cri_imaged_imagemanager_image_mustpull_checks_total");
    assert!(checked > 0.0, "the AlwaysVerify answers were checked against the record");
    findings.tables.push(table);
}

/// The lookup in process, for one pull: the secrets read afresh (the first time a node sees
/// them), and read before (every time after).
pub async fn lookup(bench: &Bench, allocator: &CountingAllocator, wire: &[api::PullSecret], findings: &mut Findings) {
    let image_name = format!("{}/bench/present", bench.stack.registry);
    let rounds = if bench.sizes.pairs > 1 { 200 } else { 5 };
    let secrets_label = format!("{SECRETS} secrets × {ENTRIES} registries");
    let mut table = Table::new(
        format!("Credential lookup in process: {secrets_label} matched for one pull"),
        &["secrets", "time per lookup", "allocations per lookup", "allocations per registry entry"],
    );
    for (label, prepared) in [("read afresh", false), ("read before (as the daemon keeps them)", true)] {
        let cost = lookup_cost(allocator, wire, &image_name, rounds, prepared).await;
        assert_eq!(cost.found, 1, "exactly the one entry for the bench's registry matches");
        let per_lookup = report::micros(u32::try_from(cost.per_lookup.as_micros()).unwrap_or(u32::MAX));
        table.row(vec![
            label.into(),
            per_lookup.clone(),
            format!("{:.0}", cost.allocations_per_lookup),
            format!("{:.2}", cost.allocations_per_lookup / (SECRETS * ENTRIES) as f64),
        ]);
        let (what, target, limit) = if prepared {
            (
                format!("credential lookup for one pull with {secrets_label} read before"),
                "≤ 100 µs",
                Duration::from_micros(100),
            )
        } else {
            (
                format!("credential lookup for one pull with {secrets_label} read afresh"),
                "≤ 10 ms",
                Duration::from_millis(10),
            )
        };
        findings.verdicts.push(Verdict {
            what,
            target: target.into(),
            measured: per_lookup,
            met: cost.per_lookup <= limit,
        });
    }
    findings.tables.push(table);
}

/// What finding the credentials for one image costs, per pull.
pub struct LookupCost {
    pub per_lookup: Duration,
    pub allocations_per_lookup: f64,
    /// Credentials found for the image: must be 1.
    pub found: usize,
}

/// Builds the pod's keyring and looks `image_name` up in it and in the node's (empty) keyring,
/// `rounds` times, as a pull does: each time read afresh, or (`prepared`) read once, before.
pub async fn lookup_cost(
    allocator: &CountingAllocator,
    wire: &[api::PullSecret],
    image_name: &str,
    rounds: usize,
    prepared: bool,
) -> LookupCost {
    let pull_secrets: Vec<secrets::PullSecret> = wire
        .iter()
        .map(|secret| secrets::PullSecret {
            coordinates: SecretCoordinates {
                uid: secret.uid.clone(),
                namespace: secret.namespace.clone(),
                name: secret.name.clone(),
            },
            kind: secret.r#type.clone(),
            content: secret.docker_config_json.as_str().into(),
        })
        .collect();
    let node = NodeCredentials::none();
    let kept = secrets::PreparedSecrets::default();
    if prepared {
        kept.keyring_for(image_name, &pull_secrets).expect("the bench's secrets parse");
    }
    let allocations_before = allocator.allocations_made();
    let started = Instant::now();
    let mut found = 0;
    for _ in 0..rounds {
        let keyring = if prepared {
            kept.keyring_for(image_name, &pull_secrets)
        } else {
            secrets::keyring_for(image_name, &pull_secrets)
        };
        let keyring = keyring.expect("the bench's secrets parse");
        found = credentials::for_pull(image_name, &keyring, &node, None).await.len();
    }
    let elapsed = started.elapsed();
    let allocations = allocator.allocations_made() - allocations_before;
    LookupCost {
        per_lookup: elapsed / rounds as u32,
        allocations_per_lookup: allocations as f64 / rounds as f64,
        found,
    }
}

/// What the request's bytes alone cost, in process, with no socket and no lookup: encoding it (the
/// caller's part) and decoding it (the daemon's), against the presence call without secrets
/// (`without_us`, its p50 at one caller). The ≤ 1.10 rows leave the secrets a tenth of that call;
/// this says how much of it moving the bytes takes before anything reads them.
pub fn request_bytes(request: &EnsureImageExistsRequest, without_us: u32, rounds: usize, findings: &mut Findings) {
    use prost::Message;
    let mut table = Table::new(
        format!(
            "The request's bytes alone, in process: EnsureImageExists with {SECRETS} secrets × {ENTRIES} registries"
        ),
        &["step", "time per request", "of the presence call without secrets"],
    );
    let encoded = request.encode_to_vec();
    let started = Instant::now();
    for _ in 0..rounds {
        std::hint::black_box(std::hint::black_box(request).encode_to_vec());
    }
    let encode = started.elapsed() / rounds as u32;
    let started = Instant::now();
    for _ in 0..rounds {
        let decoded = EnsureImageExistsRequest::decode(std::hint::black_box(encoded.as_slice()));
        std::hint::black_box(decoded.expect("the bench's request decodes"));
    }
    let decode = started.elapsed() / rounds as u32;
    let share = |took: Duration| format!("{:.2}", took.as_secs_f64() * 1e6 / f64::from(without_us));
    let micros = |took: Duration| report::micros(u32::try_from(took.as_micros()).unwrap_or(u32::MAX));
    for (step, took) in [
        (format!("encode ({} KiB, as the caller does)", encoded.len() / 1024), encode),
        ("decode (as the daemon does)".to_owned(), decode),
        ("both".to_owned(), encode + decode),
    ] {
        table.row(vec![step, micros(took), share(took)]);
    }
    findings.verdicts.push(Verdict {
        what: "the request's bytes alone (encode + decode in process) / presence p50 without secrets, concurrency 1"
            .into(),
        target: "reported".into(),
        measured: format!("{} ({} vs {})", share(encode + decode), micros(encode + decode), report::micros(without_us)),
        met: true,
    });
    findings.tables.push(table);
}
