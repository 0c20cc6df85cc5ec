//! Minting and checking API keys and tunnel tokens.
//!
//! A secret reads `<prefix>_<id>_<64 hex chars>`: the id is public (it names
//! the key or token in listings and lets the edge find the record without a
//! scan), the rest is 256 random bits. The store keeps only SHA-256 of the
//! whole string: with that much entropy a fast hash is safe, and a stolen
//! store file opens nothing. Hashes are compared in constant time.

use ring::digest;
use ring::rand::{SecureRandom, SystemRandom};
use subtle::ConstantTimeEq;
use tuna_protocol::api::Secret;

/// Prefix of the token ids of grants opened with an API key.
pub const KEY_GRANT_PREFIX: &str = "key:";

/// Prefix of API keys (`tunak_…`): recognisable by secret scanners.
pub const API_KEY_PREFIX: &str = "tunak";
/// Prefix of tunnel tokens (`tunat_…`).
pub const TUNNEL_TOKEN_PREFIX: &str = "tunat";

/// A freshly minted secret: the clear text is shown once, the hash is kept.
pub(crate) struct Minted {
    pub id: String,
    pub secret: Secret,
    pub hash: String,
}

fn random_hex(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    SystemRandom::new()
        .fill(&mut buf)
        // The OS RNG failing is not recoverable; nothing safe can be minted.
        .expect("the operating system's random number generator failed");
    hex::encode(buf)
}

/// A random id (16 hex chars) for records that are not secrets.
pub(crate) fn random_id() -> String {
    random_hex(8)
}

/// Mints `<prefix>_<id>_<secret>`.
pub(crate) fn mint(prefix: &str) -> Minted {
    let id = random_id();
    let secret = Secret::new(format!("{prefix}_{id}_{}", random_hex(32)));
    let hash = hash(secret.expose());
    Minted { id, secret, hash }
}

/// Hex SHA-256 of the whole presented string.
pub(crate) fn hash(presented: &str) -> String {
    hex::encode(digest::digest(&digest::SHA256, presented.as_bytes()))
}

/// The id inside a presented secret, if it has the right shape.
pub(crate) fn id_of<'a>(prefix: &str, presented: &'a str) -> Option<&'a str> {
    let rest = presented.strip_prefix(prefix)?.strip_prefix('_')?;
    let (id, secret) = rest.split_once('_')?;
    let well_formed = id.len() == 16
        && secret.len() == 64
        && id.bytes().all(|b| b.is_ascii_hexdigit())
        && secret.bytes().all(|b| b.is_ascii_hexdigit());
    well_formed.then_some(id)
}

/// Whether `presented` hashes to `stored_hash`, in constant time.
pub(crate) fn matches(stored_hash: &str, presented: &str) -> bool {
    hash(presented)
        .as_bytes()
        .ct_eq(stored_hash.as_bytes())
        .into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minted_secret_round_trips() {
        let minted = mint(API_KEY_PREFIX);
        let text = minted.secret.expose();
        assert!(text.starts_with("tunak_"));
        assert_eq!(id_of(API_KEY_PREFIX, text), Some(minted.id.as_str()));
        assert_eq!(id_of(TUNNEL_TOKEN_PREFIX, text), None);
        assert!(matches(&minted.hash, text));
        assert!(!matches(
            &minted.hash,
            &text.replace('a', "b").replace('1', "2")
        ));
        assert_ne!(mint(API_KEY_PREFIX).secret, minted.secret);
    }

    #[test]
    fn malformed_secrets_have_no_id() {
        for bad in [
            "",
            "tunak",
            "tunak_",
            "tunak_0123456789abcdef",
            "tunak_0123456789abcdef_short",
            "tunak_0123456789abcdeg_0000000000000000000000000000000000000000000000000000000000000000",
            "xunak_0123456789abcdef_0000000000000000000000000000000000000000000000000000000000000000",
        ] {
            assert_eq!(id_of(API_KEY_PREFIX, bad), None, "{bad:?}");
        }
    }
}
