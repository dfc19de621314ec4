//! A pull's progress and stall, from what containerd's content service lists (pure; fed by
//! [`super::poller`]).
//!
//! containerd writes each blob it downloads as an ingest named `layer-sha256:<hex>` (also
//! `config-`, `manifest-`, `index-`), one per digest however many pulls need it, advancing its
//! offset in 1 MiB steps; the pull's manifest, with its layers, is in the content store before
//! any layer is fetched. So each poll says, for each layer of a pull, how far its download is; a
//! layer whose ingest vanished was either committed (the content store has it) or aborted.

use std::{
    collections::{HashMap, HashSet, VecDeque},
    sync::Arc,
};

use tokio::time::{Duration, Instant};

use crate::events::{LayerFacts, MOST_LAYERS};

/// The digest an ingest ref names: `layer-sha256:<hex>` → `sha256:<hex>`; refs of the form
/// `<kind>-<name>@<digest>` name the digest after the `@`.
pub fn digest_of_ref(reference: &str) -> Option<&str> {
    let digest = match reference.rsplit_once('@') {
        Some((_, digest)) => digest,
        None => reference.split_once('-')?.1,
    };
    let (algorithm, hex) = digest.split_once(':')?;
    let valid = !algorithm.is_empty()
        && algorithm.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        && !hex.is_empty()
        && hex.bytes().all(|b| b.is_ascii_hexdigit());
    valid.then_some(digest)
}

/// The layers an image manifest names, in order; `None` for anything else (an index, a blob
/// that is not JSON, a layer without a digest).
pub fn manifest_layers(manifest: &[u8]) -> Option<Vec<Layer>> {
    #[derive(serde::Deserialize)]
    struct Manifest {
        layers: Vec<Descriptor>,
    }
    #[derive(serde::Deserialize)]
    struct Descriptor {
        digest: String,
        #[serde(default)]
        size: u64,
    }
    let manifest: Manifest = serde_json::from_slice(manifest).ok()?;
    Some(manifest.layers.into_iter().map(|layer| Layer { digest: layer.digest, size: layer.size }).collect())
}

/// The config blob an image manifest names; `None` for anything else.
pub fn manifest_config(manifest: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Manifest {
        config: Config,
    }
    #[derive(serde::Deserialize)]
    struct Config {
        digest: String,
    }
    let manifest: Manifest = serde_json::from_slice(manifest).ok()?;
    Some(manifest.config.digest)
}

/// An ingest under way, as one poll listed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ingest {
    pub offset: u64,
    pub total: u64,
}

/// One layer of a pull's manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layer {
    pub digest: String,
    pub size: u64,
}

/// What a pull has done so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    pub bytes_done: u64,
    pub bytes_total: u64,
    pub layers_done: usize,
    pub layers_total: usize,
}

/// One pull's layers and what each poll said of them.
#[derive(Debug)]
pub struct PullProgress {
    /// The layers to fetch: the manifest's, less those the store had when the pull began.
    layers: Vec<Layer>,
    /// The digests of the first [`MOST_LAYERS`] of them, shared by every report that names them.
    named: Vec<Arc<str>>,
    done: HashSet<String>,
    /// Each layer's offset at the last poll that listed it.
    offsets: HashMap<String, u64>,
    /// When a byte last moved, or a layer completed.
    last_advance: Instant,
}

impl PullProgress {
    /// A pull of `layers`, those in `present` already in the store, observed from `now`.
    pub fn new(layers: Vec<Layer>, present: &HashSet<String>, now: Instant) -> Self {
        let layers: Vec<Layer> = layers.into_iter().filter(|layer| !present.contains(&layer.digest)).collect();
        let named = layers.iter().take(MOST_LAYERS).map(|layer| Arc::from(layer.digest.as_str())).collect();
        Self { layers, named, done: HashSet::new(), offsets: HashMap::new(), last_advance: now }
    }

    /// The digests of the layers it fetches.
    pub fn digests(&self) -> impl Iterator<Item = &str> {
        self.layers.iter().map(|layer| layer.digest.as_str())
    }

