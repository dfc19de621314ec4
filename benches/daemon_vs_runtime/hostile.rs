//! Hostile input at once: the presence path of a daemon holding 1,000 idle HTTP/2 connections,
//! with a pull record that is a FIFO and one that links to `/dev/zero` in its root dir, and a
//! credential plugin that takes 5 s per run being asked for an absent image all along, against
//! the same run of a daemon with none of them (p99 at concurrency 1, and resident memory).

use std::{os::unix::fs::PermissionsExt, path::Path};

use cri_imaged::files::StateDir;

use crate::{
    Bench, Daemon, Findings,
    memory::resident,
    report::{self, Table, Verdict},
    take_turns, through_daemon,
};

/// A plugin that answers no credentials after 5 s, for `slow.registry.example` only.
fn slow_plugin(dir: &Path) -> (String, String) {
    let bin = dir.join("plugins");
    std::fs::create_dir_all(&bin).expect("plugin dir");
    let plugin = bin.join("slow-provider");
    let answer = r#"{"kind":"CredentialProviderResponse","apiVersion":"credentialprovider.kubelet.k8s.io/v1","cacheKeyType":"Image","cacheDuration":"0s","auth":{}}"#;
    std::fs::write(&plugin, format!("#!/bin/sh\ncat >/dev/null\nsleep 5\nprintf '%s' '{answer}'\n")).expect("plugin");
    std::fs::set_permissions(&plugin, std::fs::Permissions::from_mode(0o755)).expect("executable");
    let config = dir.join("credential-providers.yaml");
    let text = "apiVersion: kubelet.config.k8s.io/v1\nkind: CredentialProviderConfig\nproviders:\n  - name: slow-provider\n    matchImages: [\"slow.registry.example\"]\n    defaultCacheDuration: 0s\n    apiVersion: credentialprovider.kubelet.k8s.io/v1\n";
    std::fs::write(&config, text).expect("plugin config");
    (config.to_string_lossy().into_owned(), bin.to_string_lossy().into_owned())
}

/// The hostile records, where a daemon whose socket is in `dir` keeps its records.
fn hostile_records(dir: &Path) {
    let pulled = dir.join("root/image_manager/pulled");
    std::fs::create_dir_all(&pulled).expect("records dir");
    let fifo = pulled.join(StateDir::file_name("sha256:fifo"));
    let made = std::process::Command::new("mkfifo").arg(&fifo).status().expect("mkfifo runs");
    assert!(made.success(), "mkfifo");
    std::os::unix::fs::symlink("/dev/zero", pulled.join(StateDir::file_name("sha256:zero"))).expect("link");
}

/// HTTP/2 connections to `socket` that have shaken hands and then ask for nothing.
async fn idle_connections(socket: &Path, count: usize) -> Vec<h2::client::SendRequest<bytes::Bytes>> {
    let mut held = Vec::with_capacity(count);
    for _ in 0..count {
        held.push(crate::support::h2_connection(socket).await);
    }
    held
}

pub async fn run(bench: &Bench, findings: &mut Findings) {
    let (image, sizes) = (bench.images.present.as_str(), bench.sizes);
    let calm = Daemon::start(bench, "calm", &[]).await;
    let dir = bench.work.path().join("hostile");
    std::fs::create_dir_all(&dir).expect("hostile dir");
    hostile_records(&dir);
    let (plugin_config, plugin_bin) = slow_plugin(&dir);
    let plugin_flags =
        ["--image-credential-provider-config", &plugin_config, "--image-credential-provider-bin-dir", &plugin_bin];
    let hostile = Daemon::start_at(bench, &dir.join("hostile.sock"), &plugin_flags).await;
    let idle = idle_connections(&dir.join("hostile.sock"), sizes.idle_connections).await;
    // Pods asking all along for an image only the slow plugin may have credentials for, each ask
    // a new pod's (a pod's own would be backed off, and answered at once).
    let asking: Vec<_> = (0..4)
        .map(|pod| {
            let client = hostile.client.clone();
            tokio::spawn(async move {
                for ask in 0.. {
                    let uid = format!("slow-{pod}-{ask}");
                    let _ = crate::ensure(&client, "slow.registry.example/app:v1", &uid).await;
                }
            })
        })
        .collect();
    for client in [&calm.client, &hostile.client] {
        crate::ensure(client, image, "warm-up").await.expect("the present image is pulled");
    }
    let sides = [("calm", through_daemon(&calm.client, image)), ("hostile", through_daemon(&hostile.client, image))];
    let runs = take_turns(&sides, 1, sizes).await;
    let (calm_memory, hostile_memory) = (resident(calm.pid()), resident(hostile.pid()));
    for task in asking {
        task.abort();
    }
    let quarantined = hostile.metric("cri_imaged_state_files_quarantined_total");
    let title = format!(
        "Hostile input: presence path at concurrency 1 with {} idle connections, a FIFO and a /dev/zero record, and a 5 s credential plugin in use, against none of them",
        idle.len()
    );
    let mut table =
        Table::new(&title, &["daemon", "p50", "p99", "resident", "idle connections", "records quarantined"]);
    for ((name, _), run, memory, connections, set_aside) in
        [(&sides[0], &runs[0], calm_memory, 0, 0.0), (&sides[1], &runs[1], hostile_memory, idle.len(), quarantined)]
    {
        table.row(vec![
            (*name).to_owned(),
            report::micros(run.quantile_us(0.5)),
            report::micros(run.quantile_us(0.99)),
            format!("{:.1} MiB", memory.now_kib as f64 / 1024.0),
            connections.to_string(),
            format!("{set_aside:.0}"),
        ]);
    }
    findings.tables.push(table);
    let p99 = f64::from(runs[1].quantile_us(0.99)) / f64::from(runs[0].quantile_us(0.99));
    findings.verdicts.push(Verdict {
        what: "presence p99 with hostile input / without, concurrency 1".into(),
        target: "≤ 1.2".into(),
        measured: format!(
            "{p99:.2} ({} vs {})",
            report::micros(runs[1].quantile_us(0.99)),
            report::micros(runs[0].quantile_us(0.99))
        ),
        met: p99 <= 1.2,
    });
    let memory = hostile_memory.now_kib as f64 / calm_memory.now_kib as f64;
    findings.verdicts.push(Verdict {
        what: format!("resident memory with hostile input / without ({} idle connections)", idle.len()),
        target: "reported".into(),
        measured: format!(
            "{memory:.2} ({:.1} vs {:.1} MiB)",
            hostile_memory.now_kib as f64 / 1024.0,
            calm_memory.now_kib as f64 / 1024.0
        ),
        met: true,
    });
    assert_eq!(quarantined, 2.0, "both hostile records were set aside");
    drop(idle);
}
