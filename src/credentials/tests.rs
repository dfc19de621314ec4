use super::*;

/// The node's credentials from a docker config holding `user`'s login to registry.local.
fn node_logged_in_as(dir: &std::path::Path, user: &str) -> NodeCredentials {
    let path = dir.join(format!("{user}.json"));
    let auth = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, format!("{user}:{user}-pw"));
    let config = serde_json::json!({"auths": {"registry.local": {"auth": auth}}});
    std::fs::write(&path, config.to_string()).expect("config written");
    NodeCredentials::new(node::NodeDockerConfig::explicit(path).expect("readable"), plugin::Plugins::none())
}

async fn users(node: &NodeCredentials) -> Vec<String> {
    node.lookup("registry.local/app", None)
        .await
        .iter()
        .map(|credential| credential.auth.fields()[1].to_owned())
        .collect()
}

#[tokio::test]
async fn a_replacement_answers_every_lookup_after_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = node_logged_in_as(dir.path(), "alice");
    assert_eq!(users(&node).await, ["alice"]);
    node.replace(node_logged_in_as(dir.path(), "bob"));
    assert_eq!(users(&node).await, ["bob"]);
    node.replace(NodeCredentials::none());
    assert_eq!(users(&node).await, Vec::<String>::new());
}
