//! Just enough of Go's `net/url` parsing for registry keys and image names: the host (with its
//! port) and the unescaped path of `https://` + the text, refusing what Go refuses.

use std::ops::Range;

/// A URL without a scheme: `host[:port][/path]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemelessUrl {
    /// The host with its port, as written.
    host: String,
    /// Where the name (without brackets and port) and the port are in `host`.
    name: Range<usize>,
    port: Range<usize>,
    path: String,
}

impl SchemelessUrl {
    /// Parses `text` as if `https://` came before it.
    pub fn parse(text: &str) -> Option<Self> {
        Self::parse_authority_and_path(text)
    }

    /// Parses `text`, which starts with `http://` or `https://`.
    pub fn parse_with_scheme(text: &str) -> Option<Self> {
        let rest = text.strip_prefix("https://").or_else(|| text.strip_prefix("http://"))?;
        Self::parse_authority_and_path(rest)
    }

    fn parse_authority_and_path(text: &str) -> Option<Self> {
        if text.bytes().any(|byte| byte < 0x20 || byte == 0x7f) {
            return None;
        }
        let text = text.split_once('#').map_or(text, |(before, _)| before);
        let text = text.split_once('?').map_or(text, |(before, _)| before);
        let (authority, path) = text.find('/').map_or((text, ""), |slash| text.split_at(slash));
        // Credentials in the authority (`user:pass@host`) are not part of the host.
        let host = authority
            .rsplit_once('@')
            .map_or(authority, |(userinfo, host)| if userinfo.bytes().all(valid_userinfo_byte) { host } else { "\0" });
        if !valid_host(host) {
            return None;
        }
        let path = unescape_path(path)?;
        let (name, port) = split_host_port(host).unwrap_or((host, ""));
        let within = |part: &str| {
            let start = part.as_ptr() as usize - host.as_ptr() as usize;
            start..start + part.len()
        };
        let (name, port) = (within(name), if port.is_empty() { 0..0 } else { within(port) });
        Some(Self { host: host.to_owned(), name, port, path })
    }

    /// The host's dot-separated labels, without the port.
    fn labels(&self) -> std::str::Split<'_, char> {
        self.host[self.name.clone()].split('.')
    }

    fn port(&self) -> &str {
        &self.host[self.port.clone()]
    }

    /// The host's name (without brackets) and its port, when no label is a glob: then it matches
    /// only targets with the same two.
    pub fn literal_name_and_port(&self) -> Option<(&str, &str)> {
        let name = &self.host[self.name.clone()];
        super::glob::is_literal(name).then(|| (name, self.port()))
    }

    /// The host with its port.
    pub fn host(&self) -> &str {
        &self.host
    }

    pub fn path(&self) -> &str {
        &self.path
    }

    /// Whether `self`, whose host labels may be globs, matches `target`: equal ports, as many
    /// labels each matching its glob, and a path that is a prefix of the target's.
    pub fn matches(&self, target: &Self) -> bool {
        self.port() == target.port()
            && self.labels().count() == target.labels().count()
            && target.path.starts_with(&self.path)
            && self.labels().zip(target.labels()).all(|(glob, label)| super::glob::matches(glob, label))
    }
}

/// Go's host validation: a bracketed IPv6 literal or a name, then an optional `:digits` port;
/// no character a host may not hold.
fn valid_host(host: &str) -> bool {
    let (name, port) = if let Some(bracketed) = host.strip_prefix('[') {
        let Some((_, after)) = bracketed.split_once(']') else { return false };
        (host, after)
    } else {
        match host.rfind(':') {
            Some(colon) => (&host[..colon], &host[colon..]),
            None => (host, ""),
        }
    };
    let port_ok =
        port.is_empty() || port.strip_prefix(':').is_some_and(|digits| digits.bytes().all(|b| b.is_ascii_digit()));
    port_ok && name.bytes().all(|byte| byte >= 0x80 || valid_host_byte(byte))
}

fn valid_host_byte(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || b"-_.~$&'()*+,;=:[]<>\"".contains(&byte)
}

fn valid_userinfo_byte(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || b"-._:~!$&'()*+,;=%@".contains(&byte)
}

/// Go's `net.SplitHostPort`: `None` when the host has no port (or more colons than one port).
fn split_host_port(host: &str) -> Option<(&str, &str)> {
    let colon = host.rfind(':')?;
    let name = if let Some(bracketed) = host.strip_prefix('[') {
        let end = bracketed.find(']')?;
        // The port must follow the closing bracket directly.
        if end + 2 != colon {
            return None;
        }
        &bracketed[..end]
    } else {
        let name = &host[..colon];
        if name.contains(':') {
            return None;
        }
        name
    };
    let port = &host[colon + 1..];
    if name.contains(['[', ']']) || port.contains(['[', ']']) {
        return None;
    }
    Some((name, port))
}

/// The path with `%XX` escapes decoded; `None` for a malformed escape or one that is not UTF-8.
fn unescape_path(path: &str) -> Option<String> {
    if !path.contains('%') {
        return Some(path.to_owned());
    }
    let bytes = path.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        if bytes[index] == b'%' {
            let hex = path.get(index + 1..index + 3)?;
            decoded.push(u8::from_str_radix(hex, 16).ok()?);
            index += 3;
        } else {
            decoded.push(bytes[index]);
            index += 1;
        }
    }
    String::from_utf8(decoded).ok()
}
