//! `cri-imaged policy check IMAGE`: the image policy's decision, explained; and the policy's
//! lines in `status` and its column in `images`.

use std::time::SystemTime;

use serde_json::{Value, json};

use super::{
    CliError,
    client::Daemon,
    output::{Style, print_json, print_lines},
    render::{
        human::{age, moment, rfc3339},
        line::Line,
    },
    secret,
};
use crate::{
    api,
    config::client::{PolicyAction, PolicyArgs, PolicyCheckArgs},
};

pub async fn run(args: PolicyArgs) -> Result<(), CliError> {
    match args.action {
        PolicyAction::Check(args) => check(args).await,
    }
}

async fn check(args: PolicyCheckArgs) -> Result<(), CliError> {
    let style = Style::of(args.format.output);
    let pull_secrets = args.secret.iter().map(|path| secret::read(path)).collect::<Result<_, _>>()?;
    let request = api::CheckImagePolicyRequest {
        image: args.image.clone(),
        namespace: args.namespace.clone().unwrap_or_default(),
        pull_secrets,
    };
    let mut daemon = Daemon::connect(&args.connection).await?;
    let answer = daemon.client.check_image_policy(daemon.timed(request)).await;
    let answer = daemon.answer(answer, "CheckImagePolicy").await?;
    if style.json() {
        print_json(&check_json(&answer))?;
    } else {
        print_lines(check_lines(&answer), &style)?;
    }
    match answer.result.as_str() {
        "refused" => Err(CliError::Refused { reason: "SignatureValidationFailed".to_owned(), message: answer.refusal }),
        _ => Ok(()),
    }
}

/// Which policy, in words.
fn policy_of(policy: &str, namespace: &str) -> String {
    match policy {
        "none" => "none configured: every image is allowed".to_owned(),
        "namespace" => format!("namespace {namespace}'s own"),
        "default" => "the node's (--signature-policy)".to_owned(),
        other => other.to_owned(),
    }
}

fn scope_of(scope: Option<&str>) -> String {
    match scope {
        None => "default (no transports.docker scope matched)".to_owned(),
        Some("") => "\"\" (the docker transport's default)".to_owned(),
        Some(scope) => format!("{scope:?}"),
    }
}

fn check_lines(answer: &api::CheckImagePolicyResponse) -> Vec<Line> {
    let verdict = match answer.result.as_str() {
        "allowed" => Line::strong("allowed"),
        "audited" => Line::alert("refused, let in by audit mode"),
        other => Line::alert(other.to_owned()),
    };
    let mut lines = vec![Line::plain(format!("{}: ", answer.image)).append(verdict)];
    let mut say = |what: &str, text: Line| lines.push(Line::plain(format!("  {what:<13}")).append(text));
    say("policy", Line::plain(policy_of(&answer.policy, &answer.namespace)));
    if answer.policy != "none" {
        say("scope", Line::plain(scope_of(answer.scope.as_deref())));
        for requirement in &answer.requirements {
            say("requirement", Line::plain(requirement.clone()));
        }
        say("mode", Line::plain(answer.mode.clone()));
    }
    if !answer.digest_source.is_empty() {
        let from = match answer.digest_source.as_str() {
            "present" => "the image on the node",
            "reference" => "the image's own digest",
            "registry" => "its tag, resolved at the registry now",
            other => other,
        };
        let digest = if answer.digest.is_empty() { "unknown" } else { answer.digest.as_str() };
        say("digest", Line::plain(format!("{digest} ({from})")));
    }
    for matched in &answer.verified_by {
        say("verified by", Line::plain(format!("key {}, signature {}", matched.key, matched.signature)));
    }
    if !answer.refusal.is_empty() {
        say("why", Line::alert(answer.refusal.clone()));
    }
    lines
}

fn check_json(answer: &api::CheckImagePolicyResponse) -> Value {
    json!({
        "result": answer.result,
        "image": answer.image,
        "policy": answer.policy,
        "namespace": answer.namespace,
        "scope": answer.scope,
        "requirements": answer.requirements,
        "mode": answer.mode,
        "digest": answer.digest,
        "digestSource": answer.digest_source,
        "verifiedBy": answer.verified_by.iter().map(|matched| json!({
            "key": matched.key, "signature": matched.signature,
        })).collect::<Vec<_>>(),
        "refusal": answer.refusal,
    })
}

/// `status`'s lines about the policy: `(label, text)`.
pub fn status_lines(policy: Option<&api::ImagePolicyStatus>, now: SystemTime) -> Vec<(&'static str, String)> {
    let Some(policy) = policy else { return vec![("image policy", "none: every image is allowed".to_owned())] };
    let mut files = Vec::new();
    if !policy.policy_file.is_empty() {
        files.push(policy.policy_file.clone());
    }
    if !policy.namespace_dir.is_empty() {
        files.push(format!("{} namespace files in {}", policy.namespace_files, policy.namespace_dir));
    }
    vec![
        (
            "image policy",
            format!("{}: {} (loaded {} ago)", policy.mode, files.join(", "), age(moment(policy.loaded.as_ref()), now)),
        ),
        ("policy digest", policy.digest.clone()),
        (
            "signatures",
            format!(
                "{} verified, {} rejected, {} errors reading them; {} answered from memory",
                policy.verifications_verified,
                policy.verifications_rejected,
                policy.verifications_error,
                policy.signature_cache_hits
            ),
        ),
    ]
}

