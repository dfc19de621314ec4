//! The guard on the kubelet in front of this socket. One deployment bricks a node: the kubelet's
//! image service pointed at a cri-imaged that is not socket-activated; after a reboot or while the
//! daemon restarts, nothing serves the socket the kubelet asks about every pod's image, and no pod
//! can start. Another defeats cri-imaged's pull scheduling: a kubelet that pulls serially (its
//! default) sends the next pull only when the last returns, so cri-imaged never has two of its
//! pulls to run at once or to order. At start-up cri-imaged reads where the kubelet's image
//! service is and how it pulls (its flags from `/proc`, else its config file); when that is the
//! socket it serves, it says so loudly, in `GetStatus` and in a metric.

use std::path::{Path, PathBuf};

use prometheus_client::{metrics::gauge::Gauge, registry::Registry};

/// The largest kubelet config read.
const CONFIG_LIMIT: u64 = 1 << 20;

/// What the kubelet runs with: a running kubelet's command line and the config file it reads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Kubelet {
    /// A running kubelet's arguments; empty when none runs.
    pub argv: Vec<String>,
    /// The config file its `--config` names (else the default) and its text, when it reads as
    /// UTF-8.
    pub config: Option<(PathBuf, String)>,
}

/// How a kubelet pulls images, and where that was read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeletPulls {
    /// One image at a time: `serializeImagePulls` anything but false (true when unset, the
    /// kubelet's default).
    pub serial: bool,
    /// Where `serial` was read.
    pub from: String,
    /// `maxParallelImagePulls`, when the config file sets it.
    pub max_parallel: Option<u64>,
}

/// What the guard warns of; each `None` when it does not stand.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Warnings {
    /// The kubelet's image service is this socket and nothing holds it across restarts.
    pub unactivated: Option<String>,
    /// The kubelet whose image service is this socket pulls serially.
    pub serial_pulls: Option<String>,
}

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

/// The kubelet's (deprecated) `--serialize-image-pulls`: bare is true, else `=` and a value Go's
/// `strconv.ParseBool` reads. A boolean flag never takes the next argument, and the last one
/// given wins, as in the kubelet's flag parser; one it would refuse is left out.
pub fn serialize_from_flags(argv: &[String]) -> Option<bool> {
    argv.iter().rev().find_map(|arg| match arg.strip_prefix("--serialize-image-pulls")? {
        "" => Some(true),
        rest => match rest.strip_prefix('=')? {
            "1" | "t" | "T" | "true" | "TRUE" | "True" => Some(true),
            "0" | "f" | "F" | "false" | "FALSE" | "False" => Some(false),
            _ => None,
        },
    })
}

/// `imageServiceEndpoint` of a kubelet config file (YAML or JSON).
pub fn from_config(text: &str) -> Option<String> {
    let document: serde_yaml_ng::Value = serde_yaml_ng::from_str(text).ok()?;
    document.get("imageServiceEndpoint")?.as_str().filter(|endpoint| !endpoint.is_empty()).map(str::to_owned)
}

/// `serializeImagePulls` and `maxParallelImagePulls` of a kubelet config file (YAML or JSON).
pub fn pulls_from_config(text: &str) -> (Option<bool>, Option<u64>) {
    let Ok(document) = serde_yaml_ng::from_str::<serde_yaml_ng::Value>(text) else {
        return (None, None);
    };
    // The kubelet reads YAML 1.1, where `no` and `off` are false too; serde_yaml_ng reads them as
    // strings.
    let serialize = document.get("serializeImagePulls").and_then(|value| match value {
        serde_yaml_ng::Value::Bool(serialize) => Some(*serialize),
        serde_yaml_ng::Value::String(word) => match word.as_str() {
            "y" | "Y" | "yes" | "Yes" | "YES" | "on" | "On" | "ON" | "true" | "True" | "TRUE" => Some(true),
            "n" | "N" | "no" | "No" | "NO" | "off" | "Off" | "OFF" | "false" | "False" | "FALSE" => Some(false),
            _ => None,
        },
        _ => None,
    });
    (serialize, document.get("maxParallelImagePulls").and_then(serde_yaml_ng::Value::as_u64))
}