    /// The layers that were being fetched and are no longer listed in `ingests`: the caller asks
    /// the content store whether each was committed, for [`PullProgress::observe`].
    pub fn vanished(&self, ingests: &HashMap<String, Ingest>) -> Vec<String> {
        self.offsets
            .keys()
            .filter(|digest| !ingests.contains_key(*digest) && !self.done.contains(*digest))
            .cloned()
            .collect()
    }

    /// One poll at `now`: the ingests listed (by digest) and which vanished layers the store has.
    /// A layer shared with another pull counts for both: both wait for the one download.
    pub fn observe(
        &mut self,
        ingests: &HashMap<String, Ingest>,
        committed: &HashSet<String>,
        now: Instant,
    ) -> Progress {
        let mut advanced = false;
        for layer in &self.layers {
            if self.done.contains(&layer.digest) {
                continue;
            }
            if committed.contains(&layer.digest) {
                self.done.insert(layer.digest.clone());
                self.offsets.remove(&layer.digest);
                advanced = true;
            } else if let Some(ingest) = ingests.get(&layer.digest) {
                let before = self.offsets.insert(layer.digest.clone(), ingest.offset);
                advanced |= before.is_none_or(|before| ingest.offset > before);
            } else {
                // Aborted, or not started: nothing of it counts.
                self.offsets.remove(&layer.digest);
            }
        }
        if advanced {
            self.last_advance = now;
        }
        self.progress()
    }

    /// What is done so far.
    pub fn progress(&self) -> Progress {
        Progress {
            bytes_done: self.layers.iter().map(|layer| self.bytes_done(layer)).sum(),
            bytes_total: self.layers.iter().map(|layer| layer.size).sum(),
            layers_done: self.done.len(),
            layers_total: self.layers.len(),
        }
    }

    /// Each layer it fetches so far, in the manifest's order (the first [`MOST_LAYERS`]).
    pub fn layers(&self) -> Arc<[LayerFacts]> {
        self.layers
            .iter()
            .zip(&self.named)
            .map(|(layer, digest)| LayerFacts {
                digest: digest.clone(),
                size: layer.size,
                bytes_done: self.bytes_done(layer),
                done: self.done.contains(&layer.digest),
            })
            .collect()
    }

    fn bytes_done(&self, layer: &Layer) -> u64 {
        match self.done.contains(&layer.digest) {
            true => layer.size,
            false => self.offsets.get(&layer.digest).copied().unwrap_or(0).min(layer.size),
        }
    }

    /// Whether the pull is downloading (a layer of it has an ingest) and no byte of it moved for
    /// `timeout`. A pull with nothing downloading (resolving, waiting for another pull's lock,
    /// unpacking) never stalls, as containerd 1.7's own check.
    pub fn stalled(&self, now: Instant, timeout: Duration) -> bool {
        !self.offsets.is_empty() && now.saturating_duration_since(self.last_advance) >= timeout
    }
}

/// Bytes a second over the last [`RateWindow::SPAN`]: smooth enough to read, quick to follow a
/// change of pace.
#[derive(Debug, Default)]
pub struct RateWindow {
    samples: VecDeque<(Instant, u64)>,
}

impl RateWindow {
    pub const SPAN: Duration = Duration::from_secs(2);

    /// Adds that `bytes` were done at `now`, and returns the rate; 0 until two samples apart.
    pub fn sample(&mut self, now: Instant, bytes: u64) -> u64 {
        self.samples.push_back((now, bytes));
        // Keep one sample at or beyond the span, so the window covers all of it.
        while self.samples.get(1).is_some_and(|(at, _)| now.saturating_duration_since(*at) >= Self::SPAN) {
            self.samples.pop_front();
        }
        let Some(&(first_at, first_bytes)) = self.samples.front() else { return 0 };
        let elapsed = now.saturating_duration_since(first_at).as_secs_f64();
        if elapsed <= 0.0 {
            return 0;
        }
        (bytes.saturating_sub(first_bytes) as f64 / elapsed) as u64
    }
}

