//! Loopback ports for the servers the tests start.

/// A free loopback port, bound and released: another process may take it before the caller
/// binds it, so a harness checks that what answers there is its own.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}