/// Whether `endpoint` (`unix:///path` or a path) is the socket at `listen`.
pub fn names(endpoint: &str, listen: &Path) -> bool {
    let path = Path::new(endpoint.strip_prefix("unix://").unwrap_or(endpoint));
    let canonical = |path: &Path| path.canonicalize().unwrap_or_else(|_| path.to_owned());
    canonical(path) == canonical(listen)
}

impl Kubelet {
    /// Reads a running kubelet's flags from `/proc` and the config file they name, else
    /// `default_config`. Both are hostile: read bounded, never followed past a regular file.
    pub fn read(default_config: &Path) -> Self {
        let argv = running_kubelet().unwrap_or_default();
        let path = from_flags(&argv).1.unwrap_or_else(|| default_config.to_owned());
        let text = crate::files::read_named(&path, CONFIG_LIMIT).ok().and_then(|text| String::from_utf8(text).ok());
        Self { argv, config: text.map(|text| (path, text)) }
    }

    /// Where the kubelet's image service is, and where that was read: the running kubelet's
    /// flags, else its config file.
    pub fn image_service(&self) -> Option<(String, String)> {
        if let Some(endpoint) = from_flags(&self.argv).0 {
            return Some((endpoint, "the running kubelet's --image-service-endpoint".to_owned()));
        }
        let (path, text) = self.config.as_ref()?;
        Some((from_config(text)?, format!("imageServiceEndpoint in {}", path.display())))
    }

