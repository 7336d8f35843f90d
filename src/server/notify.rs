//! systemd readiness (`Type=notify`): a datagram to `$NOTIFY_SOCKET`, nothing when unset.

/// Send `state` (e.g. `READY=1`) to systemd's notification socket, if there is one.
pub fn sd_notify(state: &str) -> std::io::Result<()> {
    use std::os::unix::net::UnixDatagram;
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return Ok(());
    };
    let sock = UnixDatagram::unbound()?;
    let path = path.to_string_lossy().into_owned();
    if let Some(name) = path.strip_prefix('@') {
        use std::os::linux::net::SocketAddrExt;
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
        sock.send_to_addr(state.as_bytes(), &addr)?;
    } else {
        sock.send_to(state.as_bytes(), &path)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn no_socket_is_fine() {
        // NOTIFY_SOCKET is not set under cargo test.
        if std::env::var_os("NOTIFY_SOCKET").is_none() {
            assert!(super::sd_notify("READY=1").is_ok());
        }
    }
}
