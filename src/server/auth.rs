//! Bearer-token authentication for the API, compared in constant time.

use subtle::ConstantTimeEq;
use tonic::{Request, Status};

use crate::secret::Secret;

/// Checks `authorization: Bearer <token>` on every request.
#[derive(Clone)]
pub struct TokenAuth {
    token: std::sync::Arc<Secret<String>>,
}

impl TokenAuth {
    pub fn new(token: Secret<String>) -> TokenAuth {
        TokenAuth {
            token: std::sync::Arc::new(token),
        }
    }

    pub fn check(&self, presented: Option<&str>) -> Result<(), Status> {
        let Some(value) = presented else {
            tracing::warn!("API request without a bearer token rejected");
            return Err(Status::unauthenticated(
                "missing bearer token: the client sent none (pass --token-file, or point MEDEA_STATE_DIR at a local server's --state-dir)",
            ));
        };
        // Exactly `Bearer <token>`: no other scheme, no missing prefix, and never an empty
        // token on either side (an empty configured token must not match a header without
        // the prefix).
        let expected = self.token.expose().as_bytes();
        let ok: bool = match value.strip_prefix("Bearer ") {
            Some(given) if !expected.is_empty() => given.as_bytes().ct_eq(expected).into(),
            _ => false,
        };
        if ok {
            Ok(())
        } else {
            // Never log what was presented.
            tracing::warn!("API request with a wrong bearer token rejected");
            Err(Status::unauthenticated(
                "wrong bearer token: the client's (--token-file, MEDEA_TOKEN_FILE or MEDEA_TOKEN) is not the one in the server's --token-file",
            ))
        }
    }
}

impl tonic::service::Interceptor for TokenAuth {
    fn call(&mut self, req: Request<()>) -> Result<Request<()>, Status> {
        let value = req
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok());
        self.check(value)?;
        Ok(req)
    }
}

/// A new random token (32 bytes, hex).
pub fn generate_token() -> Secret<String> {
    use ssh_key::rand_core::{OsRng, RngCore};
    let mut b = [0u8; 32];
    OsRng.fill_bytes(&mut b);
    Secret::new(hex::encode(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_check() {
        let a = TokenAuth::new(Secret::new("s3cret".into()));
        assert!(a.check(Some("Bearer s3cret")).is_ok());
        assert_eq!(
            a.check(Some("Bearer s3cre")).unwrap_err().code(),
            tonic::Code::Unauthenticated
        );
        assert_eq!(
            a.check(Some("s3cret")).unwrap_err().code(),
            tonic::Code::Unauthenticated
        );
        assert_eq!(
            a.check(None).unwrap_err().code(),
            tonic::Code::Unauthenticated
        );
        assert_ne!(generate_token().expose(), generate_token().expose());
    }

    #[test]
    fn only_exactly_bearer_token_is_accepted() {
        let a = TokenAuth::new(Secret::new("s3cret".into()));
        for bad in [
            "bearer s3cret",
            "Bearer  s3cret",
            "Bearer s3cret ",
            " Bearer s3cret",
            "Basic s3cret",
            "Bearer",
            "Bearer ",
            "",
        ] {
            assert_eq!(
                a.check(Some(bad)).unwrap_err().code(),
                tonic::Code::Unauthenticated,
                "{bad:?}"
            );
        }
        // A server somehow given an empty token accepts nothing, not even an empty bearer or
        // a header without the prefix.
        let empty = TokenAuth::new(Secret::new(String::new()));
        for bad in ["", "Bearer ", "x", "Bearer x"] {
            assert!(empty.check(Some(bad)).is_err(), "{bad:?}");
        }
        assert!(empty.check(None).is_err());
    }
}
