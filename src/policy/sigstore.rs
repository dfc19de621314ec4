//! STUB until the verification core lands (wt-b).
#![allow(dead_code, unused_variables)]
use super::SigstoreSigned;
use crate::reference::ImageReference;

pub const MANIFEST_LIMIT: usize = 4 << 20;
pub const PAYLOAD_LIMIT: usize = 64 << 10;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadedSigstore(pub SigstoreSigned);
#[derive(Debug, Clone)]
pub struct Layer {
    pub digest: String,
    pub size: u64,
}
#[derive(Debug, thiserror::Error)]
#[error("bad")]
pub struct ArtifactError;
pub fn parse_signature_manifest(bytes: &[u8]) -> Result<Vec<Layer>, ArtifactError> {
    Err(ArtifactError)
}
pub struct Accepted {
    pub key: String,
    pub signature: String,
}
#[derive(Debug, thiserror::Error)]
#[error("rejected")]
pub struct Rejected;
pub fn verify(
    requirement: &LoadedSigstore,
    image: &ImageReference,
    digest: &str,
    signatures: &[(Layer, Vec<u8>)],
) -> Result<Accepted, Rejected> {
    Err(Rejected)
}
