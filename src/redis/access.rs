//! How the store proves who it is and checks whom it talks to: an ACL user's credentials and, with
//! the `redis-tls` feature, TLS (the server's certificate checked against the system's roots or a
//! CA the operator gives, and a client certificate for mutual TLS).
//!
//! Secrets never leave these types as text: their `Debug` shows that a password or a key is set,
//! never what it is, and no error of the store quotes a URL.

use alloc::string::String;
#[cfg(feature = "redis-tls")]
use alloc::vec::Vec;
use core::fmt;

use redis::{ConnectionAddr, ConnectionInfo, ErrorKind, RedisError, RedisResult};

/// An ACL user and its password, for servers that ask for them (`AUTH user password`). Given in
/// [`RedisOptions::with_credentials`](super::RedisOptions::with_credentials), they take the place
/// of any in the URL.
#[derive(Clone)]
pub(crate) struct Credentials {
    user: String,
    password: String,
}

impl Credentials {
    pub(crate) fn new(user: String, password: String) -> Credentials {
        Credentials { user, password }
    }

    pub(crate) fn user(&self) -> &str {
        &self.user
    }

    pub(crate) fn password(&self) -> &str {
        &self.password
    }
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The user names an account, not a secret; the password is never printed.
        f.debug_struct("Credentials")
            .field("user", &self.user)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// What a TLS connection trusts and presents (feature `redis-tls`): the CA that signs the
/// servers' certificates (the system's roots when none is given), and a client certificate with
/// its key for servers that ask for one (`tls-auth-clients yes`). A `rediss://` URL turns TLS
/// on; these options without one are refused, never ignored.
///
/// ```
/// use atomic_limiter::redis::{RedisOptions, TlsOptions};
///
/// # fn run(ca: Vec<u8>, cert: Vec<u8>, key: Vec<u8>) {
/// let options = RedisOptions::default()
///     .with_tls(TlsOptions::new().with_ca(ca).with_client_certificate(cert, key));
/// # let _ = options;
/// # }
/// ```
#[cfg(feature = "redis-tls")]
#[derive(Clone, Default)]
pub struct TlsOptions {
    ca: Option<Vec<u8>>,
    client: Option<(Vec<u8>, Vec<u8>)>,
}

#[cfg(feature = "redis-tls")]
impl TlsOptions {
    /// Trusts the system's roots, presents no client certificate.
    pub fn new() -> TlsOptions {
        TlsOptions::default()
    }

    /// Trusts only the CA certificates in `pem` (one or more, PEM): a private CA's servers.
    pub fn with_ca(mut self, pem: Vec<u8>) -> TlsOptions {
        self.ca = Some(pem);
        self
    }

    /// Presents `certificate_pem` (its chain, PEM) and proves it with `key_pem` (PEM), for mutual
    /// TLS.
    pub fn with_client_certificate(
        mut self,
        certificate_pem: Vec<u8>,
        key_pem: Vec<u8>,
    ) -> TlsOptions {
        self.client = Some((certificate_pem, key_pem));
        self
    }

    fn certificates(&self) -> redis::TlsCertificates {
        redis::TlsCertificates {
            client_tls: self.client.as_ref().map(|(client_cert, client_key)| {
                redis::ClientTlsConfig {
                    client_cert: client_cert.clone(),
                    client_key: client_key.clone(),
                }
            }),
            root_cert: self.ca.clone(),
        }
    }
}

#[cfg(feature = "redis-tls")]
impl fmt::Debug for TlsOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Certificates are public, but a key is not: neither is printed, only whether it is set.
        let set = |on: bool| if on { "<set>" } else { "<not set>" };
        f.debug_struct("TlsOptions")
            .field("ca", &set(self.ca.is_some()))
            .field("client_certificate", &set(self.client.is_some()))
            .finish()
    }
}

/// The store's way in: credentials and TLS, applied to every connection it makes.
#[derive(Clone, Debug, Default)]
pub(crate) struct Access {
    pub(crate) credentials: Option<Credentials>,
    #[cfg(feature = "redis-tls")]
    pub(crate) tls: Option<TlsOptions>,
}

impl Access {
    /// A client for `info` with this access: the credentials in place of the URL's, and the TLS
    /// options where the URL asks for TLS. TLS options on a plain `redis://` URL are an error.
    pub(crate) fn client(&self, mut info: ConnectionInfo) -> RedisResult<redis::Client> {
        if let Some(c) = &self.credentials {
            let settings = info
                .redis_settings()
                .clone()
                .set_username(&c.user)
                .set_password(&c.password);
            info = info.set_redis_settings(settings);
        }
        #[cfg(feature = "redis-tls")]
        {
            // Whichever provider the rest of the program enables, rustls needs one installed to
            // build a configuration without being told; ring's, unless one already is.
            let _ = rustls::crypto::ring::default_provider().install_default();
            if let Some(tls) = &self.tls {
                if !matches!(info.addr(), ConnectionAddr::TcpTls { .. }) {
                    return Err(RedisError::from((
                        ErrorKind::InvalidClientConfig,
                        "TLS options were given for a plain redis:// address; use rediss://",
                    )));
                }
                return redis::Client::build_with_tls(info, tls.certificates());
            }
        }
        redis::Client::open(info)
    }

    /// The TLS options, for the Sentinel client's connections to the master.
    #[cfg(feature = "redis-tls")]
    pub(crate) fn tls_certificates(&self) -> Option<redis::TlsCertificates> {
        self.tls.as_ref().map(TlsOptions::certificates)
    }
}

/// The address `host:port` connected to as `like` is: over TLS with the same checks where `like`
/// is TLS, plain otherwise.
pub(crate) fn same_kind(like: &ConnectionAddr, host: &str, port: u16) -> ConnectionAddr {
    match like {
        ConnectionAddr::TcpTls {
            insecure,
            tls_params,
            ..
        } => ConnectionAddr::TcpTls {
            host: host.into(),
            port,
            insecure: *insecure,
            tls_params: tls_params.clone(),
        },
        _ => ConnectionAddr::Tcp(host.into(), port),
    }
}

/// Whether a failed first connection may be waited out (the server is down or slow: the store
/// connects on first use, the failure policy deciding meanwhile) rather than refused at once (a
/// wrong password, a certificate that does not verify, a bad address: no retry will help).
pub(crate) fn may_come_up(e: &RedisError) -> bool {
    match e.kind() {
        ErrorKind::AuthenticationFailed | ErrorKind::InvalidClientConfig => false,
        ErrorKind::Server(redis::ServerErrorKind::NoPerm) => false,
        ErrorKind::Io => e.is_connection_refusal() || e.is_timeout() || e.is_connection_dropped(),
        _ => true,
    }
}
