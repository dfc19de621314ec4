//! KEP-2535 record files (`records::format`): any bytes read as an `ImagePullIntent` and as an
//! `ImagePulledRecord`, as the daemon reads the kubelet's files; what reads is written back and
//! read again, checked against pods' secrets and merged with pulls (`records::check`).
#![no_main]

use std::{
    collections::BTreeMap,
    time::{Duration, UNIX_EPOCH},
};

use cri_imaged::records::{
    check::{self, Verdict},
    format::{Intent, PullCredentials, PulledRecord},
};
use libfuzzer_sys::fuzz_target;

/// The most pulls merged into one record per input, to keep each run fast.
const MAX_MERGES: usize = 8;

fuzz_target!(|data: &[u8]| {
    if let Ok(intent) = Intent::decode(data) {
        assert_eq!(Intent::decode(&intent.encode()).as_ref(), Ok(&intent), "an intent reads back as written");
    }
    let Ok(record) = PulledRecord::decode(data) else { return };
    let written = record.encode();
    let reread = PulledRecord::decode(&written).expect("a record reads back as written");
    assert_eq!(reread.encode(), written, "writing is stable");
    assert_eq!(
        (&reread.image_ref, &reread.last_updated_time, &reread.credential_mapping),
        (&record.image_ref, &record.last_updated_time, &record.credential_mapping)
    );

    for (name, recorded) in &record.credential_mapping {
        let nobody = check::check(&record, name, None, &[]);
        if recorded.node_pods_accessible {
            assert_eq!(nobody, Verdict::Allowed { remember: None }, "any pod may use it");
            continue;
        }
        assert_eq!(nobody, Verdict::MustAuthenticate, "no secret, no access");
        if let Some(secret) = recorded.kubernetes_secrets.iter().find(|secret| !secret.credential_hash.is_empty()) {
            let verdict = check::check(&record, name, None, std::slice::from_ref(secret));
            assert!(matches!(verdict, Verdict::Allowed { .. }), "a recorded credential is allowed: {verdict:?}");
        }
        if let Some(account) = recorded.kubernetes_service_accounts.first() {
            let verdict = check::check(&record, name, Some(account), &[]);
            assert!(matches!(verdict, Verdict::Allowed { .. }), "a recorded service account is allowed: {verdict:?}");
        }
    }
    assert_eq!(check::check(&record, "\0not recorded", None, &[]), Verdict::MustAuthenticate);

    // Pulls as the manager records them: anonymous, or with one secret or service account.
    let mut pulls = vec![PullCredentials { node_pods_accessible: true, ..Default::default() }];
    for recorded in record.credential_mapping.values() {
        pulls.extend(
            recorded
                .kubernetes_secrets
                .iter()
                .map(|secret| PullCredentials { kubernetes_secrets: vec![secret.clone()], ..Default::default() }),
        );
        pulls.extend(recorded.kubernetes_service_accounts.iter().map(|account| PullCredentials {
            kubernetes_service_accounts: vec![account.clone()],
            ..Default::default()
        }));
    }
    let names: Vec<&str> = record.credential_mapping.keys().map(String::as_str).chain(["\0new"]).collect();
    let now = UNIX_EPOCH + Duration::from_secs(2_000_000_000);
    for (pull, name) in pulls.iter().rev().zip(names.iter().cycle()).take(MAX_MERGES) {
        let mut merged = record.clone();
        let changed = check::merge(&mut merged, name, pull, now);
        // A change is never lost. (A record may list a secret twice, as a file can: replacing
        // one copy's hash is a change even when another copy had the new hash already.)
        if as_sets(&merged.credential_mapping) != as_sets(&record.credential_mapping) {
            assert!(changed, "merge reports a change whenever the credentials changed ({name:?})");
        }
        assert!(!check::merge(&mut merged, name, pull, now), "merging the same pull again changes nothing");
        PulledRecord::decode(&merged.encode()).expect("a merged record reads back");
    }
});

/// The credentials as sets: their order and repetition mean nothing.
fn as_sets(mapping: &BTreeMap<String, PullCredentials>) -> BTreeMap<&str, (Vec<String>, Vec<String>, bool)> {
    let sorted = |mut items: Vec<String>| {
        items.sort();
        items.dedup();
        items
    };
    mapping
        .iter()
        .map(|(name, credentials)| {
            let secrets = credentials.kubernetes_secrets.iter().map(|secret| format!("{secret:?}")).collect();
            let accounts =
                credentials.kubernetes_service_accounts.iter().map(|account| format!("{account:?}")).collect();
            (name.as_str(), (sorted(secrets), sorted(accounts), credentials.node_pods_accessible))
        })
        .collect()
}
