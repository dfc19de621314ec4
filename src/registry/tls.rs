//! TLS to a registry, as containerd's Go client makes it: the system's roots (the bundle Go reads:
//! `SSL_CERT_FILE`, else the first of the distributions' bundle files), plus a host's `ca` from its
//! hosts.toml, or no verification at all where hosts.toml says `skip_verify`. The bundle is read
//! once, at the first HTTPS connection (never on a presence answer's path), and each host's client
//! config is built once and kept with the host.

use std::{path::Path, sync::Arc};

use rustls::{
    ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
    client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier},
    crypto::CryptoProvider,
    pki_types::{CertificateDer, ServerName, UnixTime, pem::PemObject},
};
use tokio::{net::TcpStream, sync::OnceCell};
use tokio_rustls::{TlsConnector, client::TlsStream};

use crate::files::read_named;

/// Go's bundle files on Linux (crypto/x509's root_linux.go), in its order; the first that reads is
/// the system's roots.
const BUNDLES: [&str; 6] = [
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/ca-bundle.pem",
    "/etc/pki/tls/cacert.pem",
    "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
    "/etc/ssl/cert.pem",
];
/// A bundle is a few hundred KiB; a CA file a few KiB.
const BUNDLE_LIMIT: u64 = 4 << 20;
pub const CA_FILE_LIMIT: u64 = 1 << 20;

/// Why a TLS connection was not made.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The host's TLS settings could not be used (a `ca` that did not read), said at each use.
    #[error("{0}")]
    Settings(String),
    #[error("{0:?} is not a name a certificate can be checked against")]
    ServerName(String),
    #[error("TLS handshake: {0}")]
    Handshake(std::io::Error),
}

/// How one host's certificate is checked.
#[derive(Debug, Default)]
pub struct Tls {
    /// CA certificates trusted besides the system's (hosts.toml `ca`).
    cas: Vec<CertificateDer<'static>>,
    skip_verify: bool,
    /// Why these settings cannot be used, when they cannot.
    broken: Option<String>,
    config: OnceCell<Arc<ClientConfig>>,
}

impl Tls {
    /// The system's roots only: every host without TLS settings of its own shares it.
    pub fn system() -> Arc<Self> {
        static SYSTEM: std::sync::LazyLock<Arc<Tls>> = std::sync::LazyLock::new(Arc::default);
        SYSTEM.clone()
    }

    /// The system's roots and `cas`; or no verification (`skip_verify`); or, `broken`, a reason
    /// every connection fails with.
    pub fn new(cas: Vec<CertificateDer<'static>>, skip_verify: bool, broken: Option<String>) -> Self {
        Self { cas, skip_verify, broken, config: OnceCell::new() }
    }

    /// Why these settings cannot be used, if they cannot.
    pub fn broken(&self) -> Option<&str> {
        self.broken.as_deref()
    }

    /// Whether these are the system's roots alone, shared by every such host.
    pub fn is_system(self: &Arc<Self>) -> bool {
        Arc::ptr_eq(self, &Self::system())
    }

    /// TLS over `stream` to `host` (a name, or an IP address the certificate must name).
    pub async fn connect(&self, stream: TcpStream, host: &str) -> Result<TlsStream<TcpStream>, TlsError> {
        if let Some(broken) = &self.broken {
            return Err(TlsError::Settings(broken.clone()));
        }
        let config = self.config.get_or_try_init(|| self.build()).await?.clone();
        let name = ServerName::try_from(host.to_owned()).map_err(|_| TlsError::ServerName(host.to_owned()))?;
        TlsConnector::from(config).connect(name, stream).await.map_err(TlsError::Handshake)
    }

    async fn build(&self) -> Result<Arc<ClientConfig>, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|error| TlsError::Settings(error.to_string()))?;
        let mut config = if self.skip_verify {
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(NoVerification(provider)))
                .with_no_client_auth()
        } else {
            let mut roots = RootCertStore { roots: system_roots().await.roots.clone() };
            roots.add_parsable_certificates(self.cas.iter().cloned());
            builder.with_root_certificates(roots).with_no_client_auth()
        };
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }
}

/// The system's roots, read once (off the async threads).
async fn system_roots() -> &'static RootCertStore {
    static ROOTS: OnceCell<RootCertStore> = OnceCell::const_new();
    ROOTS
        .get_or_init(|| async {
            let read = tokio::task::spawn_blocking(read_system_bundle).await;
            let mut roots = RootCertStore::empty();
            match read {
                Ok(Ok((path, certificates))) => {
                    let (added, _) = roots.add_parsable_certificates(certificates);
                    tracing::debug!(bundle = %path, added, "read the system's CA certificates");
                }
                Ok(Err(reason)) => {
                    tracing::warn!(%reason, "no system CA certificates: only hosts.toml `ca` is trusted")
                }
                Err(_) => {}
            }
            roots
        })
        .await
}

/// `SSL_CERT_FILE`, else the first bundle file that reads; its path and its certificates.
fn read_system_bundle() -> Result<(String, Vec<CertificateDer<'static>>), String> {
    let from_env = std::env::var("SSL_CERT_FILE").ok().filter(|path| !path.is_empty());
    let candidates: Vec<String> = match from_env {
        Some(path) => vec![path],
        None => BUNDLES.iter().map(|path| (*path).to_owned()).collect(),
    };
    for path in &candidates {
        match read_named(Path::new(path), BUNDLE_LIMIT) {
            Ok(bytes) => return Ok((path.clone(), pem_certificates(&bytes))),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => continue,
            Err(error) => return Err(format!("{path}: {error}")),
        }
    }
    Err(format!("none of {} reads", candidates.join(", ")))
}

/// The certificates of a PEM file (other blocks, and blocks that do not decode, passed over).
pub fn pem_certificates(bytes: &[u8]) -> Vec<CertificateDer<'static>> {
    CertificateDer::pem_slice_iter(bytes).filter_map(Result::ok).collect()
}

/// hosts.toml's `skip_verify`: any certificate, any name; the handshake's own signature is still
/// checked, so the session is with whoever holds the key of the certificate sent.
#[derive(Debug)]
struct NoVerification(Arc<CryptoProvider>);

impl ServerCertVerifier for NoVerification {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
