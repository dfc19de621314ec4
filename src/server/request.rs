//! Translation of wire requests into the manager's types; refuses what cannot be translated.

use secrecy::SecretString;
use zeroize::Zeroize;

use crate::{
    api::{self, PullPolicy as WirePolicy},
    credentials::{SecretCoordinates, secrets::PullSecret},
    ensure::{EnsureRequest, PodRef},
    pull::Peer,
    pull_policy::PullPolicy,
};

/// A request field that cannot be understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error("pull_policy {0} is not a known PullPolicy (use ALWAYS, IF_NOT_PRESENT, NEVER or leave it unset)")]
    UnknownPullPolicy(i32),
}

impl RequestError {
    /// The offending field's name.
    pub fn field(&self) -> &'static str {
        match self {
            Self::UnknownPullPolicy(_) => "pull_policy",
        }
    }
}

/// The calling process, from the credentials the kernel took when it connected.
pub fn peer<T>(request: &tonic::Request<T>) -> Option<Peer> {
    let connection = request.extensions().get::<tonic::transport::server::UdsConnectInfo>()?;
    let credentials = connection.peer_cred?;
    Some(Peer { uid: credentials.uid(), gid: credentials.gid(), pid: credentials.pid() })
}

impl TryFrom<api::EnsureImageExistsRequest> for EnsureRequest {
    type Error = RequestError;

    fn try_from(wire: api::EnsureImageExistsRequest) -> Result<Self, RequestError> {
        let pull_policy = match WirePolicy::try_from(wire.pull_policy) {
            Ok(WirePolicy::Unspecified) => None,
            Ok(WirePolicy::Always) => Some(PullPolicy::Always),
            Ok(WirePolicy::IfNotPresent) => Some(PullPolicy::IfNotPresent),
            Ok(WirePolicy::Never) => Some(PullPolicy::Never),
            Err(_) => return Err(RequestError::UnknownPullPolicy(wire.pull_policy)),
        };
        let pod = wire.pod.unwrap_or_default();
        Ok(Self {
            pull_secrets: wire.pull_secrets.into_iter().map(pull_secret).collect(),
            image: wire.image,
            pull_policy,
            pod: PodRef { namespace: pod.namespace, name: pod.name, uid: pod.uid, annotations: pod.annotations },
            container_name: wire.container_name,
            runtime_handler: wire.runtime_handler,
            sandbox_config: wire.pod_sandbox_config,
            // From the connection, not the message: see [`peer`].
            peer: None,
        })
    }
}

/// A wire pull secret, its content moved into a secret string (wiped when dropped). Moved, not
/// copied, when the string holds no spare capacity (as decoded, it does not): a copy would be
/// wiped too, and wiping costs as much as copying again.
fn pull_secret(mut wire: api::PullSecret) -> PullSecret {
    let content = if wire.docker_config_json.capacity() == wire.docker_config_json.len() {
        SecretString::from(std::mem::take(&mut wire.docker_config_json))
    } else {
        let copied = SecretString::from(wire.docker_config_json.as_str());
        wire.docker_config_json.zeroize();
        copied
    };
    PullSecret {
        coordinates: SecretCoordinates { uid: wire.uid, namespace: wire.namespace, name: wire.name },
        kind: wire.r#type,
        content,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_pull_policy_is_refused_with_its_value() {
        let wire = api::EnsureImageExistsRequest { image: "busybox".into(), pull_policy: 9, ..Default::default() };
        let error = EnsureRequest::try_from(wire).expect_err("9 is no policy");
        assert_eq!(error, RequestError::UnknownPullPolicy(9));
        assert!(error.to_string().contains("pull_policy 9"));
    }

    #[test]
    fn pull_secrets_keep_their_coordinates_type_and_content() {
        use secrecy::ExposeSecret;
        let secret = api::PullSecret {
            name: "regcred".into(),
            namespace: "team".into(),
            docker_config_json: r#"{"auths": {}}"#.into(),
            uid: "6c1d".into(),
            r#type: "kubernetes.io/dockercfg".into(),
        };
        let wire =
            api::EnsureImageExistsRequest { image: "busybox".into(), pull_secrets: vec![secret], ..Default::default() };
        let request = EnsureRequest::try_from(wire).expect("valid");
        let [secret] = request.pull_secrets.as_slice() else { panic!("one secret") };
        let expected = SecretCoordinates { uid: "6c1d".into(), namespace: "team".into(), name: "regcred".into() };
        assert_eq!(secret.coordinates, expected);
        assert_eq!(secret.kind, "kubernetes.io/dockercfg");
        assert_eq!(secret.content.expose_secret(), r#"{"auths": {}}"#);
        assert!(!format!("{secret:?}").contains("auths"), "Debug shows no content");
    }

    #[test]
    fn a_wire_pull_secret_never_prints_its_content() {
        let secret =
            api::PullSecret { name: "regcred".into(), docker_config_json: "hunter2".into(), ..Default::default() };
        let printed =
            format!("{:?}", api::EnsureImageExistsRequest { pull_secrets: vec![secret], ..Default::default() });
        assert!(!printed.contains("hunter2") && printed.contains("regcred"), "{printed}");
    }

    #[test]
    fn unspecified_pull_policy_is_left_for_the_manager_to_default() {
        let wire = api::EnsureImageExistsRequest { image: "busybox".into(), ..Default::default() };
        let request = EnsureRequest::try_from(wire).expect("valid");
        assert_eq!(request.pull_policy, None);
        assert_eq!(request.image, "busybox");
    }
}
