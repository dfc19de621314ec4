//! Image references in the distribution/reference grammar, and the kubelet's default tag.
//!
//! ```text
//! reference   := name [ ":" tag ] [ "@" digest ]
//! name        := [domain '/'] remote-name
//! domain      := (domain-name | '[' ipv6 ']') [':' port]
//! remote-name := path-component ['/' path-component]*
//! path-component := [a-z0-9]+ (separator [a-z0-9]+)*   separator := [_.] | __ | -+
//! tag         := [\w][\w.-]{0,127}
//! digest      := algorithm ':' hex{32,}
//! ```
//! Errors carry the Go package's words, so users see what they would see from the kubelet.

use std::fmt;

/// Longest repository path the grammar accepts; since distribution/reference v0.6.0 the domain
/// does not count.
const NAME_TOTAL_LENGTH_MAX: usize = 255;
/// Longest tag the grammar accepts.
const TAG_LENGTH_MAX: usize = 128;
/// Longest reference accepted, in bytes. The grammar bounds the path and the tag, not the domain:
/// ours does. A 253-byte host with its port, a 255-byte path, a tag and a sha512 digest fit.
pub const REFERENCE_LENGTH_MAX: usize = 1024;
/// The domain short names resolve to.
const DEFAULT_DOMAIN: &str = "docker.io";
/// The old spelling of [`DEFAULT_DOMAIN`], normalised to it.
const LEGACY_DEFAULT_DOMAIN: &str = "index.docker.io";
/// Official images live under this path on the default domain.
const OFFICIAL_REPO_PREFIX: &str = "library/";
/// The tag the kubelet applies when a reference has neither tag nor digest.
pub const DEFAULT_TAG: &str = "latest";

/// Why a string is not an image reference, in distribution/reference's and go-digest's words.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReferenceError {
    #[error("invalid reference format")]
    InvalidFormat,
    #[error("invalid tag format")]
    InvalidTag,
    #[error("invalid digest format")]
    InvalidDigest,
    #[error("invalid reference format: repository name must be lowercase")]
    ContainsUppercase,
    #[error("repository name must have at least one component")]
    NameEmpty,
    #[error("repository name must not be more than 255 characters")]
    NameTooLong,
    #[error("invalid reference format: {0} bytes, more than {REFERENCE_LENGTH_MAX}")]
    TooLong(usize),
    #[error("invalid reference format: repository name ({0}) must be lowercase")]
    RemoteNameNotLowercase(String),
    #[error("invalid repository name ({0}), cannot specify 64-byte hexadecimal strings")]
    HexIdentifier(String),
    #[error("unsupported digest algorithm")]
    UnsupportedDigestAlgorithm,
    #[error("invalid checksum digest length")]
    InvalidDigestLength,
    #[error("invalid checksum digest format")]
    InvalidDigestChars,
}

/// A parsed image reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageReference {
    domain: String,
    path: String,
    tag: Option<String>,
    digest: Option<String>,
}

impl ImageReference {
    /// Parses without normalising (Go's `reference.Parse`): a name with no domain keeps domain "".
    pub fn parse(s: &str) -> Result<Self, ReferenceError> {
        if s.len() > REFERENCE_LENGTH_MAX {
            return Err(ReferenceError::TooLong(s.len()));
        }
        let Some(parts) = split_reference(s) else {
            return Err(if s.is_empty() {
                ReferenceError::NameEmpty
            } else if split_reference(&s.to_lowercase()).is_some() {
                ReferenceError::ContainsUppercase
            } else {
                ReferenceError::InvalidFormat
            });
        };
        if parts.path.len() > NAME_TOTAL_LENGTH_MAX {
            return Err(ReferenceError::NameTooLong);
        }
        if let Some(digest) = parts.digest {
            validate_digest(digest)?;
        }
        Ok(Self {
            domain: parts.domain.to_owned(),
            path: parts.path.to_owned(),
            tag: parts.tag.map(str::to_owned),
            digest: parts.digest.map(str::to_owned),
        })
    }

    /// Parses a familiar name (Go's `reference.ParseNormalizedNamed`): short names get the
    /// `docker.io` domain and official images the `library/` prefix.
    pub fn parse_normalized(s: &str) -> Result<Self, ReferenceError> {
        if s.len() > REFERENCE_LENGTH_MAX {
            return Err(ReferenceError::TooLong(s.len()));
        }
        if is_identifier(s) {
            return Err(ReferenceError::HexIdentifier(s.to_owned()));
        }
        let (domain, remainder) = split_docker_domain(s);
        let remote_name = remainder.split_once(':').map_or(remainder.as_str(), |(name, _)| name);
        if remote_name.to_lowercase() != remote_name {
            return Err(ReferenceError::RemoteNameNotLowercase(remote_name.to_owned()));
        }
        Self::parse(&format!("{domain}/{remainder}"))
    }