/// The registry host as containerd's source labels name it: without its port (or brackets).
pub fn host_without_port(domain: &str) -> &str {
    if let Some(bracketed) = domain.strip_prefix('[') {
        return bracketed.split_once(']').map_or(domain, |(host, _)| host);
    }
    match domain.rsplit_once(':') {
        Some((host, port)) if !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) => host,
        _ => domain,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn digest(n: u8) -> String {
        format!("sha256:{}", format!("{n:02x}").repeat(32))
    }

    fn layers(sizes: &[(u8, u64)]) -> Vec<Layer> {
        sizes.iter().map(|(n, size)| Layer { digest: digest(*n), size: *size }).collect()
    }

    fn listed(ingests: &[(u8, u64, u64)]) -> HashMap<String, Ingest> {
        ingests.iter().map(|(n, offset, total)| (digest(*n), Ingest { offset: *offset, total: *total })).collect()
    }

    #[test]
    fn a_manifest_names_its_layers_and_anything_else_names_none() {
        let manifest = format!(
            r#"{{"schemaVersion":2,"config":{{"digest":"{}","size":7}},"layers":[{{"digest":"{}","size":4096}},{{"digest":"{}","size":12}}]}}"#,
            digest(9),
            digest(1),
            digest(2)
        );
        assert_eq!(manifest_layers(manifest.as_bytes()), Some(layers(&[(1, 4096), (2, 12)])));
        let index = r#"{"schemaVersion":2,"manifests":[{"digest":"sha256:00","size":1}]}"#;
        for other in [index.as_bytes(), b"not json", br#"{"layers":[{"size":1}]}"#] {
            assert_eq!(manifest_layers(other), None, "{}", String::from_utf8_lossy(other));
        }
    }

    #[test]
    fn the_rate_is_over_the_last_two_seconds() {
        let start = Instant::now();
        let at = |millis: u64| start + Duration::from_millis(millis);
        let mut rate = RateWindow::default();
        assert_eq!(rate.sample(at(0), 0), 0, "one sample has no rate");
        assert_eq!(rate.sample(at(500), MIB), 2 * MIB);
        assert_eq!(rate.sample(at(2000), 4 * MIB), 2 * MIB);
        // The pace drops: the first sample leaves the window, the rate follows within it.
        assert_eq!(rate.sample(at(3000), 4 * MIB), 6 * MIB / 5, "3 MiB over the 2.5 s since the oldest kept");
        assert_eq!(rate.sample(at(5000), 4 * MIB), 0, "nothing in the last two seconds");
    }

    #[test]
    fn an_ingest_ref_names_its_digest() {
        let hex = "ab".repeat(32);
        assert_eq!(digest_of_ref(&format!("layer-sha256:{hex}")), Some(format!("sha256:{hex}").as_str()));
        assert_eq!(digest_of_ref(&format!("manifest-app:v1@sha256:{hex}")), Some(format!("sha256:{hex}").as_str()));
        for bad in ["layer", "layer-", "layer-sha256:", "layer-sha256:xyz", "layer-SHA256:ab", "nodash"] {
            assert_eq!(digest_of_ref(bad), None, "{bad}");
        }
    }

    #[test]
    fn progress_rises_as_ingests_advance_and_layers_commit() {
        let start = Instant::now();
        let present = HashSet::from([digest(3)]);
        let mut pull = PullProgress::new(layers(&[(1, 4 * MIB), (2, 2 * MIB), (3, 8 * MIB)]), &present, start);
        let nothing = pull.observe(&listed(&[]), &HashSet::new(), start);
        assert_eq!(
            nothing,
            Progress { bytes_done: 0, bytes_total: 6 * MIB, layers_done: 0, layers_total: 2 },
            "layer 3 is there"
        );
        let one = pull.observe(&listed(&[(1, MIB, 4 * MIB), (2, 2 * MIB, 2 * MIB)]), &HashSet::new(), start);
        assert_eq!(one.bytes_done, 3 * MIB);
        // Layer 2's ingest vanished: the caller asks the store, which has it.
        let now = listed(&[(1, 3 * MIB, 4 * MIB)]);
        assert_eq!(pull.vanished(&now), [digest(2)]);
        let two = pull.observe(&now, &HashSet::from([digest(2)]), start);
        assert_eq!((two.bytes_done, two.layers_done), (5 * MIB, 1));
        let all = pull.observe(&listed(&[]), &HashSet::from([digest(1)]), start);
        assert_eq!(all, Progress { bytes_done: 6 * MIB, bytes_total: 6 * MIB, layers_done: 2, layers_total: 2 });
    }

    #[test]
    fn each_layer_fetched_is_told_in_the_manifests_order_the_first_64() {
        let start = Instant::now();
        let present = HashSet::from([digest(2)]);
        let mut pull = PullProgress::new(layers(&[(3, 4 * MIB), (2, MIB), (1, 2 * MIB)]), &present, start);
        pull.observe(&listed(&[(3, MIB, 4 * MIB)]), &HashSet::from([digest(1)]), start);
        let told: Vec<(String, u64, u64, bool)> = pull
            .layers()
            .iter()
            .map(|layer| (layer.digest.to_string(), layer.size, layer.bytes_done, layer.done))
            .collect();
        assert_eq!(told, [(digest(3), 4 * MIB, MIB, false), (digest(1), 2 * MIB, 2 * MIB, true)], "layer 2 was there");
        let many: Vec<(u8, u64)> = (0..100).map(|n| (n, MIB)).collect();
        let big = PullProgress::new(layers(&many), &HashSet::new(), start);
        assert_eq!(big.layers().len(), MOST_LAYERS);
        assert_eq!(big.progress().layers_total, 100, "the totals count every layer");
        assert_eq!(big.layers()[63].digest.as_ref(), digest(63));
    }

    #[test]
    fn an_aborted_layer_counts_nothing_and_a_shared_one_counts_for_each_pull() {
        let start = Instant::now();
        let mut first = PullProgress::new(layers(&[(1, 4 * MIB), (2, 4 * MIB)]), &HashSet::new(), start);
        let mut second = PullProgress::new(layers(&[(2, 4 * MIB), (5, MIB)]), &HashSet::new(), start);
        let ingests = listed(&[(1, 2 * MIB, 4 * MIB), (2, MIB, 4 * MIB)]);
        assert_eq!(first.observe(&ingests, &HashSet::new(), start).bytes_done, 3 * MIB);
        assert_eq!(second.observe(&ingests, &HashSet::new(), start).bytes_done, MIB, "its share of layer 2");
        // Layer 1 vanished and the store does not have it: aborted.
        assert_eq!(first.observe(&listed(&[(2, MIB, 4 * MIB)]), &HashSet::new(), start).bytes_done, MIB);
    }

    #[test]
    fn a_pull_stalls_only_while_downloading_with_nothing_moving() {
        let start = Instant::now();
        let timeout = Duration::from_secs(30);
        let mut pull = PullProgress::new(layers(&[(1, 4 * MIB)]), &HashSet::new(), start);
        pull.observe(&listed(&[]), &HashSet::new(), start + Duration::from_secs(60));
        assert!(
            !pull.stalled(start + Duration::from_secs(60), timeout),
            "nothing downloading yet (resolving, or waiting)"
        );
        pull.observe(&listed(&[(1, MIB, 4 * MIB)]), &HashSet::new(), start + Duration::from_secs(61));
        pull.observe(&listed(&[(1, MIB, 4 * MIB)]), &HashSet::new(), start + Duration::from_secs(90));
        assert!(!pull.stalled(start + Duration::from_secs(90), timeout), "29 s without a byte");
        pull.observe(&listed(&[(1, MIB, 4 * MIB)]), &HashSet::new(), start + Duration::from_secs(91));
        assert!(pull.stalled(start + Duration::from_secs(91), timeout), "30 s without a byte");
        pull.observe(&listed(&[(1, 2 * MIB, 4 * MIB)]), &HashSet::new(), start + Duration::from_secs(92));
        assert!(!pull.stalled(start + Duration::from_secs(92), timeout), "a step resets it");
    }
}
