//! The decisions over pull records (pure): may a pod use a present image its records name, and
//! how a pull's credentials are merged into a record. The kubelet's rules, step by step.

use std::time::SystemTime;

use super::format::{PullCredentials, PulledRecord, SecretRecord, ServiceAccountRecord};

/// Past this many secrets recorded for an image name, no more are written back on a check (the
/// kubelet's bound against unbounded writes under namespace churn).
pub const WRITE_BACK_LIMIT: usize = 100;

/// What a record says of a pod's access to a present image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The pod may use the image; `remember` is its secret, to be merged into the record (a new
    /// secret holding a recorded credential, or a recorded secret holding a rotated one).
    Allowed { remember: Option<SecretRecord> },
    /// The pod must pull the image with its own credentials.
    MustAuthenticate,
}

/// Checks `record` for image `name` (without tag or digest) against the pod's service account
/// (the one a plugin was given the token of for this image, if any) and then the pod's secrets
/// that apply to it (each with the kubelet's hash of its credential).
pub fn check(
    record: &PulledRecord,
    name: &str,
    pod_account: Option<&ServiceAccountRecord>,
    pod_secrets: &[SecretRecord],
) -> Verdict {
    let Some(recorded) = record.credential_mapping.get(name) else { return Verdict::MustAuthenticate };
    if recorded.node_pods_accessible {
        return Verdict::Allowed { remember: None };
    }
    if pod_account.is_some_and(|account| recorded.kubernetes_service_accounts.contains(account)) {
        return Verdict::Allowed { remember: None };
    }
    let secrets = &recorded.kubernetes_secrets;
    for pod in pod_secrets {
        for cached in secrets {
            let hashes_match = !cached.credential_hash.is_empty() && pod.credential_hash == cached.credential_hash;
            let same_secret = pod.uid == cached.uid && pod.namespace == cached.namespace && pod.name == cached.name;
            if hashes_match {
                let remember = (!same_secret && secrets.len() < WRITE_BACK_LIMIT).then(|| pod.clone());
                return Verdict::Allowed { remember };
            }
            // The same secret with a rotated credential: the kubelet trusts it (the secret's
            // owner rotated it), and records the new hash.
            if same_secret && secrets.len() < WRITE_BACK_LIMIT {
                return Verdict::Allowed { remember: Some(pod.clone()) };
            }
        }
    }
    Verdict::MustAuthenticate
}

/// Merges the credentials a pull used for `name` into `record`; returns whether it changed (and
/// so must be written), updating its time when it did.
pub fn merge(record: &mut PulledRecord, name: &str, pulled_with: &PullCredentials, now: SystemTime) -> bool {
    let nothing = pulled_with.kubernetes_secrets.is_empty()
        && pulled_with.kubernetes_service_accounts.is_empty()
        && !pulled_with.node_pods_accessible;
    if nothing {
        return false;
    }
    let changed = match record.credential_mapping.get_mut(name) {
        None => {
            record.credential_mapping.insert(name.to_owned(), pulled_with.clone());
            true
        }
        // Anyone may use it: nothing can widen that.
        Some(recorded) if recorded.node_pods_accessible => false,
        Some(recorded) if pulled_with.node_pods_accessible => {
            *recorded = PullCredentials { node_pods_accessible: true, ..Default::default() };
            true
        }
        Some(recorded) if !pulled_with.kubernetes_secrets.is_empty() => {
            merge_secrets(&mut recorded.kubernetes_secrets, &pulled_with.kubernetes_secrets)
        }
        Some(recorded) => {
            let accounts = &mut recorded.kubernetes_service_accounts;
            // By content, not count: a file may list an account twice, which the dedup drops.
            let added = pulled_with.kubernetes_service_accounts.iter().any(|account| !accounts.contains(account));
            accounts.extend(pulled_with.kubernetes_service_accounts.iter().cloned());
            accounts.sort_by(|a, b| (&a.namespace, &a.name, &a.uid).cmp(&(&b.namespace, &b.name, &b.uid)));
            accounts.dedup();
            added
        }
    };
    if changed {
        record.touch(now);
    }
    changed
}