    /// The registry host, with its port; "" when [`ImageReference::parse`] saw none.
    pub fn domain(&self) -> &str {
        &self.domain
    }

    /// The repository path within the registry.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Domain and path joined, as Go's `Name()`.
    pub fn name(&self) -> String {
        if self.domain.is_empty() { self.path.clone() } else { format!("{}/{}", self.domain, self.path) }
    }

    /// The tag, if one was written.
    pub fn tag(&self) -> Option<&str> {
        self.tag.as_deref()
    }

    /// The digest (`algorithm:hex`), if one was written.
    pub fn digest(&self) -> Option<&str> {
        self.digest.as_deref()
    }

    /// The name as people write it: without `docker.io/` and, for official images, `library/`.
    pub fn familiar_name(&self) -> String {
        if self.domain != DEFAULT_DOMAIN {
            return self.name();
        }
        match self.path.strip_prefix(OFFICIAL_REPO_PREFIX) {
            Some(rest) if !rest.contains('/') => rest.to_owned(),
            _ => self.path.clone(),
        }
    }
}

impl fmt::Display for ImageReference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())?;
        if let Some(tag) = &self.tag {
            write!(f, ":{tag}")?;
        }
        if let Some(digest) = &self.digest {
            write!(f, "@{digest}")?;
        }
        Ok(())
    }
}

/// The kubelet's `applyDefaultImageTag`: appends `:latest` when the image has neither tag nor
/// digest. It never qualifies a short name, so the runtime keeps deciding what `busybox` means.
pub fn apply_default_tag(image: &str) -> Result<String, ReferenceError> {
    parse_with_default_tag(image).map(|(_, tagged)| tagged)
}

/// `image` as a full reference with the default tag, one spelling for every way of writing it:
/// `busybox`, `busybox:latest` and `docker.io/library/busybox` are all
/// `docker.io/library/busybox:latest`. `None` for what does not parse.
pub fn normalized(image: &str) -> Option<String> {
    parse_with_default_tag(image).ok().map(|(reference, _)| reference.to_string())
}

/// Parses `image` (normalised) and returns it with the default tag applied, both parsed and as
/// written.
pub fn parse_with_default_tag(image: &str) -> Result<(ImageReference, String), ReferenceError> {
    let mut reference = ImageReference::parse_normalized(image)?;
    let tagged = if reference.tag().is_none() && reference.digest().is_none() {
        reference.tag = Some(DEFAULT_TAG.to_owned());
        format!("{image}:{DEFAULT_TAG}")
    } else {
        image.to_owned()
    };
    Ok((reference, tagged))
}

/// The pieces of a string that matches the reference grammar.
struct Parts<'a> {
    domain: &'a str,
    path: &'a str,
    tag: Option<&'a str>,
    digest: Option<&'a str>,
}

/// Splits `s` along the grammar; `None` when any piece does not match it.
fn split_reference(s: &str) -> Option<Parts<'_>> {
    let (rest, digest) = match s.split_once('@') {
        Some((rest, digest)) => (rest, Some(digest)),
        None => (s, None),
    };
    if digest.is_some_and(|d| !is_digest_grammar(d)) {
        return None;
    }
    // A tag follows the first ':' after the last '/'; any earlier ':' belongs to a port.
    let after_slash = rest.rfind('/').map_or(0, |i| i + 1);
    let (name, tag) = match rest[after_slash..].find(':') {
        Some(i) => (&rest[..after_slash + i], Some(&rest[after_slash + i + 1..])),
        None => (rest, None),
    };
    if tag.is_some_and(|t| !is_tag(t)) {
        return None;
    }
    let (domain, path) = match name.split_once('/') {
        Some((domain, path)) if is_domain_and_port(domain) && is_remote_name(path) => (domain, path),
        _ if is_remote_name(name) => ("", name),
        _ => return None,
    };
    Some(Parts { domain, path, tag, digest })
}

