//! The CLI's errors: a message that names the cause and the fix, and an
//! exit code from a small documented set (docs/operations.md).

use std::fmt;

/// Exit codes.
pub mod code {
    /// The operation failed (I/O error, array failed, ...).
    pub const FAILED: u8 = 1;
    /// Bad arguments: unknown level, bad size, too few members, ...
    pub const USAGE: u8 = 2;
    /// Something named does not exist: array, member, path.
    pub const NOT_FOUND: u8 = 3;
    /// Refused to protect data or state: member holds data or belongs to an
    /// array, listed twice, array already running or not running.
    pub const REFUSED: u8 = 4;
    /// The daemon could not be reached or answered nonsense.
    pub const DAEMON: u8 = 5;
}

#[derive(Debug, Clone)]
pub struct CliError {
    pub code: u8,
    pub msg: String,
}

impl CliError {
    pub fn new(code: u8, msg: impl Into<String>) -> CliError {
        CliError {
            code,
            msg: msg.into(),
        }
    }
    pub fn failed(msg: impl Into<String>) -> CliError {
        CliError::new(code::FAILED, msg)
    }
    pub fn usage(msg: impl Into<String>) -> CliError {
        CliError::new(code::USAGE, msg)
    }
    pub fn not_found(msg: impl Into<String>) -> CliError {
        CliError::new(code::NOT_FOUND, msg)
    }
    pub fn refused(msg: impl Into<String>) -> CliError {
        CliError::new(code::REFUSED, msg)
    }
    pub fn daemon(msg: impl Into<String>) -> CliError {
        CliError::new(code::DAEMON, msg)
    }
    /// An exit status with nothing more to say (what the command printed
    /// says it all): `status` of a degraded array, a scrub that found
    /// mismatches.
    pub fn quiet(code: u8) -> CliError {
        CliError::new(code, "")
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.msg)
    }
}

impl From<raid_core::array::ArrayError> for CliError {
    fn from(e: raid_core::array::ArrayError) -> CliError {
        use raid_core::array::ArrayError as E;
        let code = match &e {
            E::Geometry(_) | E::Unaligned { .. } | E::OutOfRange { .. } => code::USAGE,
            E::Assembly(_) | E::Invalid(_) | E::Refused { .. } => code::REFUSED,
            _ => code::FAILED,
        };
        CliError::new(code, e.to_string())
    }
}

pub type Result<T> = std::result::Result<T, CliError>;
