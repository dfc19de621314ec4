//! cosign, the oracle of the signature tests: keys made by the test, images signed and verified
//! offline against the loopback registry.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use super::process::in_ci;

const COSIGN: &str = "/opt/cri-imaged-test/cosign-trixie/usr/bin/cosign";

/// cosign, as install-deps extracts it; outside CI a missing one skips the test.
pub fn cosign() -> Option<PathBuf> {
    let path = std::env::var_os("COSIGN_BIN").map_or_else(|| PathBuf::from(COSIGN), PathBuf::from);
    if path.is_file() {
        return Some(path);
    }
    assert!(!in_ci(), "cosign is not at {}; CI must install it (scripts/install-deps.sh)", path.display());
    eprintln!("SKIPPED: cosign is not installed (outside CI; `make deps` installs it)");
    None
}

/// Runs cosign with an empty key password; its success and what it printed.
pub fn run_cosign(cosign: &Path, dir: &Path, args: &[&str]) -> (bool, String) {
    run_cosign_with(cosign, dir, args, &[])
}

/// [`run_cosign`], with more of the environment (`SIGSTORE_REKOR_PUBLIC_KEY`: a test Rekor).
pub fn run_cosign_with(cosign: &Path, dir: &Path, args: &[&str], env: &[(&str, &str)]) -> (bool, String) {
    let output = Command::new(cosign)
        .args(args)
        .envs(env.iter().copied())
        .current_dir(dir)
        .env("COSIGN_PASSWORD", "")
        // No TUF root or transparency log is reached: everything stays on loopback.
        .env("SIGSTORE_NO_CACHE", "1")
        .env("HOME", dir)
        .output()
        .expect("cosign runs");
    let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    (output.status.success(), text)
}

/// A key pair in `dir` (`cosign.key`, `cosign.pub`).
pub fn key_pair(cosign: &Path, dir: &Path) -> PathBuf {
    std::fs::create_dir_all(dir).expect("key dir");
    let (made, text) = run_cosign(cosign, dir, &["generate-key-pair"]);
    assert!(made, "cosign generate-key-pair: {text}");
    dir.to_owned()
}

pub fn sign(cosign: &Path, keys: &Path, image_at_digest: &str) {
    let key = keys.join("cosign.key");
    let args = ["sign", "--key", key.to_str().expect("utf-8"), "--tlog-upload=false", "--allow-http-registry", "-y"];
    let (signed, text) = run_cosign(cosign, keys, &[&args[..], &[image_at_digest]].concat());
    assert!(signed, "cosign sign {image_at_digest}: {text}");
}

/// Signs with `keys`' key and `certificate` (of that key) with `chain`, as `cosign sign
/// --certificate --certificate-chain` signs with a Fulcio certificate; no transparency log is
/// reached, so the signature carries no Rekor bundle.
pub fn sign_with_certificate(cosign: &Path, keys: &Path, (certificate, chain): (&Path, &Path), image_at_digest: &str) {
    let key = keys.join("cosign.key");
    let text = |path: &Path| path.to_str().expect("utf-8").to_owned();
    let (key, certificate, chain) = (text(&key), text(certificate), text(chain));
    let args = ["sign", "--key", &key, "--certificate", &certificate, "--certificate-chain", &chain];
    let args = [&args[..], &["--tlog-upload=false", "--allow-http-registry", "-y", image_at_digest]].concat();
    let (signed, text) = run_cosign(cosign, keys, &args);
    assert!(signed, "cosign sign --certificate {image_at_digest}: {text}");
}

/// Signs as an OCI 1.1 referrer of the image (`--registry-referrers-mode=oci-1-1`): against a
/// registry without the referrers API, cosign keeps the index at the fallback tag `sha256-<hex>`.
pub fn sign_as_referrer(cosign: &Path, keys: &Path, image_at_digest: &str) {
    let key = keys.join("cosign.key");
    let key = key.to_str().expect("utf-8");
    let mode = "--registry-referrers-mode=oci-1-1";
    let args = ["sign", "--key", key, "--tlog-upload=false", "--allow-http-registry", "-y", mode, image_at_digest];
    let (signed, text) = run_cosign_with(cosign, keys, &args, &[("COSIGN_EXPERIMENTAL", "1")]);
    assert!(signed, "cosign sign (referrer) {image_at_digest}: {text}");
}

/// cosign's verdict on `image` whose signatures are OCI 1.1 referrers (`--experimental-oci11`).
pub fn cosign_accepts_referrer(cosign: &Path, keys: &Path, image: &str) -> bool {
    let key = keys.join("cosign.pub");
    let key = key.to_str().expect("utf-8");
    let args =
        ["verify", "--key", key, "--insecure-ignore-tlog", "--allow-http-registry", "--experimental-oci11", image];
    run_cosign(cosign, keys, &args).0
}

/// cosign's own verdict on `image` with `keys`' public key, the transparency log not asked.
pub fn cosign_accepts(cosign: &Path, keys: &Path, image: &str) -> bool {
    let key = keys.join("cosign.pub");
    let args =
        ["verify", "--key", key.to_str().expect("utf-8"), "--insecure-ignore-tlog", "--allow-http-registry", image];
    run_cosign(cosign, keys, &args).0
}

