//! The kubelet's pull record files (`kubelet.config.k8s.io` `ImagePullIntent` and
//! `ImagePulledRecord`): written as v1beta1, read as v1beta1 or v1alpha1, strictly (an unknown
//! field, or a wrong kind or version, is an error), so that records move between the kubelet and
//! cri-imaged.

use std::{collections::BTreeMap, time::SystemTime};

use serde::{Deserialize, Serialize};

use crate::duration;

const GROUP_VERSION_WRITTEN: &str = "kubelet.config.k8s.io/v1beta1";
const GROUP_VERSIONS_READ: [&str; 2] = ["kubelet.config.k8s.io/v1beta1", "kubelet.config.k8s.io/v1alpha1"];
const INTENT_KIND: &str = "ImagePullIntent";
const PULLED_KIND: &str = "ImagePulledRecord";

/// A pull about to start, for the image as the pod wrote it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Intent {
    kind: String,
    api_version: String,
    pub image: String,
}

/// Which credentials pulled an image, by image name (without tag or digest).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PulledRecord {
    kind: String,
    api_version: String,
    /// RFC 3339, UTC, whole seconds.
    pub last_updated_time: String,
    pub image_ref: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub credential_mapping: BTreeMap<String, PullCredentials>,
}

/// The credentials one image name was pulled with.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PullCredentials {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kubernetes_secrets: Vec<SecretRecord>,
    /// The service accounts whose tokens a credential-provider plugin was given (KEP-4412).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kubernetes_service_accounts: Vec<ServiceAccountRecord>,
    /// Pulled without credentials or with the node's own: any pod on the node may use it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub node_pods_accessible: bool,
}

/// A pull secret that pulled an image, and the hash of the credential it held.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SecretRecord {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    pub credential_hash: String,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ServiceAccountRecord {
    pub uid: String,
    pub namespace: String,
    pub name: String,
}

/// Why a record file cannot be read. Names no value from the file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    #[error("does not decode: {0}")]
    Decode(String),
    #[error("is a {kind:?} of {api_version:?}, not a {expected} of kubelet.config.k8s.io/v1beta1 or v1alpha1")]
    Kind { kind: String, api_version: String, expected: &'static str },
}

