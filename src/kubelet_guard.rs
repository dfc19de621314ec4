//! The guard against the one deployment that bricks a node: the kubelet's image service pointed at
//! a cri-imaged that is not socket-activated. Then, after a reboot or while the daemon restarts,
//! nothing serves the socket the kubelet asks about every pod's image, and no pod can start. At
//! start-up cri-imaged reads where the kubelet's image service is (its flags from `/proc`, else
//! its config file); if that is the socket it serves without systemd holding it, it says so
//! loudly, in `GetStatus` and in a metric.

use std::path::{Path, PathBuf};

use prometheus_client::{metrics::gauge::Gauge, registry::Registry};

/// The largest kubelet config read.
const CONFIG_LIMIT: u64 = 1 << 20;

/// The kubelet's image service as its flags name it: `--image-service-endpoint` and the config
/// file `--config` names, each `--flag=value` or `--flag value`.
pub fn from_flags(argv: &[String]) -> (Option<String>, Option<PathBuf>) {
    let value = |flag: &str| {
        argv.iter().enumerate().find_map(|(index, arg)| match arg.strip_prefix(flag) {
            Some(rest) if rest.starts_with('=') => Some(rest[1..].to_owned()),
            Some("") => argv.get(index + 1).cloned(),
            _ => None,
        })
    };
    (value("--image-service-endpoint"), value("--config").map(PathBuf::from))
}

/// `imageServiceEndpoint` of a kubelet config file (YAML or JSON).
pub fn from_config(text: &str) -> Option<String> {
    let document: serde_yaml_ng::Value = serde_yaml_ng::from_str(text).ok()?;
    document.get("imageServiceEndpoint")?.as_str().filter(|endpoint| !endpoint.is_empty()).map(str::to_owned)
}

/// Whether `endpoint` (`unix:///path` or a path) is the socket at `listen`.
pub fn names(endpoint: &str, listen: &Path) -> bool {
    let path = Path::new(endpoint.strip_prefix("unix://").unwrap_or(endpoint));
    let canonical = |path: &Path| path.canonicalize().unwrap_or_else(|_| path.to_owned());
    canonical(path) == canonical(listen)
}

/// Where the kubelet's image service is, and where that was read: a running kubelet's flags,
/// else the config file its flags name, else `default_config`.
pub fn kubelet_image_service(default_config: &Path) -> Option<(String, String)> {
    let (endpoint, config) = running_kubelet().map(|argv| from_flags(&argv)).unwrap_or_default();
    if let Some(endpoint) = endpoint {
        return Some((endpoint, "the running kubelet's --image-service-endpoint".to_owned()));
    }
    let config = config.unwrap_or_else(|| default_config.to_owned());
    let text = crate::files::read_named(&config, CONFIG_LIMIT).ok()?;
    let endpoint = from_config(std::str::from_utf8(&text).ok()?)?;
    Some((endpoint, format!("imageServiceEndpoint in {}", config.display())))
}

/// The command line of a running process named `kubelet`, if any.
fn running_kubelet() -> Option<Vec<String>> {
    std::fs::read_dir("/proc").ok()?.filter_map(Result::ok).find_map(|entry| {
        let comm = std::fs::read_to_string(entry.path().join("comm")).ok()?;
        if comm.trim() != "kubelet" {
            return None;
        }
        let cmdline = crate::files::read_named(&entry.path().join("cmdline"), CONFIG_LIMIT).ok()?;
        Some(cmdline.split(|byte| *byte == 0).map(|arg| String::from_utf8_lossy(arg).into_owned()).collect())
    })
}

/// The warning, when the kubelet's image service is `listen` and nothing holds it across restarts.
pub fn check(listen: &Path, socket_activated: bool, default_config: &Path) -> Option<String> {
    if socket_activated {
        return None;
    }
    let (endpoint, from) = kubelet_image_service(default_config)?;
    names(&endpoint, listen).then(|| {
        format!(
            "the kubelet's image service ({from}: {endpoint}) is this socket, but cri-imaged is not socket-activated: \
             after a reboot or during a restart nothing serves it and no pod can start; run cri-imaged under \
             systemd socket activation (deploy/systemd)"
        )
    })
}

/// `cri_imaged_kubelet_image_service_unactivated`: 1 while the warning stands.
#[derive(Debug, Clone, Default)]
pub struct GuardMetrics {
    unactivated: Gauge,
}

impl GuardMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        registry.register(
            "kubelet_image_service_unactivated",
            "1 when the kubelet's image service is this daemon's socket and no systemd socket holds it",
            metrics.unactivated.clone(),
        );
        metrics
    }

    pub fn set(&self, warned: bool) {
        self.unactivated.set(i64::from(warned));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(args: &[&str]) -> Vec<String> {
        args.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn the_endpoint_and_config_are_read_from_the_kubelets_flags_either_way() {
        let both =
            argv(&["/usr/bin/kubelet", "--config=/etc/kubelet.yaml", "--image-service-endpoint", "unix:///run/x.sock"]);
        assert_eq!(from_flags(&both), (Some("unix:///run/x.sock".into()), Some(PathBuf::from("/etc/kubelet.yaml"))));
        assert_eq!(from_flags(&argv(&["kubelet", "--v=2"])), (None, None));
        assert_eq!(from_flags(&argv(&["kubelet", "--image-service-endpoint-other=1"])), (None, None));
    }

    #[test]
    fn the_endpoint_is_read_from_the_config_file() {
        let yaml = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nimageServiceEndpoint: unix:///run/cri-imaged/cri-imaged.sock\n";
        assert_eq!(from_config(yaml).as_deref(), Some("unix:///run/cri-imaged/cri-imaged.sock"));
        assert_eq!(from_config("kind: KubeletConfiguration\n"), None);
        assert_eq!(from_config("{not yaml"), None);
    }

    #[test]
    fn a_warning_only_for_this_socket_served_without_activation() {
        let dir = tempfile::tempdir().expect("tempdir");
        let listen = dir.path().join("cri-imaged.sock");
        let config = dir.path().join("config.yaml");
        std::fs::write(&config, format!("imageServiceEndpoint: unix://{}\n", listen.display())).expect("written");
        let warning = check(&listen, false, &config).expect("warned");
        assert!(warning.contains("is this socket, but cri-imaged is not socket-activated"), "{warning}");
        assert_eq!(check(&listen, true, &config), None, "socket-activated: systemd holds it");
        assert_eq!(check(&dir.path().join("agents.sock"), false, &config), None, "another socket");
        assert_eq!(check(&listen, false, &dir.path().join("none.yaml")), None, "no kubelet config");
    }
}
