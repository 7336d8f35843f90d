//! [`Secret`]: key material, tokens and config bodies as a type that cannot be logged.
//!
//! `Debug` and `Display` print `<redacted>` and there is no `Serialize`, so a secret inside a
//! struct that is logged, returned or serialized by mistake either prints nothing of itself or
//! does not compile. The one way in is [`Secret::expose`], whose call sites are few and
//! greppable.

use std::fmt;

/// A secret value: `Debug` and `Display` print `<redacted>`, and there is no `Serialize`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret<T>(T);

impl<T> Secret<T> {
    pub fn new(value: T) -> Secret<T> {
        Secret(value)
    }
    /// The secret itself. Callers must not log or print it.
    pub fn expose(&self) -> &T {
        &self.0
    }
}

impl<T> fmt::Debug for Secret<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

impl<T> fmt::Display for Secret<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_do_not_print() {
        let s = Secret::new("hunter2".to_string());
        assert_eq!(format!("{s:?} {s}"), "<redacted> <redacted>");
        assert_eq!(s.expose(), "hunter2");
        #[derive(Debug)]
        #[allow(dead_code)]
        struct Holder {
            token: Secret<String>,
        }
        let h = Holder { token: s };
        assert_eq!(format!("{h:?}"), "Holder { token: <redacted> }");
    }
}