/// Go's `splitDockerDomain`: the first component is a domain only when it looks like one.
fn split_docker_domain(name: &str) -> (String, String) {
    let (mut domain, mut remainder) = match name.split_once('/') {
        Some((first, rest)) if first.contains(['.', ':']) || first == "localhost" || first.to_lowercase() != first => {
            (first.to_owned(), rest.to_owned())
        }
        _ => (DEFAULT_DOMAIN.to_owned(), name.to_owned()),
    };
    if domain == LEGACY_DEFAULT_DOMAIN {
        domain = DEFAULT_DOMAIN.to_owned();
    }
    if domain == DEFAULT_DOMAIN && !remainder.contains('/') {
        remainder = format!("{OFFICIAL_REPO_PREFIX}{remainder}");
    }
    (domain, remainder)
}

fn is_remote_name(s: &str) -> bool {
    s.split('/').all(is_path_component)
}

/// `[a-z0-9]+ ( ([_.] | __ | -+) [a-z0-9]+ )*`
fn is_path_component(s: &str) -> bool {
    let alnum = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    let mut rest = s;
    loop {
        let run = rest.find(|c| !alnum(c)).unwrap_or(rest.len());
        if run == 0 {
            return false;
        }
        rest = &rest[run..];
        if rest.is_empty() {
            return true;
        }
        let separator = rest.find(alnum).unwrap_or(rest.len());
        let sep = &rest[..separator];
        let valid = matches!(sep, "." | "_" | "__") || (!sep.is_empty() && sep.bytes().all(|b| b == b'-'));
        if !valid {
            return false;
        }
        rest = &rest[separator..];
    }
}

/// `(domain-name | '[' ipv6 ']') [':' port]`
fn is_domain_and_port(s: &str) -> bool {
    let (host, port) = if s.starts_with('[') {
        match s.find(']') {
            Some(end) => (&s[..=end], s[end + 1..].strip_prefix(':')),
            None => return false,
        }
    } else {
        match s.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (s, None),
        }
    };
    // After a bracketed host only ":port" may follow.
    if s.starts_with('[') && port.is_none() && host.len() != s.len() {
        return false;
    }
    let host_ok = match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        Some(ipv6) => !ipv6.is_empty() && ipv6.chars().all(|c| c.is_ascii_hexdigit() || c == ':'),
        None => host.split('.').all(is_domain_component),
    };
    let port_ok = port.is_none_or(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
    host_ok && port_ok
}

/// `[a-zA-Z0-9]` or `[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9]`
fn is_domain_component(s: &str) -> bool {
    let bytes = s.as_bytes();
    match (bytes.first(), bytes.last()) {
        (Some(first), Some(last)) => {
            first.is_ascii_alphanumeric()
                && last.is_ascii_alphanumeric()
                && bytes.iter().all(|b| b.is_ascii_alphanumeric() || *b == b'-')
        }
        _ => false,
    }
}

/// `[\w][\w.-]{0,127}`
fn is_tag(s: &str) -> bool {
    let word = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let bytes = s.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= TAG_LENGTH_MAX
        && word(bytes[0])
        && bytes.iter().all(|&b| word(b) || b == b'.' || b == b'-')
}

/// `[A-Za-z][A-Za-z0-9]*([-_+.][A-Za-z][A-Za-z0-9]*)* ':' [0-9a-fA-F]{32,}`
fn is_digest_grammar(s: &str) -> bool {
    let Some((algorithm, hex)) = s.split_once(':') else {
        return false;
    };
    let component_ok = |c: &str| {
        let mut chars = c.chars();
        chars.next().is_some_and(|first| first.is_ascii_alphabetic()) && chars.all(|c| c.is_ascii_alphanumeric())
    };
    algorithm.split(['-', '_', '+', '.']).all(component_ok)
        && hex.len() >= 32
        && hex.bytes().all(|b| b.is_ascii_hexdigit())
}

/// go-digest's `Digest.Validate`, for a digest that already matches the grammar.
fn validate_digest(digest: &str) -> Result<(), ReferenceError> {
    let (algorithm, hex) = digest.split_once(':').ok_or(ReferenceError::InvalidDigest)?;
    let hex_len = match algorithm {
        "sha256" => 64,
        "sha384" => 96,
        "sha512" => 128,
        _ => return Err(ReferenceError::UnsupportedDigestAlgorithm),
    };
    if hex.len() != hex_len {
        return Err(ReferenceError::InvalidDigestLength);
    }
    if !hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
        return Err(ReferenceError::InvalidDigestChars);
    }
    Ok(())
}

/// A bare image id: 64 lowercase hex characters.
fn is_identifier(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

#[cfg(test)]
mod tests;
