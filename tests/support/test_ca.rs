//! A test CA and a server certificate it issues, made by `openssl` at test time (never committed):
//! P-256 keys, a day's validity, the leaf naming `localhost` and `127.0.0.1`.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

/// A CA's files: `NAME.pem` (its certificate, what a hosts.toml `ca` names) and `NAME.key`.
pub struct TestCa {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// A server certificate and its key, PEM.
pub struct Leaf {
    pub cert: PathBuf,
    pub key: PathBuf,
}

fn openssl(args: &[&str]) {
    let output = Command::new("openssl").args(args).output().expect("openssl runs");
    assert!(output.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&output.stderr));
}

fn text(path: &Path) -> &str {
    path.to_str().expect("a UTF-8 path")
}

impl TestCa {
    /// A new CA in `dir`, named `name`.
    pub fn new(dir: &Path, name: &str) -> Self {
        let (cert, key) = (dir.join(format!("{name}.pem")), dir.join(format!("{name}.key")));
        let subject = format!("/CN=cri-imaged test CA {name}");
        openssl(&[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-days",
            "1",
            "-subj",
            &subject,
            "-keyout",
            text(&key),
            "-out",
            text(&cert),
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ]);
        Self { cert, key }
    }

    /// A server certificate for `localhost` and `127.0.0.1`, in `dir` as `NAME.crt` and `NAME.key`.
    pub fn leaf(&self, dir: &Path, name: &str) -> Leaf {
        let extensions = [
            "subjectAltName=DNS:localhost,IP:127.0.0.1",
            "basicConstraints=critical,CA:FALSE",
            "extendedKeyUsage=serverAuth",
        ];
        self.issue(dir, name, "/CN=localhost", &extensions.map(str::to_owned))
    }

    /// A certificate for `subject` with `extensions` (openssl's `-addext` values), a day's
    /// validity, a P-256 key: in `dir` as `NAME.crt` and `NAME.key`.
    pub fn issue(&self, dir: &Path, name: &str, subject: &str, extensions: &[String]) -> Leaf {
        let (cert, key) = (dir.join(format!("{name}.crt")), dir.join(format!("{name}.key")));
        let mut args = vec![
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-days",
            "1",
            "-subj",
            subject,
            "-keyout",
            text(&key),
            "-out",
            text(&cert),
            "-CA",
            text(&self.cert),
            "-CAkey",
            text(&self.key),
        ];
        for extension in extensions {
            args.extend(["-addext", extension.as_str()]);
        }
        openssl(&args);
        Leaf { cert, key }
    }

    /// [`TestCa::issue`], for the key of `public` (a PEM public key made elsewhere, cosign's): its
    /// certificate alone, `NAME.crt`, in `dir`.
    pub fn certify(&self, dir: &Path, name: &str, subject: &str, extensions: &[String], public: &Path) -> PathBuf {
        let (cert, request, unused_key, file) = (
            dir.join(format!("{name}.crt")),
            dir.join(format!("{name}.csr")),
            dir.join(format!("{name}.unused.key")),
            dir.join(format!("{name}.ext")),
        );
        // openssl asks a request for a certificate: one signed by a key of its own, whose public
        // key `-force_pubkey` then replaces.
        openssl(&[
            "req",
            "-new",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-subj",
            subject,
            "-keyout",
            text(&unused_key),
            "-out",
            text(&request),
        ]);
        std::fs::write(&file, extensions.join("\n")).expect("extensions");
        openssl(&[
            "x509",
            "-req",
            "-in",
            text(&request),
            "-CA",
            text(&self.cert),
            "-CAkey",
            text(&self.key),
            "-force_pubkey",
            text(public),
            "-days",
            "1",
            "-extfile",
            text(&file),
            "-out",
            text(&cert),
        ]);
        cert
    }
}
