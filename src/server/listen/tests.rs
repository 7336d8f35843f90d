use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use super::*;

/// A failed accept pauses, doubling up to a second, and a success starts over: a listener out
/// of file descriptors neither spins nor stays slow once they are back (issue #32).
#[test]
fn accept_backoff_doubles_to_a_ceiling_and_resets_on_success() {
    let mut b = AcceptBackoff::new();
    let pauses: Vec<_> = (0..9).map(|_| b.failed()).collect();
    let ms = |v: &[u64]| {
        v.iter()
            .map(|m| Duration::from_millis(*m))
            .collect::<Vec<_>>()
    };
    assert_eq!(pauses, ms(&[10, 20, 40, 80, 160, 320, 640, 1000, 1000]));
    b.succeeded();
    assert_eq!(b.failed(), Duration::from_millis(10));
}

/// A listener on a free loopback port with plain TCP (no handshake) under `limits`.
async fn plain(limits: Limits) -> (SocketAddr, mpsc::Receiver<Conn<TcpStream>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let rx = accept("test", listener, limits, |tcp| async move { Ok(tcp) });
    (addr, rx)
}

/// A TCP connection to `to` from the loopback address `from` (127.0.0.0/8 is all local).
async fn connect_from(from: &str, to: SocketAddr) -> TcpStream {
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.bind(format!("{from}:0").parse().unwrap()).unwrap();
    sock.connect(to).await.unwrap()
}

/// Whether the server closed `c` (EOF or reset) within `within`.
async fn closed_within(c: &mut TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 64];
    tokio::time::timeout(within, async {
        loop {
            match c.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => continue,
            }
        }
    })
    .await
    .is_ok()
}

/// Long enough that only a cap closes a connection within a test.
fn long(max_connections: usize, max_per_peer: usize) -> Limits {
    Limits {
        max_connections,
        max_per_peer,
        handshake_timeout: Duration::from_secs(600),
        header_timeout: Duration::from_secs(600),
        keep_alive: Duration::from_secs(600),
    }
}

/// Silent connections from many addresses fill the cap in all: a client that talks is still
/// admitted at once (the oldest silent one is closed for it), and the connections that talk
/// are never closed to make room (issue #49: 300 silent connections kept the API from
/// answering for 100 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_flood_never_locks_out_a_client_that_talks() {
    let (addr, mut rx) = plain(long(8, 4)).await;
    // one client that talks, admitted and handed out
    let mut talking = connect_from("127.0.0.1", addr).await;
    talking.write_all(b"hello").await.unwrap();
    let mut first = tokio::time::timeout(Duration::from_secs(20), rx.recv())
        .await
        .expect("a connection that talks is handed out")
        .unwrap();
    // the flood: more silent connections than the cap, from four addresses
    let mut silent = Vec::new();
    for i in 0..20 {
        silent.push(connect_from(&format!("127.0.0.{}", 2 + i % 4), addr).await);
    }
    // another client that talks gets in during the flood
    let mut second = connect_from("127.0.0.1", addr).await;
    second.write_all(b"again").await.unwrap();
    let conn = tokio::time::timeout(Duration::from_secs(20), rx.recv())
        .await
        .expect("a client that talks is admitted during a silent flood")
        .unwrap();
    assert_eq!(conn.peer(), second.local_addr().unwrap());
    // the first one was never evicted: it still answers
    let mut buf = [0u8; 5];
    first.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"hello");
    first.write_all(b"pong").await.unwrap();
    talking.read_exact(&mut buf[..4]).await.unwrap();
    assert_eq!(&buf[..4], b"pong");
    // and the oldest silent ones were closed to make room
    let mut closed = 0;
    for c in silent.iter_mut().take(8) {
        if closed_within(c, Duration::from_secs(5)).await {
            closed += 1;
        }
    }
    assert!(closed > 0, "no silent connection was closed to make room");
}

/// One address past its cap is closed at once, before any handshake; another address is not
/// affected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_the_per_peer_cap_are_closed_at_once() {
    let (addr, _rx) = plain(long(100, 3)).await;
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(connect_from("127.0.0.1", addr).await);
    }
    for _ in 0..5 {
        let mut extra = connect_from("127.0.0.1", addr).await;
        assert!(
            closed_within(&mut extra, Duration::from_secs(10)).await,
            "a connection over the per-peer cap was left open"
        );
    }
    let mut other = connect_from("127.0.0.2", addr).await;
    assert!(
        !closed_within(&mut other, Duration::from_millis(300)).await,
        "another address is under its own cap"
    );
}

/// A connection that never finishes its handshake, and one that sends nothing after it, are
/// closed after their timeouts and free their place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_connections_are_closed_after_the_timeouts() {
    let timeout = Duration::from_millis(300);
    let limits = Limits {
        max_connections: 1,
        handshake_timeout: timeout,
        header_timeout: timeout,
        ..Limits::default()
    };
    // a handshake that never ends
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let _rx = accept("test", listener, limits.clone(), |tcp| async move {
        let _held = tcp;
        std::future::pending::<std::io::Result<TcpStream>>().await
    });
    let started = std::time::Instant::now();
    let mut c = connect_from("127.0.0.1", addr).await;
    assert!(closed_within(&mut c, Duration::from_secs(20)).await);
    assert!(started.elapsed() >= timeout, "closed before its timeout");
    // no first bytes after the (empty) handshake; then a talking one gets the freed place
    let (addr, mut rx) = plain(limits).await;
    let started = std::time::Instant::now();
    let mut c = connect_from("127.0.0.1", addr).await;
    assert!(closed_within(&mut c, Duration::from_secs(20)).await);
    assert!(started.elapsed() >= timeout, "closed before its timeout");
    let mut t = connect_from("127.0.0.1", addr).await;
    t.write_all(b"x").await.unwrap();
    assert!(
        tokio::time::timeout(Duration::from_secs(20), rx.recv())
            .await
            .is_ok_and(|c| c.is_some())
    );
}

/// No listener takes more than an eighth of the descriptor limit, and the per-peer cap never
/// exceeds the cap in all; an ample limit changes nothing.
#[test]
fn caps_fit_within_the_descriptor_limit() {
    let d = Limits::default();
    assert_eq!(d.within_descriptors(None), d);
    assert_eq!(d.within_descriptors(Some(65_536)), d);
    let low = d.within_descriptors(Some(256));
    assert_eq!((low.max_connections, low.max_per_peer), (32, 32));
    let tiny = d.within_descriptors(Some(4));
    assert_eq!((tiny.max_connections, tiny.max_per_peer), (1, 1));
    let m = Limits::metrics().within_descriptors(Some(1024));
    assert_eq!((m.max_connections, m.max_per_peer), (64, 16));
}
