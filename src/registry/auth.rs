//! A registry's `WWW-Authenticate` challenge (RFC 7235, as the distribution token spec uses it):
//! `Basic realm="…"`, or `Bearer realm="…",service="…",scope="…"` naming where a token is got.

/// What a registry asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Challenge {
    Basic,
    Bearer { realm: String, service: Option<String>, scope: Option<String> },
}

/// Reads the first challenge this client can answer; `None` for anything else.
pub fn parse(header: &str) -> Option<Challenge> {
    let (scheme, rest) = header.trim().split_once(char::is_whitespace).unwrap_or((header.trim(), ""));
    if scheme.eq_ignore_ascii_case("basic") {
        return Some(Challenge::Basic);
    }
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let params = parameters(rest);
    let get =
        |name: &str| params.iter().find(|(key, _)| key.eq_ignore_ascii_case(name)).map(|(_, value)| value.clone());
    Some(Challenge::Bearer { realm: get("realm")?, service: get("service"), scope: get("scope") })
}

/// `key=value` or `key="quoted, value"` pairs, comma separated.
fn parameters(mut rest: &str) -> Vec<(String, String)> {
    let mut found = Vec::new();
    loop {
        rest = rest.trim_start_matches(|c: char| c == ',' || c.is_whitespace());
        let Some((key, after)) = rest.split_once('=') else { return found };
        let key = key.trim().to_owned();
        let after = after.trim_start();
        let value;
        if let Some(quoted) = after.strip_prefix('"') {
            let mut out = String::new();
            let mut chars = quoted.char_indices();
            let mut end = quoted.len();
            while let Some((at, c)) = chars.next() {
                match c {
                    '\\' => {
                        if let Some((_, escaped)) = chars.next() {
                            out.push(escaped);
                        }
                    }
                    '"' => {
                        end = at + 1;
                        break;
                    }
                    c => out.push(c),
                }
            }
            value = out;
            rest = &quoted[end.min(quoted.len())..];
        } else {
            let end = after.find(',').unwrap_or(after.len());
            value = after[..end].trim().to_owned();
            rest = &after[end..];
        }
        found.push((key, value));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bearer_challenge_names_its_realm_service_and_scope() {
        let header = r#"Bearer realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:library/alpine:pull""#;
        assert_eq!(
            parse(header),
            Some(Challenge::Bearer {
                realm: "https://auth.docker.io/token".into(),
                service: Some("registry.docker.io".into()),
                scope: Some("repository:library/alpine:pull".into()),
            })
        );
    }

    #[test]
    fn basic_and_unknown_schemes() {
        assert_eq!(parse(r#"Basic realm="Registry Realm""#), Some(Challenge::Basic));
        assert_eq!(parse("Negotiate"), None);
        // A bearer challenge without a realm names nowhere to get a token.
        assert_eq!(parse(r#"Bearer service="x""#), None);
    }

    #[test]
    fn quoted_values_keep_commas_and_escapes() {
        let parsed = parse(r#"Bearer realm="http://h/t?a=1,b",scope="a\"b",service=plain"#);
        assert_eq!(
            parsed,
            Some(Challenge::Bearer {
                realm: "http://h/t?a=1,b".into(),
                service: Some("plain".into()),
                scope: Some("a\"b".into()),
            })
        );
    }

    #[test]
    fn hostile_headers_end_without_panic() {
        for header in ["", "Bearer", "Bearer realm=\"", "Bearer =,=,\"", "Bearer realm=\"a\\"] {
            let _ = parse(header);
        }
    }
}
