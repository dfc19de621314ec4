//! The kubelet's docker config decoding cases (`config_test.go`), in our words.

use secrecy::ExposeSecret;

use super::*;

fn login(entry: &Entry) -> (&str, &str) {
    (entry.auth.username.expose_secret(), entry.auth.password.expose_secret())
}

fn one_entry(fields: serde_json::Value) -> Result<(String, String), DockerConfigError> {
    let document = serde_json::json!({ "registry.local": fields }).to_string();
    let entries = parse(document.as_bytes(), Shape::Dockercfg)?;
    assert_eq!(entries.len(), 1);
    let (username, password) = login(&entries[0]);
    Ok((username.to_owned(), password.to_owned()))
}

#[test]
fn entries_give_a_username_and_password_with_auth_taking_precedence() {
    let cases = [
        (serde_json::json!({"username": "foo", "password": "bar", "email": "foo@example.com"}), ("foo", "bar")),
        (serde_json::json!({"auth": "Zm9vOmJhcg==", "email": "foo@example.com"}), ("foo", "bar")),
        (
            serde_json::json!({"username": "foo", "password": "bar", "auth": "cGluZzpwb25n", "email": "foo@example.com"}),
            ("ping", "pong"),
        ),
        (serde_json::json!({"username": "foo", "password": "bar", "auth": ""}), ("foo", "bar")),
        (serde_json::json!({"Username": "foo", "PASSWORD": "bar"}), ("foo", "bar")),
        (serde_json::json!({"username": "foo", "identitytoken": "ignored", "serveraddress": "x"}), ("foo", "")),
        (serde_json::json!({"username": null, "password": "bar"}), ("", "bar")),
        (serde_json::Value::Null, ("", "")),
    ];
    for (fields, (username, password)) in cases {
        let printed = fields.to_string();
        assert_eq!(one_entry(fields), Ok((username.to_owned(), password.to_owned())), "{printed}");
    }
}

#[test]
fn auth_decodes_padded_unpadded_and_across_line_breaks() {
    let cases = [
        ("Zm9vOmJhcg==", ("foo", "bar")),
        ("Zm9vOmJhcg", ("foo", "bar")),
        ("Zm9vOm\nJhcg==\n", ("foo", "bar")),
        ("Zm9vOmJhcgo=", ("foo", "bar\n")),
        // Split on the first colon only: passwords may hold colons, and may be empty.
        ("Zm9vOmJhcjpiYXo=", ("foo", "bar:baz")),
        ("Zm9vOg==", ("foo", "")),
    ];
    for (auth, (username, password)) in cases {
        assert_eq!(decode_auth(auth), Ok((username.to_owned(), password.to_owned())), "{auth:?}");
    }
}

#[test]
fn auth_that_does_not_decode_to_user_colon_password_is_refused() {
    assert_eq!(decode_auth("cGFudHM="), Err(AuthError::NoColon), "\"pants\" has no colon");
    assert!(matches!(decode_auth("Zm9vOmJhcg== "), Err(AuthError::NotBase64(_))), "only line breaks are skipped");
    assert!(matches!(decode_auth("pants"), Err(AuthError::NotBase64(_))));
    assert_eq!(decode_auth("/w=="), Err(AuthError::NotUtf8));
    let error = one_entry(serde_json::json!({"auth": "cGFudHM=", "email": "foo@example.com"})).unwrap_err();
    assert_eq!(
        error.to_string(),
        "has an entry for \"registry.local\" that cannot be used: unable to parse auth field, must be formatted as base64(username:password)"
    );
}

#[test]
fn both_shapes_read_the_same_entries() {
    let registries = serde_json::json!({
        "http://foo.example.com": {"username": "foo", "password": "bar", "email": "foo@example.com"},
        "http://bar.example.com": {"username": "bar", "password": "baz", "email": "bar@example.com"},
    });
    let bare = parse(registries.to_string().as_bytes(), Shape::Dockercfg).expect("a .dockercfg");
    let wrapped = serde_json::json!({ "auths": registries, "HttpHeaders": {"X-Ignored": "1"} }).to_string();
    let wrapped = parse(wrapped.as_bytes(), Shape::ConfigJson).expect("a config.json");
    for entries in [bare, wrapped] {
        let mut read: Vec<_> = entries.iter().map(|entry| (entry.key.as_str(), login(entry))).collect();
        read.sort();
        assert_eq!(read, [("http://bar.example.com", ("bar", "baz")), ("http://foo.example.com", ("foo", "bar"))]);
    }
}

#[test]
fn a_config_json_without_auths_has_no_entries() {
    for document in ["{}", r#"{"credsStore": "desktop"}"#, r#"{"auths": null}"#, r#"{"Auths": {}}"#] {
        assert!(parse(document.as_bytes(), Shape::ConfigJson).expect(document).is_empty(), "{document}");
    }
}

#[test]
fn malformed_documents_are_refused_without_quoting_them() {
    let cases = [
        (r#"{"auths": "#, Shape::ConfigJson, "is not valid JSON (unexpected end of input at line 1 column 10)"),
        (r#"["hunter2"]"#, Shape::ConfigJson, "is not a JSON object"),
        (r#"{"auths": ["hunter2"]}"#, Shape::ConfigJson, "has an \"auths\" that is not a JSON object"),
        (r#"{"r.local": "hunter2"}"#, Shape::Dockercfg, "has an entry for \"r.local\" that is not a JSON object"),
        (
            r#"{"r.local": {"password": 1234}}"#,
            Shape::Dockercfg,
            "has an entry for \"r.local\" whose \"password\" is not a string",
        ),
        (
            r#"{"r.local": {"email": false}}"#,
            Shape::Dockercfg,
            "has an entry for \"r.local\" whose \"email\" is not a string",
        ),
        (
            r#"{"r.local": {"auth": "hunter2!"}}"#,
            Shape::Dockercfg,
            "has an entry for \"r.local\" that cannot be used: auth field is not base64 (invalid symbol at offset 7)",
        ),
    ];
    for (document, shape, expected) in cases {
        let error = parse(document.as_bytes(), shape).err().unwrap_or_else(|| panic!("{document} must be refused"));
        assert_eq!(error.to_string(), expected, "{document}");
        for secret in ["hunter2", "1234"] {
            assert!(!error.to_string().contains(secret), "{error}");
        }
    }
}

#[test]
fn a_long_registry_key_is_quoted_shortened() {
    let key = "r".repeat(5000);
    let document = serde_json::json!({ &key: "not an object" }).to_string();
    let error = parse(document.as_bytes(), Shape::Dockercfg).err().expect("refused").to_string();
    assert!(error.len() < 200, "{} bytes", error.len());
}