/// Adds each new secret, or replaces a recorded secret's hash; sorted by namespace, name, uid.
fn merge_secrets(recorded: &mut Vec<SecretRecord>, new: &[SecretRecord]) -> bool {
    let mut changed = false;
    for secret in new {
        let same = |cached: &&mut SecretRecord| {
            cached.uid == secret.uid && cached.namespace == secret.namespace && cached.name == secret.name
        };
        match recorded.iter_mut().find(same) {
            Some(cached) if cached.credential_hash == secret.credential_hash => {}
            Some(cached) => {
                cached.credential_hash.clone_from(&secret.credential_hash);
                changed = true;
            }
            None => {
                recorded.push(secret.clone());
                changed = true;
            }
        }
    }
    recorded.sort_by(|a, b| (&a.namespace, &a.name, &a.uid).cmp(&(&b.namespace, &b.name, &b.uid)));
    changed
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;
    use crate::records::format::ServiceAccountRecord;

    const NAME: &str = "registry.local/team/app";

    fn secret(name: &str, hash: &str) -> SecretRecord {
        SecretRecord {
            uid: format!("uid-{name}"),
            namespace: "default".into(),
            name: name.into(),
            credential_hash: hash.into(),
        }
    }

    fn record_with(credentials: PullCredentials) -> PulledRecord {
        let mut record = PulledRecord::new("sha256:app", UNIX_EPOCH);
        record.credential_mapping.insert(NAME.into(), credentials);
        record
    }

    fn secrets(secrets: Vec<SecretRecord>) -> PullCredentials {
        PullCredentials { kubernetes_secrets: secrets, ..Default::default() }
    }

    #[test]
    fn an_image_pulled_without_pod_credentials_is_for_every_pod() {
        let record = record_with(PullCredentials { node_pods_accessible: true, ..Default::default() });
        assert_eq!(check(&record, NAME, None, &[]), Verdict::Allowed { remember: None });
    }

    #[test]
    fn a_pod_needs_a_secret_holding_a_recorded_credential() {
        let record = record_with(secrets(vec![secret("a", "hash-1")]));
        assert_eq!(check(&record, NAME, None, &[]), Verdict::MustAuthenticate, "no secret");
        assert_eq!(
            check(&record, NAME, None, &[secret("b", "hash-2")]),
            Verdict::MustAuthenticate,
            "another credential"
        );
        assert_eq!(
            check(&record, NAME, None, &[secret("a", "hash-1")]),
            Verdict::Allowed { remember: None },
            "the same secret"
        );
        assert_eq!(
            check(&record, NAME, None, &[secret("b", "hash-2"), secret("c", "hash-1")]),
            Verdict::Allowed { remember: Some(secret("c", "hash-1")) },
            "another secret holding the same credential is allowed and remembered"
        );
        assert_eq!(
            check(&record, "registry.local/other", None, &[secret("a", "hash-1")]),
            Verdict::MustAuthenticate,
            "another name"
        );
    }

    #[test]
    fn a_recorded_secret_whose_credential_was_rotated_is_trusted_and_its_hash_updated() {
        let record = record_with(secrets(vec![secret("a", "old-hash")]));
        assert_eq!(
            check(&record, NAME, None, &[secret("a", "new-hash")]),
            Verdict::Allowed { remember: Some(secret("a", "new-hash")) }
        );
    }

    #[test]
    fn records_without_credentials_or_with_empty_hashes_allow_no_one() {
        let empty = PulledRecord::new("sha256:app", UNIX_EPOCH);
        assert_eq!(check(&empty, NAME, None, &[secret("a", "hash-1")]), Verdict::MustAuthenticate);
        let no_hash = record_with(secrets(vec![secret("a", "")]));
        assert_eq!(check(&no_hash, NAME, None, &[secret("b", "")]), Verdict::MustAuthenticate);
    }

    #[test]
    fn past_the_write_back_limit_a_matching_hash_is_allowed_unrecorded_and_a_rotation_refused() {
        let many = (0..WRITE_BACK_LIMIT).map(|index| secret(&format!("s{index}"), "hash-1")).collect();
        let record = record_with(secrets(many));
        assert_eq!(check(&record, NAME, None, &[secret("new", "hash-1")]), Verdict::Allowed { remember: None });
        assert_eq!(check(&record, NAME, None, &[secret("s7", "rotated")]), Verdict::MustAuthenticate);
    }

    #[test]
    fn merging_adds_replaces_and_widens_and_reports_a_change_only_when_there_is_one() {
        let later = UNIX_EPOCH + Duration::from_secs(60);
        let mut record = PulledRecord::new("sha256:app", UNIX_EPOCH);
        assert!(!merge(&mut record, NAME, &PullCredentials::default(), later), "nothing to merge");
        assert!(merge(&mut record, NAME, &secrets(vec![secret("b", "h")]), later));
        assert_eq!(record.last_updated_time, "1970-01-01T00:01:00Z");
        assert!(!merge(&mut record, NAME, &secrets(vec![secret("b", "h")]), later), "already there");
        assert!(merge(&mut record, NAME, &secrets(vec![secret("a", "h")]), later));
        assert!(merge(&mut record, NAME, &secrets(vec![secret("b", "h2")]), later), "rotated");
        let names: Vec<(&str, &str)> = record.credential_mapping[NAME]
            .kubernetes_secrets
            .iter()
            .map(|secret| (secret.name.as_str(), secret.credential_hash.as_str()))
            .collect();
        assert_eq!(names, [("a", "h"), ("b", "h2")], "sorted, the hash replaced");
        let anyone = PullCredentials { node_pods_accessible: true, ..Default::default() };
        assert!(merge(&mut record, NAME, &anyone, later));
        assert_eq!(record.credential_mapping[NAME], anyone, "node access replaces the secrets");
        assert!(!merge(&mut record, NAME, &secrets(vec![secret("c", "h")]), later), "and cannot be narrowed");
    }

    #[test]
    fn a_pod_whose_service_account_is_recorded_may_use_the_image_another_must_pull() {
        let account = |name: &str, uid: &str| ServiceAccountRecord {
            uid: uid.into(),
            namespace: "default".into(),
            name: name.into(),
        };
        let record = record_with(PullCredentials {
            kubernetes_service_accounts: vec![account("builder", "uid-1")],
            ..Default::default()
        });
        let allowed = Verdict::Allowed { remember: None };
        assert_eq!(check(&record, NAME, Some(&account("builder", "uid-1")), &[]), allowed);
        assert_eq!(check(&record, NAME, Some(&account("other", "uid-2")), &[]), Verdict::MustAuthenticate);
        assert_eq!(
            check(&record, NAME, Some(&account("builder", "uid-9")), &[]),
            Verdict::MustAuthenticate,
            "a recreated account is another account"
        );
        assert_eq!(check(&record, NAME, None, &[secret("a", "hash-1")]), Verdict::MustAuthenticate, "no account");
    }

    /// Found by the `records` fuzz target: a file listing an account twice hid the new one.
    #[test]
    fn merging_a_new_service_account_into_a_list_with_a_repeat_reports_the_change() {
        let account = |name: &str| ServiceAccountRecord { uid: "u".into(), namespace: "n".into(), name: name.into() };
        let accounts = |list: Vec<ServiceAccountRecord>| PullCredentials {
            kubernetes_service_accounts: list,
            ..Default::default()
        };
        let later = UNIX_EPOCH + Duration::from_secs(60);
        let mut record = record_with(accounts(vec![account("a"), account("a")]));
        assert!(merge(&mut record, NAME, &accounts(vec![account("b")]), later), "b is new");
        assert_eq!(record.credential_mapping[NAME], accounts(vec![account("a"), account("b")]));
        assert!(!merge(&mut record, NAME, &accounts(vec![account("a")]), later), "a was there");
    }
}
