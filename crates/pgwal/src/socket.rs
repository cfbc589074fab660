//! Opening the transport: TCP, then TLS as `sslmode` asks.

use bytes::BytesMut;
use postgres_protocol::message::frontend;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
#[cfg(unix)]
use tokio::net::UnixStream;
use tokio_rustls::TlsConnector;

use crate::config::{Config, SslMode};
use crate::error::{Error, Result};
use crate::low_water::LowWater;
use crate::tls;

/// A byte stream to the server, plain or TLS.
pub(crate) trait Socket: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Socket for T {}

/// An open transport.
pub(crate) struct Transport {
    pub(crate) io: Box<dyn Socket>,
    /// Channel binding data when TLS is in use.
    pub(crate) tls_end_point: Option<Vec<u8>>,
    /// The receive low-water mark of the TCP socket under `io` (plain or
    /// TLS); `None` for a Unix-domain socket or where unsupported.
    pub(crate) low_water: Option<LowWater>,
}

/// Awaits `connect`, bounded by `connect_timeout` when one is set.
async fn with_timeout<T>(
    config: &Config,
    connect: impl std::future::Future<Output = std::io::Result<T>>,
) -> Result<T> {
    Ok(match config.connect_timeout {
        Some(t) => tokio::time::timeout(t, connect).await.map_err(|_| {
            Error::Io(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "connect timeout",
            ))
        })??,
        None => connect.await?,
    })
}

async fn tcp(config: &Config) -> Result<TcpStream> {
    let s = with_timeout(config, TcpStream::connect((config.tcp_host(), config.port)))
        .await
        .map_err(|e| match e {
            // which server refused or did not answer, as libpq says
            Error::Io(io) => Error::Io(std::io::Error::new(
                io.kind(),
                format!("{}:{}: {io}", config.tcp_host(), config.port),
            )),
            e => e,
        })?;
    s.set_nodelay(true)?;
    keepalives(config, &s)?;
    Ok(s)
}

/// libpq's `keepalives*` and `tcp_user_timeout` on a connected socket.
fn keepalives(config: &Config, s: &TcpStream) -> Result<()> {
    let sock = socket2::SockRef::from(s);
    sock.set_keepalive(config.keepalives)?;
    if config.keepalives {
        let mut k = socket2::TcpKeepalive::new();
        let mut set = false;
        if let Some(idle) = config.keepalives_idle {
            k = k.with_time(idle);
            set = true;
        }
        #[cfg(any(
            target_os = "linux",
            target_os = "android",
            target_os = "macos",
            target_os = "freebsd"
        ))]
        {
            if let Some(interval) = config.keepalives_interval {
                k = k.with_interval(interval);
                set = true;
            }
            if let Some(count) = config.keepalives_count {
                k = k.with_retries(count);
                set = true;
            }
        }
        if set {
            sock.set_tcp_keepalive(&k)?;
        }
    }
    #[cfg(any(target_os = "linux", target_os = "android"))]
    if let Some(t) = config.tcp_user_timeout {
        sock.set_tcp_user_timeout(Some(t))?;
    }
    Ok(())
}

async fn handshake(
    config: &Config,
    s: TcpStream,
    low_water: Option<LowWater>,
) -> Result<Transport> {
    let connector = TlsConnector::from(tls::client_config(config)?);
    let tls = connector
        .connect(tls::server_name(config.tcp_host())?, s)
        .await
        .map_err(
            |e| match e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) {
                Some(t) => Error::Tls(t.clone()),
                None => Error::Io(e),
            },
        )?;
    let end_point = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .map(|c| tls::end_point_hash(c.as_ref()));
    Ok(Transport {
        io: Box::new(tls),
        tls_end_point: end_point,
        low_water,
    })
}

/// Connects and negotiates TLS (never over a Unix-domain socket, as libpq).
pub(crate) async fn connect(config: &Config) -> Result<Transport> {
    #[cfg(not(unix))]
    if let Some(path) = config.unix_socket() {
        return Err(Error::Io(std::io::Error::new(
            std::io::ErrorKind::Unsupported,
            format!(
                "{}: Unix-domain sockets are not available on this platform; use a TCP host",
                path.display()
            ),
        )));
    }
    #[cfg(unix)]
    if let Some(path) = config.unix_socket() {
        let s = with_timeout(config, UnixStream::connect(&path))
            .await
            .map_err(|e| match e {
                Error::Io(io) => Error::Io(std::io::Error::new(
                    io.kind(),
                    format!("{}: {io}", path.display()),
                )),
                e => e,
            })?;
        return Ok(Transport {
            io: Box::new(s),
            tls_end_point: None,
            low_water: None,
        });
    }
    let mut s = tcp(config).await?;
    let low_water = LowWater::for_socket(&s);
    if config.ssl_mode == SslMode::Disable {
        return Ok(Transport {
            io: Box::new(s),
            tls_end_point: None,
            low_water,
        });
    }
    if config.ssl_direct {
        return handshake(config, s, low_water).await;
    }
    let mut buf = BytesMut::new();
    frontend::ssl_request(&mut buf);
    s.write_all(&buf).await?;
    let answer = s.read_u8().await?;
    match answer {
        b'S' => handshake(config, s, low_water).await,
        b'N' if config.ssl_mode == SslMode::Prefer => Ok(Transport {
            io: Box::new(s),
            tls_end_point: None,
            low_water,
        }),
        b'N' => Err(Error::TlsRefused),
        tag => Err(Error::UnexpectedMessage {
            context: "SSL negotiation",
            tag,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_refused_connection_names_the_host_and_port() {
        // port 1 on loopback: nothing listens there
        let config: Config = "host=127.0.0.1 port=1 user=u dbname=d".parse().unwrap();
        let err = match connect(&config).await {
            Err(e) => e,
            Ok(_) => panic!("something listens on 127.0.0.1:1"),
        };
        assert!(matches!(err, Error::Io(_)), "{err:?}");
        assert!(err.is_transient());
        let text = err.to_string();
        assert!(text.contains("127.0.0.1:1: "), "{text}");
    }
}
