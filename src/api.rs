//! The generated `imagemanager.v1` API and its descriptors for reflection.

tonic::include_proto!("imagemanager.v1");

/// Descriptors of our API and everything it imports (the CRI, google.protobuf).
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("imagemanager_descriptor");