    /// How the kubelet pulls: its flag wins over its config file, as in the kubelet.
    pub fn pulls(&self) -> KubeletPulls {
        let (in_config, max_parallel) = self.config.as_ref().map_or((None, None), |(_, text)| pulls_from_config(text));
        let in_file = |what: &str| match &self.config {
            Some((path, _)) => format!("serializeImagePulls {what} in {}", path.display()),
            None => format!("serializeImagePulls {what}"),
        };
        let (serial, from) = match (serialize_from_flags(&self.argv), in_config) {
            (Some(serial), _) => (serial, "the running kubelet's --serialize-image-pulls".to_owned()),
            (None, Some(serial)) => (serial, in_file(if serial { "true" } else { "false" })),
            (None, None) => (true, format!("{}, the kubelet's default", in_file("unset"))),
        };
        KubeletPulls { serial, from, max_parallel }
    }
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

/// The warnings for `kubelet` when this daemon serves `listen`: none unless the kubelet's image
/// service is that socket.
pub fn warnings(listen: &Path, socket_activated: bool, kubelet: &Kubelet) -> Warnings {
    let Some((endpoint, from)) = kubelet.image_service().filter(|(endpoint, _)| names(endpoint, listen)) else {
        return Warnings::default();
    };
    let unactivated = (!socket_activated).then(|| {
        format!(
            "the kubelet's image service ({from}: {endpoint}) is this socket, but cri-imaged is not socket-activated: \
             after a reboot or during a restart nothing serves it and no pod can start; run cri-imaged under \
             systemd socket activation (deploy/systemd)"
        )
    });
    let pulls = kubelet.pulls();
    let serial_pulls = pulls.serial.then(|| {
        let max_parallel = pulls.max_parallel.map(|max| format!("; maxParallelImagePulls: {max}")).unwrap_or_default();
        format!(
            "the kubelet whose image service is this socket pulls serially ({}{max_parallel}): it asks for the next \
             image only when the last is pulled, so cri-imaged never has two of its pulls to run at once or to \
             order; set serializeImagePulls: false in the kubelet's config (and leave maxParallelImagePulls unset, \
             or no lower than cri-imaged's --max-parallel-image-pulls): cri-imaged caps and orders pulls itself",
            pulls.from
        )
    });
    Warnings { unactivated, serial_pulls }
}

/// The warnings for the kubelet on this node, read from `/proc` and its config file (else
/// `default_config`); blocking, for start-up only.
pub fn check(listen: &Path, socket_activated: bool, default_config: &Path) -> Warnings {
    warnings(listen, socket_activated, &Kubelet::read(default_config))
}

/// `cri_imaged_kubelet_image_service_unactivated` and `cri_imaged_kubelet_serial_image_pulls`:
/// each 1 while its warning stands.
#[derive(Debug, Clone, Default)]
pub struct GuardMetrics {
    unactivated: Gauge,
    serial_pulls: Gauge,
}

impl GuardMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        registry.register(
            "kubelet_image_service_unactivated",
            "1 when the kubelet's image service is this daemon's socket and no systemd socket holds it",
            metrics.unactivated.clone(),
        );
        registry.register(
            "kubelet_serial_image_pulls",
            "1 when the kubelet whose image service is this daemon's socket pulls serially (serializeImagePulls not false)",
            metrics.serial_pulls.clone(),
        );
        metrics
    }

    pub fn set(&self, warnings: &Warnings) {
        self.unactivated.set(i64::from(warnings.unactivated.is_some()));
        self.serial_pulls.set(i64::from(warnings.serial_pulls.is_some()));
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
    fn a_bare_serialize_flag_means_true_and_the_last_one_given_wins() {
        assert_eq!(serialize_from_flags(&argv(&["kubelet", "--serialize-image-pulls"])), Some(true));
        assert_eq!(serialize_from_flags(&argv(&["kubelet", "--serialize-image-pulls=false"])), Some(false));
        assert_eq!(serialize_from_flags(&argv(&["kubelet", "--serialize-image-pulls=True"])), Some(true));
        assert_eq!(serialize_from_flags(&argv(&["kubelet", "--serialize-image-pulls=0"])), Some(false));
        let twice = argv(&["kubelet", "--serialize-image-pulls=false", "--serialize-image-pulls"]);
        assert_eq!(serialize_from_flags(&twice), Some(true));
        // A boolean flag takes no separate value: `false` here is an argument of its own.
        let separate = argv(&["kubelet", "--serialize-image-pulls", "false"]);
        assert_eq!(serialize_from_flags(&separate), Some(true));
        assert_eq!(serialize_from_flags(&argv(&["kubelet", "--serialize-image-pulls=maybe"])), None);
        assert_eq!(serialize_from_flags(&argv(&["kubelet", "--serialize-image-pulls-other"])), None);
        assert_eq!(serialize_from_flags(&argv(&["kubelet", "--v=2"])), None);
    }

    #[test]
    fn serialize_and_max_parallel_are_read_from_a_yaml_or_json_config() {
        let yaml = "kind: KubeletConfiguration\nserializeImagePulls: false\nmaxParallelImagePulls: 5\n";
        assert_eq!(pulls_from_config(yaml), (Some(false), Some(5)));
        assert_eq!(pulls_from_config("serializeImagePulls: true\n"), (Some(true), None));
        assert_eq!(pulls_from_config("serializeImagePulls: no\n"), (Some(false), None), "YAML 1.1, as the kubelet");
        let json = r#"{"kind": "KubeletConfiguration", "serializeImagePulls": false, "maxParallelImagePulls": 3}"#;
        assert_eq!(pulls_from_config(json), (Some(false), Some(3)));
        assert_eq!(pulls_from_config("kind: KubeletConfiguration\n"), (None, None));
        assert_eq!(pulls_from_config("serializeImagePulls: [1]\n"), (None, None));
        assert_eq!(pulls_from_config("{not yaml"), (None, None));
    }

    fn kubelet(args: &[&str], config: Option<&str>) -> Kubelet {
        Kubelet {
            argv: argv(args),
            config: config.map(|text| (PathBuf::from("/var/lib/kubelet/config.yaml"), text.to_owned())),
        }
    }

    #[test]
    fn a_kubelet_pulls_serially_unless_its_flag_or_else_its_config_says_false() {
        let pulls = kubelet(&[], Some("serializeImagePulls: false\n")).pulls();
        assert!(!pulls.serial);
        assert_eq!(pulls.from, "serializeImagePulls false in /var/lib/kubelet/config.yaml");
        let unset = kubelet(&["kubelet"], Some("maxParallelImagePulls: 1\n")).pulls();
        assert!(unset.serial, "the kubelet's default");
        assert_eq!(unset.from, "serializeImagePulls unset in /var/lib/kubelet/config.yaml, the kubelet's default");
        assert_eq!(unset.max_parallel, Some(1));
        assert!(kubelet(&[], None).pulls().serial, "no config file: the default");

        let flag_beats_file =
            kubelet(&["kubelet", "--serialize-image-pulls=false"], Some("serializeImagePulls: true\n"));
        assert!(!flag_beats_file.pulls().serial);
        let serial_flag =
            kubelet(&["kubelet", "--serialize-image-pulls"], Some("serializeImagePulls: false\n")).pulls();
        assert!(serial_flag.serial);
        assert_eq!(serial_flag.from, "the running kubelet's --serialize-image-pulls");
    }

    #[test]
    fn a_warning_only_for_this_socket_served_without_activation() {
        let dir = tempfile::tempdir().expect("tempdir");
        let listen = dir.path().join("cri-imaged.sock");
        let config = dir.path().join("config.yaml");
        std::fs::write(&config, format!("imageServiceEndpoint: unix://{}\n", listen.display())).expect("written");
        let warning = check(&listen, false, &config).unactivated.expect("warned");
        assert!(warning.contains("is this socket, but cri-imaged is not socket-activated"), "{warning}");
        assert_eq!(check(&listen, true, &config).unactivated, None, "socket-activated: systemd holds it");
        assert_eq!(check(&dir.path().join("agents.sock"), false, &config), Warnings::default(), "another socket");
        assert_eq!(check(&listen, false, &dir.path().join("none.yaml")), Warnings::default(), "no kubelet config");
    }

    #[test]
    fn a_serial_pulls_warning_whenever_the_kubelet_pointing_here_pulls_serially() {
        let dir = tempfile::tempdir().expect("tempdir");
        let listen = dir.path().join("cri-imaged.sock");
        let endpoint = format!("unix://{}", listen.display());
        let here = |flags: &[&str], config: &str| {
            let mut args = vec!["kubelet", "--image-service-endpoint", endpoint.as_str()];
            args.extend_from_slice(flags);
            kubelet(&args, Some(config))
        };

        let unset = here(&[], "maxParallelImagePulls: 1\n");
        let warning = warnings(&listen, true, &unset).serial_pulls.expect("warned, socket-activated or not");
        assert!(warning.contains("pulls serially (serializeImagePulls unset in"), "{warning}");
        assert!(warning.contains("maxParallelImagePulls: 1"), "{warning}");
        assert!(warning.contains("set serializeImagePulls: false in the kubelet's config"), "{warning}");
        assert!(warnings(&listen, false, &unset).serial_pulls.is_some());

        assert_eq!(warnings(&listen, true, &here(&[], "serializeImagePulls: false\n")), Warnings::default());
        let flag = here(&["--serialize-image-pulls=false"], "serializeImagePulls: true\n");
        assert_eq!(warnings(&listen, true, &flag), Warnings::default(), "the flag wins");
        let other = kubelet(&["kubelet", "--image-service-endpoint", "unix:///run/containerd/containerd.sock"], None);
        assert_eq!(warnings(&listen, false, &other), Warnings::default(), "the kubelet pulls through another socket");
    }
}
