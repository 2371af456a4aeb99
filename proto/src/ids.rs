//! Identifier types shared by every layer.
//!
//! Each constructor enforces the contract's rules, so a value of these types is
//! valid by construction and nothing past the edge re-checks it.

use std::{
    borrow::Borrow,
    fmt,
    hash::{Hash, Hasher},
    num::NonZeroU64,
};

use arcstr::ArcStr;

/// Longest session id the contract accepts, in bytes.
pub const MAX_SESSION_ID_BYTES: usize = 256;
/// Longest request id the contract accepts, in bytes.
pub const MAX_REQUEST_ID_BYTES: usize = 128;

/// Why an identifier was refused; the edge adds the field name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    #[error("must not be empty")]
    Empty,
    #[error("is {len} bytes, longer than the limit of {max}")]
    TooLong { len: usize, max: usize },
    #[error("contains the control character U+{code:04X} at byte {at}")]
    ControlCharacter { code: u32, at: usize },
}

/// A session id: 1 to 256 bytes of UTF-8 with no Unicode `Cc` characters.
///
/// Shared because the same id is the registry key, the expiry entry and a
/// field of every event the session emits; clones are a refcount. One word
/// (`ArcStr` keeps the length beside the count), not `Arc<str>`'s two: a
/// million held sessions store it twice each, in their table slot and their
/// expiry entry.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct SessionId(ArcStr);

/// Hashes exactly as the `str` it borrows as, which the registry's
/// `&str` lookups rely on.
impl Hash for SessionId {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.as_str().hash(state);
    }
}

impl SessionId {
    pub fn parse(raw: &str) -> Result<Self, IdError> {
        if raw.is_empty() {
            return Err(IdError::Empty);
        }
        if raw.len() > MAX_SESSION_ID_BYTES {
            return Err(IdError::TooLong {
                len: raw.len(),
                max: MAX_SESSION_ID_BYTES,
            });
        }
        if let Some((at, c)) = raw.char_indices().find(|(_, c)| c.is_control()) {
            return Err(IdError::ControlCharacter {
                code: u32::from(c),
                at,
            });
        }
        Ok(Self(ArcStr::from(raw)))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Borrow<str> for SessionId {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A client-chosen idempotency key for Start: 1 to 128 bytes.
/// The empty string on the wire means "no key" and never becomes a `RequestId`.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct RequestId(Box<str>);

impl RequestId {
    /// `Ok(None)` for the empty string: the call simply has no idempotency key.
    pub fn parse_optional(raw: &str) -> Result<Option<Self>, IdError> {
        if raw.is_empty() {
            return Ok(None);
        }
        if raw.len() > MAX_REQUEST_ID_BYTES {
            return Err(IdError::TooLong {
                len: raw.len(),
                max: MAX_REQUEST_ID_BYTES,
            });
        }
        Ok(Some(Self(raw.into())))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

/// A response id: nonzero, minted by the coordinator, strictly increasing
/// within a session and never reused. It is a fencing token for gateways.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ResponseId(NonZeroU64);

impl ResponseId {
    pub const MIN: ResponseId = ResponseId(NonZeroU64::MIN);

    /// `None` for 0, which the wire uses for "no response".
    pub fn new(raw: u64) -> Option<Self> {
        NonZeroU64::new(raw).map(Self)
    }

    pub fn get(self) -> u64 {
        self.0.get()
    }
}

impl fmt::Display for ResponseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// The sessions a caller may see and touch: every session, or those whose id
/// starts with a prefix (a multi-tenant gateway's token for `tenant-a/`).
/// Authentication decides a caller's scope (`auth`); the registry filters
/// listings and watch-all by it, and the service refuses calls outside it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub enum SessionScope {
    #[default]
    All,
    Prefix(ArcStr),
}

impl SessionScope {
    /// A prefix scope. The prefix follows the session id rules (1 to 256
    /// bytes, no control characters): a session id can start with it.
    pub fn prefix(prefix: &str) -> Result<Self, IdError> {
        let valid = SessionId::parse(prefix)?;
        Ok(Self::Prefix(valid.0))
    }

    pub fn contains(&self, id: &SessionId) -> bool {
        match self {
            SessionScope::All => true,
            SessionScope::Prefix(prefix) => id.as_str().starts_with(&**prefix),
        }
    }

    /// The prefix every session in scope starts with, if restricted.
    pub fn as_prefix(&self) -> Option<&str> {
        match self {
            SessionScope::All => None,
            SessionScope::Prefix(prefix) => Some(prefix),
        }
    }
}

impl fmt::Display for SessionScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SessionScope::All => f.write_str("every session"),
            SessionScope::Prefix(prefix) => write!(f, "session ids starting with {prefix:?}"),
        }
    }
}

/// 0 for "none", as the wire spells it.
pub fn response_id_or_zero(id: Option<ResponseId>) -> u64 {
    id.map_or(0, ResponseId::get)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_id_bounds() {
        assert_eq!(SessionId::parse(""), Err(IdError::Empty));
        assert!(SessionId::parse(&"a".repeat(256)).is_ok());
        assert_eq!(
            SessionId::parse(&"a".repeat(257)),
            Err(IdError::TooLong { len: 257, max: 256 })
        );
        // 128 two-byte characters are 256 bytes: the limit counts bytes.
        assert!(SessionId::parse(&"é".repeat(128)).is_ok());
        assert!(SessionId::parse(&"é".repeat(129)).is_err());
    }

    #[test]
    fn session_id_rejects_every_cc_character() {
        for c in ('\u{0}'..='\u{1f}').chain('\u{7f}'..='\u{9f}') {
            let raw = format!("ab{c}");
            assert_eq!(
                SessionId::parse(&raw),
                Err(IdError::ControlCharacter {
                    code: u32::from(c),
                    at: 2
                }),
                "{c:?}"
            );
        }
        // Format characters and other non-Cc Unicode are allowed.
        assert!(SessionId::parse("tenant-a/\u{a0}\u{200b}ü日本").is_ok());
    }

    #[test]
    fn request_id_bounds() {
        assert_eq!(RequestId::parse_optional(""), Ok(None));
        assert!(RequestId::parse_optional(&"r".repeat(128))
            .unwrap()
            .is_some());
        assert!(RequestId::parse_optional(&"r".repeat(129)).is_err());
    }

    #[test]
    fn scope_is_a_prefix_of_session_ids() {
        let id = |raw| SessionId::parse(raw).unwrap();
        let scope = SessionScope::prefix("tenant-a/").unwrap();
        assert!(scope.contains(&id("tenant-a/call-1")));
        assert!(scope.contains(&id("tenant-a/")));
        assert!(!scope.contains(&id("tenant-b/call-1")));
        assert!(!scope.contains(&id("tenant-a")));
        assert!(SessionScope::All.contains(&id("anything")));
        assert_eq!(SessionScope::prefix(""), Err(IdError::Empty));
        assert!(SessionScope::prefix("a\n").is_err());
    }

    #[test]
    fn response_id_zero_is_none() {
        assert_eq!(ResponseId::new(0), None);
        assert_eq!(ResponseId::new(7).map(ResponseId::get), Some(7));
        assert_eq!(response_id_or_zero(None), 0);
    }
}