pub fn status_json(policy: Option<&api::ImagePolicyStatus>) -> Value {
    let Some(policy) = policy else { return Value::Null };
    json!({
        "policyFile": policy.policy_file,
        "namespaceDir": policy.namespace_dir,
        "namespaceFiles": policy.namespace_files,
        "digest": policy.digest,
        "mode": policy.mode,
        "loaded": rfc3339(policy.loaded.as_ref()),
        "verifications": {
            "verified": policy.verifications_verified,
            "rejected": policy.verifications_rejected,
            "error": policy.verifications_error,
        },
        "signatureCacheHits": policy.signature_cache_hits,
    })
}

/// `images`' VERIFIED cell: each policy the image's signatures met (`default`, `ns:team`), or
/// `-` when none was asked of it since the daemon started.
pub fn verified_cell(image: &api::NodeImage) -> String {
    let mut under: Vec<String> = image
        .verifications
        .iter()
        .map(|verification| match verification.policy.as_str() {
            "namespace" => format!("ns:{}", verification.namespace),
            other => other.to_owned(),
        })
        .collect();
    under.dedup();
    if under.is_empty() { "-".to_owned() } else { under.join(",") }
}

pub fn verifications_json(image: &api::NodeImage) -> Value {
    json!(
        image
            .verifications
            .iter()
            .map(|verification| json!({
                "digest": verification.digest,
                "policy": verification.policy,
                "namespace": verification.namespace,
                "scope": verification.scope,
                "keys": verification.keys,
            }))
            .collect::<Vec<_>>()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::render::hostile::{assert_json_line, every_style, hostile, rendered, shown};

    fn refused() -> api::CheckImagePolicyResponse {
        api::CheckImagePolicyResponse {
            result: "refused".into(),
            image: "r.example/app:v1".into(),
            policy: "namespace".into(),
            namespace: "team".into(),
            scope: Some("r.example/app".into()),
            requirements: vec![
                "sigstoreSigned (keyPath /k.pub: ECDSA P-256 0123abcd; signedIdentity matchRepository)".into(),
            ],
            mode: "enforce".into(),
            digest: "sha256:aa".into(),
            digest_source: "registry".into(),
            verified_by: Vec::new(),
            refusal: "Running image docker://r.example/app:v1 is rejected by policy (…): no signature".into(),
        }
    }

    #[test]
    fn a_refusal_names_the_policy_scope_requirement_digest_and_why() {
        let text: Vec<String> = check_lines(&refused()).iter().map(Line::text).collect();
        assert_eq!(text[0], "r.example/app:v1: refused");
        assert_eq!(text[1], "  policy       namespace team's own");
        assert_eq!(text[2], "  scope        \"r.example/app\"");
        assert!(text[3].starts_with("  requirement  sigstoreSigned (keyPath /k.pub"), "{text:?}");
        assert_eq!(text[5], "  digest       sha256:aa (its tag, resolved at the registry now)");
        assert!(text[6].starts_with("  why          Running image"), "{text:?}");
    }

    #[test]
    fn no_policy_says_so_and_nothing_more() {
        let answer = api::CheckImagePolicyResponse {
            result: "allowed".into(),
            image: "docker.io/library/busybox:1".into(),
            policy: "none".into(),
            ..Default::default()
        };
        let text: Vec<String> = check_lines(&answer).iter().map(Line::text).collect();
        assert_eq!(
            text,
            ["docker.io/library/busybox:1: allowed", "  policy       none configured: every image is allowed"]
        );
    }

    #[test]
    fn an_image_is_shown_verified_under_each_policy_once() {
        let verification = |policy: &str, namespace: &str| api::ImageVerification {
            policy: policy.into(),
            namespace: namespace.into(),
            ..Default::default()
        };
        let image = api::NodeImage {
            verifications: vec![verification("default", ""), verification("namespace", "team")],
            ..Default::default()
        };
        assert_eq!(verified_cell(&image), "default,ns:team");
        assert_eq!(verified_cell(&api::NodeImage::default()), "-");
    }

    #[test]
    fn the_daemons_text_in_every_field_is_shown_never_acted_on_in_every_mode() {
        let answer = api::CheckImagePolicyResponse {
            image: hostile("image"),
            namespace: hostile("namespace"),
            policy: "namespace".into(),
            scope: Some(hostile("scope")),
            requirements: vec![hostile("requirement")],
            refusal: hostile("refusal"),
            verified_by: vec![api::SignatureMatch { key: hostile("key"), signature: hostile("signature") }],
            digest_source: "registry".into(),
            digest: hostile("digest"),
            ..refused()
        };
        for style in every_style() {
            if style.json() {
                let value = assert_json_line(&crate::cli::render::json::line(&check_json(&answer)).expect("JSON"));
                assert_eq!(value["refusal"], hostile("refusal"));
                assert_eq!(value["verifiedBy"][0]["key"], hostile("key"));
                continue;
            }
            let text = rendered(&check_lines(&answer), &style);
            for field in ["image", "namespace", "requirement", "refusal", "key", "signature", "digest"] {
                assert!(text.contains(&shown(field)), "{field} shown whole in {style:?}:\n{text}");
            }
        }
    }
}
