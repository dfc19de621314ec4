//! Images of a given size and layer count, described in memory and streamed out in seconds even
//! at 1 GB: nothing of their bulk is ever stored before it is sent.
//!
//! Each layer is an uncompressed tar (`application/vnd.oci.image.layer.v1.tar`, so every byte
//! crosses the wire as it is): a file of zeros, then a small file naming the image and layer,
//! which makes every layer distinct. The zeros come first so that the SHA-256 state after them is
//! the same for every layer of that size: it is computed once per size and cloned, and only the
//! distinct tail is hashed per layer.
//!
//! (skopeo cannot push such an image as it is: it gzips every uncompressed layer it sends to a
//! registry, and zeros would then cross the link as a few kilobytes. `support::netrig` pushes it
//! over the registry API itself.)

use std::{
    collections::HashMap,
    io::{self, Write},
    sync::{Mutex, OnceLock},
};

use serde_json::json;
use sha2::{Digest, Sha256};

/// The media type of an uncompressed layer.
pub const UNCOMPRESSED_LAYER: &str = "application/vnd.oci.image.layer.v1.tar";
/// The media type of an OCI manifest.
pub const MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const BLOCK: usize = 512;
static ZEROS: [u8; 1 << 16] = [0; 1 << 16];

/// One layer: a tar of `zeros` zero bytes (`data`) and a distinct tail (`tag-of-layer`).
pub struct Layer {
    /// `sha256:…` of the tar, which is also its diff id (it is not compressed).
    pub digest: String,
    /// The tar's size in bytes.
    pub size: u64,
    zeros: u64,
    tail: Vec<u8>,
}

impl Layer {
    fn new(zeros: u64, label: &str) -> Self {
        let mut tail = header("tag-of-layer", label.len() as u64).to_vec();
        tail.extend(label.as_bytes());
        tail.resize(tail.len().next_multiple_of(BLOCK), 0);
        tail.extend([0u8; 2 * BLOCK]);
        let mut hasher = hashed_zeros(zeros);
        hasher.update(&tail);
        let digest = format!("sha256:{}", hex(&hasher.finalize()));
        let size = BLOCK as u64 + zeros.next_multiple_of(BLOCK as u64) + tail.len() as u64;
        Self { digest, size, zeros, tail }
    }

    /// Writes the tar to `out`.
    pub fn write_to(&self, out: &mut dyn Write) -> io::Result<()> {
        out.write_all(&header("data", self.zeros))?;
        let mut left = self.zeros.next_multiple_of(BLOCK as u64);
        while left > 0 {
            let take = left.min(ZEROS.len() as u64) as usize;
            out.write_all(&ZEROS[..take])?;
            left -= take as u64;
        }
        out.write_all(&self.tail)
    }
}

/// A whole image: its layers, its config and its manifest.
pub struct Image {
    pub layers: Vec<Layer>,
    /// The config's JSON and its digest.
    pub config: (Vec<u8>, String),
    /// The manifest's JSON (media type [`MANIFEST`]) and its digest.
    pub manifest: (Vec<u8>, String),
}

impl Image {
    /// An image of `layers` layers holding `bytes` in all (each layer's share of zeros plus about
    /// 2 KiB of tar); `label` goes into every layer, so that two images are never the same.
    pub fn new(label: &str, bytes: u64, layers: usize) -> Self {
        assert!(layers > 0, "an image has at least one layer");
        let share = bytes / layers as u64;
        let layers: Vec<Layer> =
            (0..layers).map(|index| Layer::new(share, &format!("{label} layer {index}\n"))).collect();
        let (os, architecture) = platform();
        let config = json!({
            "architecture": architecture,
            "os": os,
            "config": {},
            "rootfs": {"type": "layers", "diff_ids": layers.iter().map(|layer| &layer.digest).collect::<Vec<_>>()},
        });
        let config = with_digest(serde_json::to_vec(&config).expect("a JSON config"));
        let manifest = json!({
            "schemaVersion": 2,
            "mediaType": MANIFEST,
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config.1, "size": config.0.len()},
            "layers": layers
                .iter()
                .map(|layer| json!({"mediaType": UNCOMPRESSED_LAYER, "digest": layer.digest, "size": layer.size}))
                .collect::<Vec<_>>(),
        });
        let manifest = with_digest(serde_json::to_vec(&manifest).expect("a JSON manifest"));
        Self { layers, config, manifest }
    }

    /// Every byte of the image: layers, config and manifest.
    pub fn size(&self) -> u64 {
        self.layers.iter().map(|layer| layer.size).sum::<u64>() + (self.config.0.len() + self.manifest.0.len()) as u64
    }
}

fn with_digest(bytes: Vec<u8>) -> (Vec<u8>, String) {
    let digest = format!("sha256:{}", hex(&Sha256::digest(&bytes)));
    (bytes, digest)
}

/// The (os, architecture) of images for this machine, as OCI names them.
fn platform() -> (&'static str, &'static str) {
    let architecture = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        other => other,
    };
    ("linux", architecture)
}

/// The SHA-256 state after a `data` header for `zeros` bytes and those zeros padded to a block;
/// computed once per size.
fn hashed_zeros(zeros: u64) -> Sha256 {
    static STATES: OnceLock<Mutex<HashMap<u64, Sha256>>> = OnceLock::new();
    let states = STATES.get_or_init(Default::default);
    let mut states = states.lock().expect("hash state cache");
    states
        .entry(zeros)
        .or_insert_with(|| {
            let mut hasher = Sha256::new();
            hasher.update(header("data", zeros));
            let chunk = vec![0u8; 1 << 20];
            let mut left = zeros.next_multiple_of(BLOCK as u64);
            while left > 0 {
                let take = left.min(chunk.len() as u64) as usize;
                hasher.update(&chunk[..take]);
                left -= take as u64;
            }
            hasher
        })
        .clone()
}

/// A ustar header for a regular file `name` of `size` bytes: mode 0644, owner 0, mtime 0.
fn header(name: &str, size: u64) -> [u8; BLOCK] {
    assert!(name.len() < 100 && size < 1 << 33, "a short name and under 8 GiB");
    let mut block = [0u8; BLOCK];
    let mut put = |offset: usize, value: &[u8]| block[offset..offset + value.len()].copy_from_slice(value);
    put(0, name.as_bytes());
    put(100, b"0000644\0");
    put(108, b"0000000\0");
    put(116, b"0000000\0");
    put(124, format!("{size:011o}\0").as_bytes());
    put(136, b"00000000000\0");
    put(156, b"0");
    put(257, b"ustar\0");
    put(263, b"00");
    // The checksum is summed with its own field as spaces.
    block[148..156].fill(b' ');
    let sum: u32 = block.iter().map(|byte| u32::from(*byte)).sum();
    block[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    block
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}