/// The predicate type of a cosign signature as a Sigstore bundle (cosign 3's `cosign sign`).
pub const SIGN_V1: &str = "https://sigstore.dev/cosign/sign/v1";

/// Signs as cosign 3's `cosign sign` does, a Sigstore bundle (v0.3) attached as an OCI 1.1
/// referrer: cosign 2.5 makes that same bundle by attesting [`SIGN_V1`] with an empty predicate.
pub fn sign_as_bundle(cosign: &Path, keys: &Path, image_at_digest: &str) {
    attest_as_bundle(cosign, keys, image_at_digest, SIGN_V1, "{}");
}

/// Attests `predicate` (JSON) of `predicate_type` as a Sigstore bundle referrer of the image (an
/// in-toto statement in a DSSE envelope); against a registry without the referrers API, cosign
/// keeps the index at the fallback tag `sha256-<hex>`.
pub fn attest_as_bundle(cosign: &Path, keys: &Path, image_at_digest: &str, predicate_type: &str, predicate: &str) {
    let (key, file) = (keys.join("cosign.key"), keys.join("predicate.json"));
    std::fs::write(&file, predicate).expect("predicate");
    let (key, file) = (key.to_str().expect("utf-8"), file.to_str().expect("utf-8"));
    let args = ["attest", "--new-bundle-format", "--key", key, "--tlog-upload=false", "--allow-http-registry", "-y"];
    let args = [&args[..], &["--type", predicate_type, "--predicate", file, image_at_digest]].concat();
    let (signed, text) = run_cosign(cosign, keys, &args);
    assert!(signed, "cosign attest (bundle) {image_at_digest}: {text}");
}

/// cosign's verdict on `image` whose signatures are Sigstore bundles, and what it printed: 2.5's
/// `verify` does not look for bundles, `verify-attestation` of [`SIGN_V1`] does. The trusted root
/// is empty (written to `keys`): without one cosign fetches the public-good root from TUF.
pub fn cosign_judges_bundle(cosign: &Path, keys: &Path, image: &str) -> (bool, String) {
    let root = keys.join("root.json");
    let empty = concat!(
        r#"{"mediaType":"application/vnd.dev.sigstore.trustedroot+json;version=0.1","#,
        r#""tlogs":[],"certificateAuthorities":[],"ctlogs":[],"timestampAuthorities":[]}"#
    );
    std::fs::write(&root, empty).expect("trusted root");
    let (key, root) = (keys.join("cosign.pub"), root.to_str().expect("utf-8").to_owned());
    let args = ["verify-attestation", "--new-bundle-format", "--trusted-root", &root, "--key"];
    let args = [&args[..], &[key.to_str().expect("utf-8"), "--insecure-ignore-tlog", "--allow-http-registry"]].concat();
    run_cosign(cosign, keys, &[&args[..], &["--type", SIGN_V1, image]].concat())
}

/// cosign's verdict on `image` whose signature is a keyless Sigstore bundle, and what it printed:
/// `root` is a trusted root of the test Fulcio and Rekor; their CA and key are also given through
/// the environment, so that cosign 2.5 reaches for no TUF repository.
pub fn cosign_judges_keyless_bundle(
    cosign: &Path,
    dir: &Path,
    image: &str,
    (root, ca, rekor): (&Path, &Path, &Path),
    (email, issuer): (&str, &str),
) -> (bool, String) {
    let text = |path: &Path| path.to_str().expect("utf-8").to_owned();
    let root = text(root);
    let args = ["verify-attestation", "--new-bundle-format", "--trusted-root", &root, "--allow-http-registry"];
    let identity = ["--certificate-identity", email, "--certificate-oidc-issuer", issuer, "--insecure-ignore-sct"];
    let args = [&args[..], &identity[..], &["--type", SIGN_V1, image]].concat();
    let (ca, rekor) = (text(ca), text(rekor));
    run_cosign_with(cosign, dir, &args, &[("SIGSTORE_ROOT_FILE", &ca), ("SIGSTORE_REKOR_PUBLIC_KEY", &rekor)])
}

/// cosign's verdict on `image` whose signature is a Sigstore bundle by `public`'s key, Rekor's
/// entry required: `root` is a trusted root of the test Rekor, whose key is also given through
/// the environment.
pub fn cosign_judges_logged_bundle(
    cosign: &Path,
    dir: &Path,
    image: &str,
    (root, public, rekor): (&Path, &Path, &Path),
) -> (bool, String) {
    let text = |path: &Path| path.to_str().expect("utf-8").to_owned();
    let (root, public) = (text(root), text(public));
    let args = ["verify-attestation", "--new-bundle-format", "--trusted-root", &root, "--allow-http-registry"];
    let args = [&args[..], &["--key", &public, "--type", SIGN_V1, image]].concat();
    run_cosign_with(cosign, dir, &args, &[("SIGSTORE_REKOR_PUBLIC_KEY", &text(rekor))])
}
