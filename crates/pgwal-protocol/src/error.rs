//! Decoding errors.

/// An error found while decoding a protocol message.
///
/// Decoding never panics; malformed, truncated or unknown input always ends
/// in one of these variants.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The message ended before a field could be read.
    #[error("unexpected end of message reading {field}: needed {needed} bytes, {remaining} left")]
    UnexpectedEof {
        /// The field being read.
        field: &'static str,
        /// Bytes the field needs.
        needed: usize,
        /// Bytes left in the message.
        remaining: usize,
    },
    /// A message or field tag is not one this crate knows.
    #[error("unknown {context} tag 0x{tag:02x}")]
    UnknownTag {
        /// What kind of tag was expected.
        context: &'static str,
        /// The byte found.
        tag: u8,
    },
    /// A NUL-terminated string had no terminator.
    #[error("string field {field} is not NUL-terminated")]
    MissingNul {
        /// The field being read.
        field: &'static str,
    },
    /// A string field is not valid UTF-8.
    #[error("string field {field} is not valid UTF-8")]
    InvalidUtf8 {
        /// The field being read.
        field: &'static str,
    },
    /// A length or count field is negative or otherwise impossible.
    #[error("invalid length {value} in {field}")]
    InvalidLength {
        /// The field being read.
        field: &'static str,
        /// The value found.
        value: i64,
    },
    /// The message has bytes after its last field.
    #[error("{count} trailing bytes after {message} message")]
    TrailingBytes {
        /// The message kind.
        message: &'static str,
        /// How many bytes were left over.
        count: usize,
    },
    /// The message is empty.
    #[error("empty message")]
    Empty,
}
