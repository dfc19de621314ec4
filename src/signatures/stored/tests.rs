use std::os::unix::fs::PermissionsExt;

use super::*;
use crate::{policy::SigstoreSigned, shutdown};

fn requirement(key: &str) -> Vec<Arc<SigstoreSigned>> {
    let text = format!(r#"{{"keyData": "{key}"}}"#);
    vec![Arc::new(serde_json::from_str(&text).expect("a requirement"))]
}

fn digest(n: usize) -> String {
    format!("sha256:{n:064x}")
}

fn verified(digest: &str) -> Verified {
    Verified { digest: digest.into(), by: vec![("3f9a61c0d2b7e845".into(), format!("sha256:{:064x}", 0x5e))] }
}

fn under(namespace: Option<&str>) -> Under {
    let policy = namespace.map_or(PolicySource::Default, |namespace| PolicySource::Namespace(namespace.into()));
    Under { policy, scope: Some("r.example/team".into()) }
}

/// A daemon's signature checks, keeping what they verify under `root`.
fn signatures(root: &Path, quarantined: &Counter) -> Arc<Signatures> {
    let file = VerifiedFile::at(root, quarantined.clone());
    Arc::new(Signatures::new(Default::default(), Arc::default()).kept_in(file))
}

/// Runs the writer as a daemon that stops at once: it reads back what was kept and writes what
/// was added before.
async fn keep(signatures: &Arc<Signatures>) {
    let (trigger, shutdown) = shutdown::channel();
    trigger.request();
    signatures.clone().keep(shutdown).await;
}

fn put(signatures: &Signatures, digest: &str, key: &str, namespace: Option<&str>) {
    signatures.cache.put(digest, &requirement(key), (under(namespace), verified(digest)));
}

#[tokio::test]
async fn a_verification_kept_on_disk_is_answered_after_a_restart_only_under_the_requirement_it_met() {
    let root = tempfile::tempdir().expect("tempdir");
    let quarantined = Counter::default();
    let before = signatures(root.path(), &quarantined);
    keep(&before).await;
    put(&before, &digest(1), "one", None);
    put(&before, &digest(1), "two", Some("team"));
    put(&before, &digest(2), "one", None);
    keep(&before).await;
    let file = VerifiedFile::at(root.path(), Counter::default()).path();
    assert_eq!(std::fs::metadata(&file).expect("written").permissions().mode() & 0o777, 0o600);

    let after = signatures(root.path(), &quarantined);
    assert_eq!(after.cached(&digest(1), &requirement("one")), None, "nothing before it is read back");
    keep(&after).await;
    assert_eq!(after.cached(&digest(1), &requirement("one")), Some(verified(&digest(1))));
    assert_eq!(after.cached(&digest(1), &requirement("two")), Some(verified(&digest(1))));
    assert_eq!(after.cached(&digest(2), &requirement("one")), Some(verified(&digest(2))));
    // A requirement changed since (another key): what the old one covered does not count.
    assert_eq!(after.cached(&digest(1), &requirement("three")), None);
    assert_eq!(after.cached(&digest(3), &requirement("one")), None);
    let listed: Vec<Under> = after.verified_under(&digest(1)).into_iter().map(|(under, _)| under).collect();
    assert_eq!(listed, [under(None), under(Some("team"))], "the VERIFIED column's policies too");
    assert_eq!(after.cache.stored(), before.cache.stored(), "the same entries, in the same order");
    assert_eq!(quarantined.get(), 0);
    let text = std::fs::read_to_string(&file).expect("readable");
    assert!(!text.contains("\"one\"") && !text.contains("keyData"), "no key material: {text}");
}

/// A keyless verification (a Fulcio certificate) is kept by whom the certificate names.
#[test]
fn a_certificates_verification_round_trips() {
    let signer = r#"certificate for "dev@example.com" (OIDC issuer "https://issuer.example")"#;
    let signature = format!("sha256:{:064x}", 0x5e);
    let verified = Verified { digest: digest(1), by: vec![(signer.into(), signature)] };
    let stored = vec![Stored { requirement: format!("{:064x}", 1), under: under(None), verified }];
    assert_eq!(decode(&encode(&stored)).expect("decodes"), stored);
}

#[test]
fn entries_round_trip_and_only_the_newest_that_fit_are_written() {
    let cache = super::super::cache::VerifiedCache::default();
    for n in 0..KEPT + 10 {
        cache.put(&digest(n), &requirement("one"), (under(Some("team")), verified(&digest(n))));
    }
    let stored = cache.stored();
    assert_eq!(stored.len(), KEPT, "the cache's own bound");
    assert_eq!(stored[0].verified.digest, digest(10), "oldest first");
    let bytes = encode(&stored);
    assert_eq!(decode(&bytes).expect("decodes"), stored);
    assert!((bytes.len() as u64) < FILE_LIMIT, "{} bytes", bytes.len());
    // One too large to write (a scope of 4 KiB) stays in memory only.
    let mut large = stored[..2].to_vec();
    large[0].under.scope = Some("r.example/".repeat(400));
    assert_eq!(decode(&encode(&large)).expect("decodes"), large[1..]);
}

/// A file of `entries` with their checksum, as this daemon would write them.
fn file_of(entries: Vec<Entry>) -> Vec<u8> {
    let sha256 = checksum(&entries);
    serde_json::to_vec(&File { kind: KIND.into(), version: VERSION, entries, sha256 }).expect("json")
}

fn entry(n: usize) -> Entry {
    Entry::from(&Stored { requirement: format!("{n:064x}"), under: under(None), verified: verified(&digest(n)) })
}

/// Whether a refusal is the one expected.
type Expected = fn(&FormatError) -> bool;

#[test]
fn anything_not_whole_as_this_daemon_writes_it_is_refused_whole() {
    let good =
        encode(&[Stored { requirement: format!("{:064x}", 1), under: under(None), verified: verified(&digest(1)) }]);
    assert_eq!(decode(&good).expect("decodes").len(), 1);
    let text = String::from_utf8(good.clone()).expect("utf-8");
    let edited = |from: &str, to: &str| text.replacen(from, to, 1).into_bytes();
    let with = |change: fn(&mut Entry)| {
        let mut one = entry(1);
        change(&mut one);
        file_of(vec![one])
    };
    let cases: Vec<(&str, Vec<u8>, Expected)> = vec![
        ("torn", good[..good.len() / 2].to_vec(), |e| matches!(e, FormatError::Decode(_))),
        ("empty", Vec::new(), |e| matches!(e, FormatError::Decode(_))),
        ("unknown field", edited("\"version\"", "\"extra\":1,\"version\""), |e| matches!(e, FormatError::Decode(_))),
        ("another kind", edited(KIND, "PulledRecords"), |e| *e == FormatError::Kind),
        // One digit of a digest changed: it still parses, and is not what was written.
        ("edited", edited(&digest(1), &digest(2)), |e| *e == FormatError::Checksum),
        ("no checksum", edited("\"sha256\":\"", "\"sha256\":\"0"), |e| *e == FormatError::Checksum),
        ("a short digest", with(|e| e.digest = "sha256:abc".into()), |e| matches!(e, FormatError::Entry { .. })),
        ("upper case", with(|e| e.requirement = "AB".repeat(32)), |e| matches!(e, FormatError::Entry { .. })),
        ("no namespace", with(|e| e.policy = Policy::Namespace), |e| matches!(e, FormatError::Entry { .. })),
        (
            "a namespace that is none",
            with(|e| (e.policy, e.namespace) = (Policy::Namespace, Some("Team/..".into()))),
            |e| matches!(e, FormatError::Entry { .. }),
        ),
        ("no key", with(|e| e.by.clear()), |e| matches!(e, FormatError::Entry { .. })),
        ("a control character", with(|e| e.scope = Some("r\u{1b}[2J".into())), |e| {
            matches!(e, FormatError::Entry { .. })
        }),
        ("twice", file_of(vec![entry(1), entry(1)]), |e| {
            *e == FormatError::Entry { index: 1, why: "a digest and requirement already listed" }
        }),
        ("too many", file_of((0..=KEPT).map(entry).collect()), |e| *e == FormatError::TooMany(KEPT + 1)),
    ];
    for (name, bytes, expected) in cases {
        let refused = decode(&bytes).expect_err(name);
        assert!(expected(&refused), "{name}: {refused}");
    }
}

/// Puts something at the file's path.
type Plant<'a> = dyn Fn(&Path) + 'a;

#[tokio::test]
async fn a_hostile_or_torn_file_is_set_aside_once_grants_nothing_and_the_next_write_replaces_it() {
    let root = tempfile::tempdir().expect("tempdir");
    let quarantined = Counter::default();
    let daemon = signatures(root.path(), &quarantined);
    put(&daemon, &digest(1), "one", None);
    keep(&daemon).await;
    let path = VerifiedFile::at(root.path(), Counter::default()).path();
    let good = std::fs::read(&path).expect("written");
    let edited = String::from_utf8(good.clone()).expect("utf-8").replacen(&digest(1), &digest(2), 1);
    let fifo = |path: &Path| {
        let made = std::process::Command::new("mkfifo").arg(path).status().expect("mkfifo runs");
        assert!(made.success());
    };
    let plant: [(&str, &Plant<'_>); 6] = [
        ("torn", &|path| std::fs::write(path, &good[..good.len() - 9]).expect("written")),
        ("edited", &|path| std::fs::write(path, &edited).expect("written")),
        ("a FIFO", &fifo),
        ("a directory", &|path| std::fs::create_dir(path).expect("created")),
        ("a link", &|path| std::os::unix::fs::symlink(std::env::temp_dir(), path).expect("linked")),
        ("too large", &|path| std::fs::write(path, vec![b' '; FILE_LIMIT as usize + 1]).expect("written")),
    ];
    for (set_aside, (name, plant)) in plant.into_iter().enumerate() {
        std::fs::remove_file(&path).expect("the last file written");
        plant(&path);
        let restarted = signatures(root.path(), &quarantined);
        keep(&restarted).await;
        assert_eq!(restarted.cached(&digest(1), &requirement("one")), None, "{name}: grants nothing");
        assert_eq!(restarted.cached(&digest(2), &requirement("one")), None, "{name}: grants nothing");
        assert!(restarted.verified_under(&digest(2)).is_empty(), "{name}");
        assert_eq!(quarantined.get(), set_aside as u64 + 1, "{name}: set aside and counted");
        assert!(std::fs::symlink_metadata(&path).is_err(), "{name}: moved aside, never read again");
        // Start goes on: the next verification is written to a file of its own.
        put(&restarted, &digest(1), "one", None);
        keep(&restarted).await;
        assert_eq!(std::fs::read(&path).expect("written again"), good, "{name}");
    }
}

#[tokio::test]
async fn a_root_dir_that_cannot_be_opened_keeps_verifications_in_memory() {
    let root = tempfile::tempdir().expect("tempdir");
    let file = root.path().join("a-file");
    std::fs::write(&file, b"").expect("written");
    let daemon = signatures(&file, &Counter::default());
    keep(&daemon).await;
    put(&daemon, &digest(1), "one", None);
    assert_eq!(daemon.cached(&digest(1), &requirement("one")), Some(verified(&digest(1))));
}
