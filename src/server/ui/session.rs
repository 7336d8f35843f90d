//! Browser sessions: the bearer token is exchanged once for a random session id carried in an
//! HttpOnly, Secure, SameSite=Strict cookie. Sessions live in this process's memory only: a
//! restart (or a failover to another replica) logs everyone out, and no session is ever
//! written to the store.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::Locked as _;
use axum::http::{HeaderMap, HeaderValue, header};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// The cookie's name. The `__Host-` prefix makes browsers refuse it unless it is Secure, has
/// `Path=/` and no `Domain`, so no other host can plant or read it.
pub const SESSION_COOKIE: &str = "__Host-medea_session";

/// How long a session lives after login, whatever its use (then log in again).
pub const SESSION_TTL: Duration = Duration::from_secs(8 * 3600);

/// At most this many live sessions; the oldest goes when a login would exceed it.
const MAX_SESSIONS: usize = 1024;

struct Session {
    csrf: String,
    expires: Instant,
    /// Never sent on: dropped when the session leaves the map (logout, expiry, eviction),
    /// which is what [`View::ended`] waits for.
    alive: tokio::sync::watch::Sender<()>,
}

/// What a handler knows about the caller's session.
#[derive(Clone)]
pub struct View {
    /// The token forms must echo back (never the session id).
    pub csrf: String,
    expires: Instant,
    alive: tokio::sync::watch::Receiver<()>,
}

impl View {
    /// Resolves when the session ends: logout, eviction or expiry. A long-lived response (the
    /// event stream) ends with it, so logging out cuts every stream the session opened.
    pub async fn ended(mut self) {
        let expiry = tokio::time::sleep_until(self.expires.into());
        tokio::select! {
            // Only an error can come: nothing is ever sent, the sender is dropped with the
            // session.
            _ = self.alive.changed() => {}
            () = expiry => {}
        }
    }
}

impl View {
    /// Constant-time comparison with a form's CSRF token.
    pub fn csrf_matches(&self, given: &str) -> bool {
        !given.is_empty() && bool::from(given.as_bytes().ct_eq(self.csrf.as_bytes()))
    }
}

/// Live sessions by the SHA-256 of their id (the id itself is kept nowhere on the server).
#[derive(Default)]
pub struct Sessions {
    by_hash: Mutex<HashMap<[u8; 32], Session>>,
}

fn random_hex() -> String {
    use ssh_key::rand_core::{OsRng, RngCore};
    let mut b = [0u8; 32];
    OsRng.fill_bytes(&mut b);
    hex::encode(b)
}

fn hash(id: &str) -> [u8; 32] {
    Sha256::digest(id.as_bytes()).into()
}

impl Sessions {
    /// A new session; returns its id (for the cookie only).
    pub fn create(&self, now: Instant) -> String {
        let id = random_hex();
        let mut map = self.by_hash.locked();
        map.retain(|_, s| s.expires > now);
        if map.len() >= MAX_SESSIONS
            && let Some(oldest) = map.iter().min_by_key(|(_, s)| s.expires).map(|(k, _)| *k)
        {
            map.remove(&oldest);
        }
        map.insert(
            hash(&id),
            Session {
                csrf: random_hex(),
                expires: now + SESSION_TTL,
                alive: tokio::sync::watch::channel(()).0,
            },
        );
        id
    }

    /// The session of a request's cookie, if it is live.
    pub fn get(&self, headers: &HeaderMap) -> Option<View> {
        self.get_at(headers, Instant::now())
    }

    pub fn get_at(&self, headers: &HeaderMap, now: Instant) -> Option<View> {
        let id = cookie_value(headers)?;
        let key = hash(id);
        let mut map = self.by_hash.locked();
        match map.get(&key) {
            Some(s) if s.expires > now => Some(View {
                csrf: s.csrf.clone(),
                expires: s.expires,
                alive: s.alive.subscribe(),
            }),
            Some(_) => {
                map.remove(&key);
                None
            }
            None => None,
        }
    }

