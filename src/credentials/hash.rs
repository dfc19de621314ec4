//! The kubelet's credential hash (KEP-2535): the hex SHA-256 of the credential as Go's
//! `json.Marshal` writes the kubelet's `AuthConfig`, so that pull records written by the kubelet
//! and by cri-imaged name a credential alike.

use sha2::{Digest, Sha256};
use zeroize::Zeroize;

use super::RegistryAuth;

/// The credential's hash, as the kubelet computes it.
pub fn kubelet_hash(auth: &RegistryAuth) -> String {
    use secrecy::ExposeSecret;
    // The kubelet's field order and names; empty fields are left out (`omitempty`).
    let fields = [
        ("username", auth.username.expose_secret()),
        ("password", auth.password.expose_secret()),
        ("auth", auth.auth.expose_secret()),
        ("email", auth.email.as_str()),
        ("serveraddress", auth.server_address.as_str()),
        ("identitytoken", auth.identity_token.expose_secret()),
        ("registrytoken", auth.registry_token.expose_secret()),
    ];
    let mut json = String::from("{");
    for (name, value) in fields.into_iter().filter(|(_, value)| !value.is_empty()) {
        if json.len() > 1 {
            json.push(',');
        }
        json.push('"');
        json.push_str(name);
        json.push_str("\":");
        push_go_string(&mut json, value);
    }
    json.push('}');
    let digest = Sha256::digest(json.as_bytes());
    json.zeroize();
    hex(&digest)
}

/// Lowercase hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes.iter().fold(String::with_capacity(bytes.len() * 2), |mut out, byte| {
        let _ = write!(out, "{byte:02x}");
        out
    })
}

/// A JSON string as Go's encoder writes it: HTML-safe (`<`, `>`, `&` escaped), U+2028 and
/// U+2029 escaped, control characters as `\n`-style or `\u00XX` escapes.
fn push_go_string(out: &mut String, value: &str) {
    out.push('"');
    for c in value.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '<' | '>' | '&' | '\u{2028}' | '\u{2029}' => {
                use std::fmt::Write;
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c if u32::from(c) < 0x20 => {
                use std::fmt::Write;
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn login(username: &str, password: &str) -> RegistryAuth {
        RegistryAuth::login(username.into(), password.into())
    }

    #[test]
    fn the_hash_is_the_kubelets() {
        // From the kubelet's secrets tests: sha256 of {"username":"user","password":"password"}.
        assert_eq!(
            kubelet_hash(&login("user", "password")),
            "a55436fc140d516560d072c5fe8700385ce9f41629abf65c1edcbcb39fac691d"
        );
    }

    #[test]
    fn the_json_hashed_is_gos() {
        let mut buffer = String::new();
        push_go_string(&mut buffer, "a\"b\\c\n<tag>&\u{1}\u{2028}é");
        assert_eq!(buffer, r#""a\"b\\c\n\u003ctag\u003e\u0026\u0001\u2028é""#);
        let with_email = RegistryAuth { email: "e@x".into(), ..login("u", "p") };
        let expected = hex(&Sha256::digest(br#"{"username":"u","password":"p","email":"e@x"}"#));
        assert_eq!(kubelet_hash(&with_email), expected);
    }

    #[test]
    fn different_credentials_hash_differently() {
        assert_ne!(kubelet_hash(&login("user", "password")), kubelet_hash(&login("user", "passwore")));
        assert_ne!(kubelet_hash(&login("us", "erpassword")), kubelet_hash(&login("user", "password")));
    }
}