impl Intent {
    pub fn new(image: &str) -> Self {
        Self { kind: INTENT_KIND.into(), api_version: GROUP_VERSION_WRITTEN.into(), image: image.into() }
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, FormatError> {
        let intent: Self = decode(bytes)?;
        check_kind(&intent.kind, &intent.api_version, INTENT_KIND)?;
        Ok(intent)
    }

    pub fn encode(&self) -> Vec<u8> {
        encode(self)
    }
}

impl PulledRecord {
    /// A record of `image_ref` with no credentials yet, updated `now`.
    pub fn new(image_ref: &str, now: SystemTime) -> Self {
        Self {
            kind: PULLED_KIND.into(),
            api_version: GROUP_VERSION_WRITTEN.into(),
            last_updated_time: duration::rfc3339(now),
            image_ref: image_ref.into(),
            credential_mapping: BTreeMap::new(),
        }
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, FormatError> {
        let record: Self = decode(bytes)?;
        check_kind(&record.kind, &record.api_version, PULLED_KIND)?;
        Ok(record)
    }

    /// The record as written: always the newest version, whichever was read.
    pub fn encode(&self) -> Vec<u8> {
        encode(&Self { api_version: GROUP_VERSION_WRITTEN.into(), ..self.clone() })
    }

    pub fn touch(&mut self, now: SystemTime) {
        self.last_updated_time = duration::rfc3339(now);
    }
}

fn decode<T: for<'de> Deserialize<'de>>(bytes: &[u8]) -> Result<T, FormatError> {
    // serde's messages may quote a value; a record holds no secret, so they may stand.
    serde_json::from_slice(bytes).map_err(|error| FormatError::Decode(error.to_string()))
}

fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    let mut bytes = serde_json::to_vec(value).unwrap_or_default();
    bytes.push(b'\n');
    bytes
}

fn check_kind(kind: &str, api_version: &str, expected: &'static str) -> Result<(), FormatError> {
    if kind == expected && GROUP_VERSIONS_READ.contains(&api_version) {
        return Ok(());
    }
    Err(FormatError::Kind { kind: kind.into(), api_version: api_version.into(), expected })
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;

    #[test]
    fn records_are_written_as_the_kubelet_writes_them() {
        let intent = Intent::new("registry.example.com/team/app:1.0");
        assert_eq!(
            intent.encode(),
            b"{\"kind\":\"ImagePullIntent\",\"apiVersion\":\"kubelet.config.k8s.io/v1beta1\",\"image\":\"registry.example.com/team/app:1.0\"}\n"
        );
        let at = UNIX_EPOCH + Duration::from_secs(1_762_164_000);
        let mut record = PulledRecord::new("sha256:4c2f", at);
        assert_eq!(
            String::from_utf8(record.encode()).unwrap(),
            "{\"kind\":\"ImagePulledRecord\",\"apiVersion\":\"kubelet.config.k8s.io/v1beta1\",\"lastUpdatedTime\":\"2025-11-03T10:00:00Z\",\"imageRef\":\"sha256:4c2f\"}\n"
        );
        let secret = SecretRecord {
            uid: "6f1c".into(),
            namespace: "default".into(),
            name: "pull-secret".into(),
            credential_hash: "a554".into(),
        };
        record.credential_mapping.insert(
            "registry.example.com/team/app".into(),
            PullCredentials { kubernetes_secrets: vec![secret], ..Default::default() },
        );
        record.credential_mapping.insert(
            "docker.io/testing/test".into(),
            PullCredentials { node_pods_accessible: true, ..Default::default() },
        );
        assert_eq!(
            String::from_utf8(record.encode()).unwrap(),
            "{\"kind\":\"ImagePulledRecord\",\"apiVersion\":\"kubelet.config.k8s.io/v1beta1\",\"lastUpdatedTime\":\"2025-11-03T10:00:00Z\",\"imageRef\":\"sha256:4c2f\",\"credentialMapping\":{\"docker.io/testing/test\":{\"nodePodsAccessible\":true},\"registry.example.com/team/app\":{\"kubernetesSecrets\":[{\"uid\":\"6f1c\",\"namespace\":\"default\",\"name\":\"pull-secret\",\"credentialHash\":\"a554\"}]}}}\n"
        );
        assert_eq!(PulledRecord::decode(&record.encode()), Ok(record));
    }

    #[test]
    fn both_versions_are_read_and_the_newest_is_written_back() {
        let old = br#"{"kind":"ImagePulledRecord","apiVersion":"kubelet.config.k8s.io/v1alpha1","lastUpdatedTime":"2024-10-21T12:26:40Z","imageRef":"testimageref","credentialMapping":{"docker.io/testing/test":{"kubernetesServiceAccounts":[{"uid":"u","namespace":"n","name":"sa"}]}}}"#;
        let record = PulledRecord::decode(old).expect("v1alpha1 reads");
        assert_eq!(record.credential_mapping["docker.io/testing/test"].kubernetes_service_accounts.len(), 1);
        assert!(
            String::from_utf8(record.encode()).unwrap().contains("\"apiVersion\":\"kubelet.config.k8s.io/v1beta1\"")
        );
        let intent = br#"{"kind":"ImagePullIntent","apiVersion":"kubelet.config.k8s.io/v1alpha1","image":"repo.repo/test/test:v1"}"#;
        assert_eq!(Intent::decode(intent).expect("reads").image, "repo.repo/test/test:v1");
    }

    #[test]
    fn anything_else_is_refused() {
        let cases: [&[u8]; 6] = [
            br#"{"kind":"ImagePulledRecord","apiVersion":"kubelet.config.k8s.io/v1beta1","lastUpdatedTime":"x","imageRef":"r","kubernetesSecretCoordinates":[]}"#,
            br#"{"kind":"ImagePullIntent","apiVersion":"kubelet.config.k8s.io/v1beta1","image":"i"}"#,
            br#"{"kind":"ImagePulledRecord","apiVersion":"kubelet.config.k8s.io/v2","lastUpdatedTime":"x","imageRef":"r"}"#,
            br#"{"apiVersion":"kubelet.config.k8s.io/v1beta1","lastUpdatedTime":"x","imageRef":"r"}"#,
            br#"{"kind":"ImagePulledRecord","apiVersion":"kubelet.config.k8s.io/v1beta1","lastUpdatedTime":"x","imageRef":"r""#,
            b"",
        ];
        for bytes in cases {
            assert!(PulledRecord::decode(bytes).is_err(), "{}", String::from_utf8_lossy(bytes));
        }
    }
}
