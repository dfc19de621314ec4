//! Pushes an [`Image`] to a registry over its HTTP API (distribution v2, plain HTTP): each blob in
//! one monolithic upload (`POST …/blobs/uploads/`, then `PUT <location>&digest=…` with the whole
//! blob), then the manifest by tag. Blocking; one connection per request.

use std::{
    io::{self, BufRead, BufReader, Read, Write},
    net::{SocketAddr, TcpStream},
};

use super::oci_image::{Image, MANIFEST};

/// Pushes `image` as `repository:tag` to the registry at `registry`; returns the manifest digest
/// the registry answered with.
pub fn push(registry: SocketAddr, repository: &str, tag: &str, image: &Image) -> io::Result<String> {
    for layer in &image.layers {
        upload(registry, repository, &layer.digest, layer.size, &mut |out| layer.write_to(out))?;
    }
    let (config, config_digest) = &image.config;
    upload(registry, repository, config_digest, config.len() as u64, &mut |out| out.write_all(config))?;
    let (manifest, _) = &image.manifest;
    let path = format!("/v2/{repository}/manifests/{tag}");
    let answer = request(registry, "PUT", &path, MANIFEST, manifest.len() as u64, &mut |out| out.write_all(manifest))?;
    answer.expect(201, "PUT manifest")?;
    answer.header("docker-content-digest").ok_or_else(|| io::Error::other("no Docker-Content-Digest for the manifest"))
}

/// Uploads one blob of `size` bytes, written by `body`.
fn upload(
    registry: SocketAddr,
    repository: &str,
    digest: &str,
    size: u64,
    body: &mut dyn FnMut(&mut dyn Write) -> io::Result<()>,
) -> io::Result<()> {
    let started = request(registry, "POST", &format!("/v2/{repository}/blobs/uploads/"), "", 0, &mut |_| Ok(()))?;
    started.expect(202, "POST blob upload")?;
    let location = started.header("location").ok_or_else(|| io::Error::other("an upload without a Location"))?;
    // The registry answers with an absolute URL; the request needs its path and query.
    let path = match location.split_once("://") {
        Some((_, rest)) => rest.find('/').map_or("/".to_owned(), |slash| rest[slash..].to_owned()),
        None => location,
    };
    let separator = if path.contains('?') { '&' } else { '?' };
    let path = format!("{path}{separator}digest={digest}");
    let answer = request(registry, "PUT", &path, "application/octet-stream", size, body)?;
    answer.expect(201, "PUT blob")
}

/// A response: its status and headers (names lower-cased), its body read and dropped.
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<String> {
        self.headers.iter().find(|(key, _)| key == name).map(|(_, value)| value.clone())
    }

    fn expect(&self, status: u16, what: &str) -> io::Result<()> {
        if self.status == status {
            Ok(())
        } else {
            Err(io::Error::other(format!("{what}: {} {}", self.status, self.body)))
        }
    }
}

/// One request on a fresh connection (closed after it).
fn request(
    registry: SocketAddr,
    method: &str,
    path: &str,
    content_type: &str,
    length: u64,
    body: &mut dyn FnMut(&mut dyn Write) -> io::Result<()>,
) -> io::Result<Answer> {
    let stream = TcpStream::connect(registry)?;
    let mut out = io::BufWriter::with_capacity(1 << 20, stream.try_clone()?);
    write!(out, "{method} {path} HTTP/1.1\r\nHost: {registry}\r\nConnection: close\r\nContent-Length: {length}\r\n")?;
    if !content_type.is_empty() {
        write!(out, "Content-Type: {content_type}\r\n")?;
    }
    out.write_all(b"\r\n")?;
    body(&mut out)?;
    out.flush()?;
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let status = line.split_whitespace().nth(1).and_then(|code| code.parse().ok());
    let status = status.ok_or_else(|| io::Error::other(format!("not an HTTP answer: {line:?}")))?;
    let mut headers = Vec::new();
    loop {
        line.clear();
        if reader.read_line(&mut line)? == 0 || line.trim_end().is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            headers.push((name.trim().to_lowercase(), value.trim().to_owned()));
        }
    }
    let mut body = String::new();
    reader.read_to_string(&mut body)?;
    Ok(Answer { status, headers, body })
}

/// Pushes `blobs` and then `manifest` (of `media_type`) as `repository:tag`, as an artifact
/// (a signature) is pushed; returns the manifest digest the registry answered with.
pub fn push_raw(
    registry: SocketAddr,
    repository: &str,
    tag: &str,
    blobs: &[&[u8]],
    manifest: &[u8],
    media_type: &str,
) -> io::Result<String> {
    for blob in blobs {
        let digest = sha256_digest(blob);
        upload(registry, repository, &digest, blob.len() as u64, &mut |out| out.write_all(blob))?;
    }
    let path = format!("/v2/{repository}/manifests/{tag}");
    let answer =
        request(registry, "PUT", &path, media_type, manifest.len() as u64, &mut |out| out.write_all(manifest))?;
    answer.expect(201, "PUT manifest")?;
    answer.header("docker-content-digest").ok_or_else(|| io::Error::other("no Docker-Content-Digest for the manifest"))
}

/// GET `path` with `accept`: the status and the body.
pub fn fetch(registry: SocketAddr, path: &str, accept: &str) -> io::Result<(u16, Vec<u8>)> {
    let stream = TcpStream::connect(registry)?;
    let mut out = stream.try_clone()?;
    write!(out, "GET {path} HTTP/1.1\r\nHost: {registry}\r\nConnection: close\r\nAccept: {accept}\r\n\r\n")?;
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let status = line.split_whitespace().nth(1).and_then(|code| code.parse().ok()).unwrap_or(0);
    loop {
        line.clear();
        if reader.read_line(&mut line)? == 0 || line.trim_end().is_empty() {
            break;
        }
    }
    let mut body = Vec::new();
    reader.read_to_end(&mut body)?;
    Ok((status, body))
}

/// `sha256:<hex>` of `bytes`.
pub fn sha256_digest(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    let hash = sha2::Sha256::digest(bytes);
    format!("sha256:{}", hash.iter().map(|byte| format!("{byte:02x}")).collect::<String>())
}
