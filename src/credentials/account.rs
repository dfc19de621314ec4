//! The pod's service account as the caller passes it (KEP-4412): what credential-provider plugins
//! configured with `tokenAttributes` are given, and what their answers are cached under.

use std::collections::BTreeMap;

use secrecy::SecretString;

/// The most bytes of one token; a projected service-account token is 1-2 KiB.
pub const MAX_TOKEN_BYTES: usize = 16 << 10;
/// The most annotations of one service account.
pub const MAX_ANNOTATIONS: usize = 64;
/// The most tokens (audiences) of one request.
pub const MAX_TOKENS: usize = 16;

/// The pod's service account, with a token per audience. `Debug` shows no token.
#[derive(Debug, Clone, Default)]
pub struct ServiceAccount {
    pub namespace: String,
    pub name: String,
    /// Its `metadata.uid`: a recreated account is another account.
    pub uid: String,
    pub annotations: BTreeMap<String, String>,
    pub tokens: Vec<AudienceToken>,
}

/// A token minted for one audience.
#[derive(Debug, Clone)]
pub struct AudienceToken {
    pub audience: String,
    pub token: SecretString,
}

impl ServiceAccount {
    /// The token for `audience`, if the caller minted one.
    pub fn token_for(&self, audience: &str) -> Option<&SecretString> {
        self.tokens.iter().find(|token| token.audience == audience).map(|token| &token.token)
    }
}
