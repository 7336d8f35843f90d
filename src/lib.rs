//! medea: an external control plane for Talos Linux Kubernetes clusters.
//!
//! See `design/architecture.md` for the module map. Domain modules (`desired`, `plan`,
//! `approval`, `rollout::sequencer`) are pure; adapters (`store`, `talos`, `k8s`) sit at the edge.

pub mod api;
pub mod api_lifecycle;
// Every public item of these domain modules is documented (issue #34 item 7).
#[warn(missing_docs)]
pub mod approval;
pub mod bench;
pub mod build_info;
pub mod cli;
#[warn(missing_docs)]
pub mod desired;
pub mod duration;
pub mod fuzz;
pub mod health;
pub mod image;
pub mod inventory;
pub mod k8s;
pub mod metrics;
pub mod ops;
#[warn(missing_docs)]
pub mod plan;
pub mod private_file;
#[warn(missing_docs)]
pub mod rehearsal;
pub mod rollout;
pub mod secret;
pub mod server;
pub mod sim;
pub mod store;
pub mod talos;
pub mod version;
pub mod webhook;

/// Render an error with its whole `source()` chain, for logs: `outer: inner: root cause`.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// Taking a `std::sync` lock the one way medea does: a poisoned lock means a thread panicked
/// mid-update, and continuing on half-updated state would be worse than stopping, so taking it
/// panics (at the caller's line). One place for that choice instead of an `expect` and an
/// `allow` at every lock (issue #50 item 6). Free for all modules, like [`error_chain`].
pub trait Locked {
    /// The guard of a mutex, the read guard of a `RwLock`.
    type Read<'a>
    where
        Self: 'a;
    /// The guard of a mutex, the write guard of a `RwLock`.
    type Write<'a>
    where
        Self: 'a;
    /// Lock for reading (a mutex: lock).
    fn read_locked(&self) -> Self::Read<'_>;
    /// Lock for writing (a mutex: lock).
    fn locked(&self) -> Self::Write<'_>;
}

#[expect(
    clippy::expect_used,
    reason = "a poisoned lock means a thread panicked mid-update; continuing on half-updated state would be worse than stopping"
)]
impl<T: ?Sized> Locked for std::sync::Mutex<T> {
    type Read<'a>
        = std::sync::MutexGuard<'a, T>
    where
        T: 'a;
    type Write<'a>
        = std::sync::MutexGuard<'a, T>
    where
        T: 'a;
    #[track_caller]
    fn read_locked(&self) -> Self::Read<'_> {
        self.locked()
    }
    #[track_caller]
    fn locked(&self) -> Self::Write<'_> {
        self.lock()
            .expect("a lock poisoned: a thread panicked while it held it")
    }
}

#[expect(
    clippy::expect_used,
    reason = "a poisoned lock means a thread panicked mid-update; continuing on half-updated state would be worse than stopping"
)]
impl<T: ?Sized> Locked for std::sync::RwLock<T> {
    type Read<'a>
        = std::sync::RwLockReadGuard<'a, T>
    where
        T: 'a;
    type Write<'a>
        = std::sync::RwLockWriteGuard<'a, T>
    where
        T: 'a;
    #[track_caller]
    fn read_locked(&self) -> Self::Read<'_> {
        self.read()
            .expect("a lock poisoned: a thread panicked while it held it")
    }
    #[track_caller]
    fn locked(&self) -> Self::Write<'_> {
        self.write()
            .expect("a lock poisoned: a thread panicked while it held it")
    }
}

#[cfg(test)]
mod locked_tests {
    use std::sync::{Arc, Mutex, RwLock};

    use super::Locked as _;

    #[test]
    fn a_lock_is_taken_and_released() {
        let m = Mutex::new(1);
        *m.locked() += 1;
        assert_eq!(*m.locked(), 2);
        let rw = RwLock::new(vec![1]);
        rw.locked().push(2);
        assert_eq!(rw.read_locked().len(), 2);
    }

    #[test]
    fn a_poisoned_lock_stops_rather_than_continues() {
        let m = Arc::new(Mutex::new(0));
        let m2 = m.clone();
        let _ = std::thread::spawn(move || {
            let _g = m2.locked();
            panic!("mid-update");
        })
        .join();
        assert!(m.is_poisoned());
        let taken = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| *m.locked()));
        assert!(
            taken.is_err(),
            "a poisoned lock must not hand out its state"
        );
    }
}
