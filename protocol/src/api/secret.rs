//! A string that must never reach logs, events or `Debug` output.

use serde::{Deserialize, Serialize};

/// An API key or tunnel token in clear text.
///
/// Its `Debug` and `Display` print a mask, so a secret that slips into a
/// `tracing` field or an error message does not leak. Read the value only
/// where it is sent over the wire, with [`Secret::expose`].
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// Wraps a clear-text secret.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The clear text: call it only where the secret is put on the wire.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl From<String> for Secret {
    fn from(value: String) -> Self {
        Self(value)
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(***)")
    }
}

impl std::fmt::Display for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("***")
    }
}

#[cfg(test)]
mod tests {
    use super::Secret;

    #[test]
    fn debug_and_display_mask_the_value() {
        let secret = Secret::new("tunak_0123_verysecret");
        assert_eq!(format!("{secret:?}"), "Secret(***)");
        assert_eq!(format!("{secret}"), "***");
        assert_eq!(secret.expose(), "tunak_0123_verysecret");
        assert_eq!(
            serde_json::to_string(&secret).unwrap(),
            "\"tunak_0123_verysecret\""
        );
    }
}
