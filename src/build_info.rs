//! What this binary was built from.

pub const VERSION: &str = env!("CARGO_PKG_VERSION");
pub const GIT_SHA: &str = env!("MEDEA_GIT_SHA");
pub const PROFILE: &str = env!("MEDEA_PROFILE");

/// `0.1.0 (git 1a2b3c4d5e6f, debug)`.
pub const LONG_VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (git ",
    env!("MEDEA_GIT_SHA"),
    ", ",
    env!("MEDEA_PROFILE"),
    ")"
);
