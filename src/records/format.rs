//! The kubelet's pull record files (`kubelet.config.k8s.io` `ImagePullIntent` and
//! `ImagePulledRecord`): written as v1beta1, read as v1beta1 or v1alpha1, strictly (an unknown
//! field, or a wrong kind or version, is an error), so that records move between the kubelet and
//! cri-imaged.

use std::{
    collections::BTreeMap,
    time::{SystemTime, UNIX_EPOCH},
};

use serde::{Deserialize, Serialize};

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
            last_updated_time: rfc3339(now),
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
        self.last_updated_time = rfc3339(now);
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

/// `now` as Kubernetes writes a `metav1.Time`: `2006-01-02T15:04:05Z`.
pub fn rfc3339(now: SystemTime) -> String {
    let seconds = now.duration_since(UNIX_EPOCH).map_or(0, |since| since.as_secs());
    let (days, second_of_day) = (seconds / 86_400, seconds % 86_400);
    // Howard Hinnant's days-to-civil, for the proleptic Gregorian calendar.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era = (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_index + 2) / 5 + 1;
    let month = if month_index < 10 { month_index + 3 } else { month_index - 9 };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    let (hour, minute, second) = (second_of_day / 3600, second_of_day / 60 % 60, second_of_day % 60);
    format!("{year:04}-{month:02}-{day:02}T{hour:02}:{minute:02}:{second:02}Z")
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

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

    #[test]
    fn times_are_rfc3339_in_utc() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(UNIX_EPOCH + Duration::from_secs(951_782_400)), "2000-02-29T00:00:00Z");
        assert_eq!(
            rfc3339(UNIX_EPOCH + Duration::from_secs(1_729_468_800 + 12 * 3600 + 26 * 60 + 40)),
            "2024-10-21T12:26:40Z"
        );
    }
}