    /// End the session of a request's cookie.
    pub fn remove(&self, headers: &HeaderMap) {
        if let Some(id) = cookie_value(headers) {
            self.by_hash.locked().remove(&hash(id));
        }
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.by_hash.locked().len()
    }
}

/// The session id in the request's `Cookie` headers, if any.
fn cookie_value(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == SESSION_COOKIE)
        .map(|(_, v)| v)
        .filter(|v| v.len() == 64 && v.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// `Set-Cookie` for a new session.
#[allow(
    clippy::expect_used,
    reason = "the cookie is ASCII: a fixed name and a hex id, always a valid header value"
)]
pub fn cookie(id: &str) -> HeaderValue {
    HeaderValue::from_str(&format!(
        "{SESSION_COOKIE}={id}; Path=/; HttpOnly; Secure; SameSite=Strict; Max-Age={}",
        SESSION_TTL.as_secs()
    ))
    .expect("a hex id makes a valid header")
}

/// `Set-Cookie` that removes the session cookie.
#[allow(
    clippy::expect_used,
    reason = "a constant ASCII literal is a valid header value"
)]
pub fn clear_cookie() -> HeaderValue {
    HeaderValue::from_str(&format!(
        "{SESSION_COOKIE}=; Path=/; HttpOnly; Secure; SameSite=Strict; Max-Age=0"
    ))
    .expect("a literal makes a valid header")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_cookie(id: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            header::COOKIE,
            HeaderValue::from_str(&format!("other=1; {SESSION_COOKIE}={id}")).unwrap(),
        );
        h
    }

    #[test]
    fn a_session_expires_and_is_forgotten() {
        let s = Sessions::default();
        let t0 = Instant::now();
        let id = s.create(t0);
        assert!(s.get_at(&with_cookie(&id), t0).is_some());
        assert!(
            s.get_at(&with_cookie(&id), t0 + SESSION_TTL - Duration::from_secs(1))
                .is_some()
        );
        assert!(s.get_at(&with_cookie(&id), t0 + SESSION_TTL).is_none());
        assert_eq!(s.len(), 0, "an expired session is removed when seen");
    }

    #[test]
    fn unknown_malformed_and_removed_ids_get_nothing() {
        let s = Sessions::default();
        let id = s.create(Instant::now());
        assert!(s.get(&HeaderMap::new()).is_none());
        assert!(s.get(&with_cookie(&"0".repeat(64))).is_none());
        assert!(s.get(&with_cookie("short")).is_none());
        let view = s.get(&with_cookie(&id)).unwrap();
        assert!(view.csrf_matches(&view.csrf.clone()));
        assert!(!view.csrf_matches(""));
        assert!(!view.csrf_matches(&view.csrf[1..]));
        assert_ne!(view.csrf, id, "the CSRF token is not the session id");
        s.remove(&with_cookie(&id));
        assert!(s.get(&with_cookie(&id)).is_none());
    }

    #[test]
    fn sessions_are_bounded() {
        let s = Sessions::default();
        let t0 = Instant::now();
        let first = s.create(t0);
        for i in 1..=MAX_SESSIONS {
            s.create(t0 + Duration::from_millis(i as u64));
        }
        assert_eq!(s.len(), MAX_SESSIONS);
        assert!(
            s.get_at(&with_cookie(&first), t0).is_none(),
            "the oldest went"
        );
    }

    #[test]
    fn the_cookie_carries_every_flag() {
        let c = cookie(&"a".repeat(64));
        let c = c.to_str().unwrap();
        for flag in [
            "HttpOnly",
            "Secure",
            "SameSite=Strict",
            "Path=/",
            "Max-Age=28800",
        ] {
            assert!(c.contains(flag), "{c}");
        }
        assert!(c.starts_with("__Host-medea_session="), "{c}");
        assert!(clear_cookie().to_str().unwrap().contains("Max-Age=0"));
    }
}
