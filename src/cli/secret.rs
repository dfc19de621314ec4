//! `--secret FILE`: a pull secret from a file, in any of the forms people have at hand. Read
//! bounded; its content never reaches an error or the terminal.

use std::path::Path;

use base64::Engine;

use super::CliError;
use crate::api;

/// A pull secret is a few KiB; nothing past this is read.
const MOST_BYTES: u64 = 1 << 20;

/// Reads `path`: a Kubernetes Secret (YAML or JSON, `data` in base64 or `stringData`) of type
/// kubernetes.io/dockerconfigjson or kubernetes.io/dockercfg, a docker `config.json`
/// (`{"auths": …}`), or a bare `.dockercfg` map.
pub fn read(path: &Path) -> Result<api::PullSecret, CliError> {
    let refuse = |why: &str| CliError::Usage(format!("--secret {}: {why}", path.display()));
    let text = read_bounded(path).map_err(|error| refuse(&error))?;
    let value: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&text).map_err(|_| refuse("neither YAML nor JSON (content not shown)"))?;
    let name = path.file_stem().map(|stem| stem.to_string_lossy().into_owned()).unwrap_or_default();
    if value.get("kind").and_then(|kind| kind.as_str()) == Some("Secret") {
        return from_kubernetes_secret(&value, refuse);
    }
    let json = serde_json::to_string(&value).map_err(|_| refuse("not a JSON object"))?;
    let kind = if value.get("auths").is_some() { "kubernetes.io/dockerconfigjson" } else { "kubernetes.io/dockercfg" };
    Ok(api::PullSecret { name, docker_config_json: json, r#type: kind.to_owned(), ..Default::default() })
}

fn from_kubernetes_secret(
    secret: &serde_yaml_ng::Value,
    refuse: impl Fn(&str) -> CliError,
) -> Result<api::PullSecret, CliError> {
    // A scalar as written: YAML reads an unquoted uid of digits as a number.
    let text = |value: Option<&serde_yaml_ng::Value>| match value {
        Some(serde_yaml_ng::Value::String(text)) => text.clone(),
        Some(serde_yaml_ng::Value::Number(number)) => number.to_string(),
        _ => String::new(),
    };
    let metadata = secret.get("metadata");
    let kind = text(secret.get("type"));
    let key = match kind.as_str() {
        "" | "kubernetes.io/dockerconfigjson" => ".dockerconfigjson",
        "kubernetes.io/dockercfg" => ".dockercfg",
        other => return Err(refuse(&format!("a Secret of type {other} holds no registry credentials"))),
    };
    let content = match (
        secret.get("stringData").and_then(|data| data.get(key)),
        secret.get("data").and_then(|data| data.get(key)),
    ) {
        (Some(plain), _) => text(Some(plain)),
        (None, Some(encoded)) => {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(text(Some(encoded)).trim())
                .map_err(|_| refuse(&format!("data.{key} is not base64")))?;
            String::from_utf8(bytes).map_err(|_| refuse(&format!("data.{key} is not UTF-8")))?
        }
        (None, None) => return Err(refuse(&format!("the Secret has no data.{key}"))),
    };
    Ok(api::PullSecret {
        name: text(metadata.and_then(|metadata| metadata.get("name"))),
        namespace: text(metadata.and_then(|metadata| metadata.get("namespace"))),
        uid: text(metadata.and_then(|metadata| metadata.get("uid"))),
        docker_config_json: content,
        r#type: if kind.is_empty() { "kubernetes.io/dockerconfigjson".to_owned() } else { kind },
    })
}

/// A regular file's text, at most [`MOST_BYTES`]; a FIFO or a device is refused without
/// waiting on it.
fn read_bounded(path: &Path) -> Result<String, String> {
    let bytes = crate::files::read::read_named(path, MOST_BYTES).map_err(|error| format!("cannot read: {error}"))?;
    String::from_utf8(bytes).map_err(|_| "not UTF-8 text".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret_from(text: &str) -> Result<api::PullSecret, CliError> {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("pull-secret.yaml");
        std::fs::write(&path, text).expect("written");
        read(&path)
    }

    #[test]
    fn a_kubernetes_secret_as_kubectl_prints_it_gives_its_decoded_config() {
        let config = r#"{"auths":{"r.example":{"auth":"dTpw"}}}"#;
        let encoded = base64::engine::general_purpose::STANDARD.encode(config);
        let yaml = format!(
            "apiVersion: v1\nkind: Secret\nmetadata:\n  name: regcred\n  namespace: team\n  uid: 1234\ntype: kubernetes.io/dockerconfigjson\ndata:\n  .dockerconfigjson: {encoded}\n"
        );
        let secret = secret_from(&yaml).expect("read");
        assert_eq!((secret.name.as_str(), secret.namespace.as_str(), secret.uid.as_str()), ("regcred", "team", "1234"));
        assert_eq!(secret.docker_config_json, config);
        assert_eq!(secret.r#type, "kubernetes.io/dockerconfigjson");
    }

    #[test]
    fn a_docker_config_json_and_a_dockercfg_are_taken_as_they_are() {
        let config = secret_from(r#"{"auths":{"r.example":{"auth":"dTpw"}}}"#).expect("config.json");
        assert_eq!(config.r#type, "kubernetes.io/dockerconfigjson");
        assert!(config.docker_config_json.contains("r.example"));
        let dockercfg = secret_from(r#"{"r.example":{"auth":"dTpw"}}"#).expect(".dockercfg");
        assert_eq!(dockercfg.r#type, "kubernetes.io/dockercfg");
    }

    #[test]
    fn a_bad_secret_file_is_a_usage_error_that_never_shows_its_content() {
        let error = secret_from("kind: Secret\ntype: Opaque\ndata:\n  password: aHVudGVyMg==\n").expect_err("opaque");
        assert!(error.to_string().contains("type Opaque"), "{error}");
        let error = secret_from("{\"auths\": [hunter2").expect_err("broken");
        assert!(!error.to_string().contains("hunter2"), "{error}");
        assert_eq!(error.exit(), crate::cli::Exit::Usage);
    }

    #[test]
    fn a_fifo_is_refused_at_once_instead_of_waited_on() {
        let dir = tempfile::tempdir().expect("temp dir");
        let fifo = dir.path().join("secret.yaml");
        rustix::fs::mkfifoat(rustix::fs::CWD, &fifo, rustix::fs::Mode::from_raw_mode(0o600)).expect("mkfifo");
        let error = read(&fifo).expect_err("a FIFO");
        assert!(error.to_string().contains("not a regular file"), "{error}");
    }
}
