//! Plan identifiers: sha256 digests shown as 12-hex short ids; the full lowercase hex is signed.

use std::fmt;
use std::str::FromStr;

/// The id of a plan: a sha256 digest over its canonical encoding (see `plan::compute`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PlanId([u8; 32]);

/// Length of the short id shown to operators.
pub const SHORT_LEN: usize = 12;

/// Why text is not a plan id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanIdError {
    /// Not lowercase hex.
    #[error("plan id `{input}` is not lowercase hex")]
    NotHex {
        /// The text as given.
        input: String,
    },
    /// Neither the full id nor a prefix of at least [`SHORT_LEN`] characters.
    #[error(
        "plan id `{input}` must be the full 64-hex id or a prefix of at least {SHORT_LEN} characters"
    )]
    Length {
        /// The text as given.
        input: String,
    },
}

impl PlanId {
    /// The id of a plan whose SHA-256 digest is `bytes`.
    pub fn from_digest(bytes: [u8; 32]) -> PlanId {
        PlanId(bytes)
    }
    /// The digest.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
    /// Full lowercase hex (64 characters): what an approval signs, followed by `\n`.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }
    /// The 12-hex short id printed in summaries and accepted by `medea approve`.
    pub fn short(&self) -> String {
        self.to_hex()[..SHORT_LEN].to_string()
    }
    /// The exact bytes an approval signature covers: the full id and one newline.
    pub fn signed_message(&self) -> Vec<u8> {
        let mut m = self.to_hex().into_bytes();
        m.push(b'\n');
        m
    }
    /// Parse the full 64-hex id.
    pub fn parse_full(input: &str) -> Result<PlanId, PlanIdError> {
        let ref_ = PlanIdRef::parse(input)?;
        ref_.full().ok_or_else(|| PlanIdError::Length {
            input: input.to_string(),
        })
    }
}

impl fmt::Display for PlanId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.short())
    }
}
impl fmt::Debug for PlanId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PlanId({})", self.short())
    }
}
impl serde::Serialize for PlanId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_hex())
    }
}
impl<'de> serde::Deserialize<'de> for PlanId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        PlanId::parse_full(&s).map_err(serde::de::Error::custom)
    }
}

/// What an operator typed: a full id or a prefix of at least [`SHORT_LEN`] hex characters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanIdRef(String);

impl PlanIdRef {
    /// Lowercase hex: the full id or a prefix of at least [`SHORT_LEN`] characters.
    pub fn parse(input: &str) -> Result<PlanIdRef, PlanIdError> {
        let s = input.trim();
        if !s
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            return Err(PlanIdError::NotHex {
                input: input.to_string(),
            });
        }
        if s.len() < SHORT_LEN || s.len() > 64 {
            return Err(PlanIdError::Length {
                input: input.to_string(),
            });
        }
        Ok(PlanIdRef(s.to_string()))
    }
    /// Whether `id` starts with this prefix.
    pub fn matches(&self, id: &PlanId) -> bool {
        id.to_hex().starts_with(&self.0)
    }
    /// The full id, when the operator typed all 64 characters.
    pub fn full(&self) -> Option<PlanId> {
        if self.0.len() != 64 {
            return None;
        }
        let mut b = [0u8; 32];
        hex::decode_to_slice(&self.0, &mut b).ok()?;
        Some(PlanId(b))
    }
    /// The hex as given.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}
impl FromStr for PlanIdRef {
    type Err = PlanIdError;
    fn from_str(s: &str) -> Result<Self, PlanIdError> {
        PlanIdRef::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_full_and_signed_message() {
        let id = PlanId::from_digest([0xab; 32]);
        assert_eq!(id.short(), "abababababab");
        assert_eq!(id.to_hex().len(), 64);
        assert_eq!(
            id.signed_message(),
            format!("{}\n", id.to_hex()).into_bytes()
        );
        assert_eq!(PlanId::parse_full(&id.to_hex()).unwrap(), id);
        assert!(PlanIdRef::parse("abababababab").unwrap().matches(&id));
        assert!(!PlanIdRef::parse("abababababac").unwrap().matches(&id));
    }

    #[test]
    fn refuses_bad_ids() {
        assert!(matches!(
            PlanIdRef::parse("ABABABABABAB"),
            Err(PlanIdError::NotHex { .. })
        ));
        assert!(matches!(
            PlanIdRef::parse("abab"),
            Err(PlanIdError::Length { .. })
        ));
        assert!(matches!(
            PlanId::parse_full("abababababab"),
            Err(PlanIdError::Length { .. })
        ));
    }
}
