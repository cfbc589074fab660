//! Startup and authentication (cleartext, MD5, SCRAM-SHA-256 with channel binding).

use bytes::BytesMut;
use fallible_iterator::FallibleIterator;
use postgres_protocol::authentication::{md5_hash, sasl};
use postgres_protocol::message::backend::Message;
use postgres_protocol::message::frontend;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

use crate::config::{ChannelBinding, Config};
use crate::error::{Error, Result};
use crate::framing::{Backend, FrameReader};

/// What the server told us during startup.
#[derive(Debug, Default)]
pub(crate) struct StartupInfo {
    pub(crate) parameters: Vec<(String, String)>,
    pub(crate) backend_pid: i32,
}

async fn send<W: AsyncWrite + Unpin>(w: &mut W, buf: &mut BytesMut) -> Result<()> {
    w.write_all(buf).await?;
    w.flush().await?;
    buf.clear();
    Ok(())
}

/// Sends the startup packet (`replication` = `database`, `true` or none), then
/// authenticates and waits for ReadyForQuery.
pub(crate) async fn startup<R, W>(
    config: &Config,
    tls_end_point: Option<Vec<u8>>,
    r: &mut FrameReader<R>,
    w: &mut W,
    replication: Option<&str>,
) -> Result<StartupInfo>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = BytesMut::new();
    let mut params: Vec<(&str, &str)> = vec![
        ("user", &config.user),
        ("database", &config.dbname),
        ("client_encoding", "UTF8"),
        // Fixed text formats, so that typed decoding is unambiguous.
        ("DateStyle", "ISO"),
        ("TimeZone", "UTC"),
        ("bytea_output", "hex"),
        ("extra_float_digits", "3"),
    ];
    if let Some(mode) = replication {
        params.push(("replication", mode));
    }
    if let Some(a) = &config.application_name {
        params.push(("application_name", a));
    }
    frontend::startup_message(params.iter().copied(), &mut buf)?;
    send(w, &mut buf).await?;

    let password = || config.resolve_password().ok_or(Error::PasswordMissing);
    let require_binding = config.channel_binding == ChannelBinding::Require;
    let mut bound = false;
    loop {
        let m = match r.read_ok().await? {
            Backend::Other(m) => m,
            Backend::CopyData(_) => {
                return Err(Error::UnexpectedMessage {
                    context: "authentication",
                    tag: b'd',
                })
            }
            Backend::CopyBothResponse => {
                return Err(Error::UnexpectedMessage {
                    context: "authentication",
                    tag: b'W',
                })
            }
        };
        match m {
            Message::AuthenticationOk if require_binding && !bound => {
                return Err(Error::UnsupportedAuthentication(
                    "channel_binding=require, but the server authenticated without it",
                ))
            }
            Message::AuthenticationOk => break,
            Message::AuthenticationCleartextPassword => {
                frontend::password_message(password()?.as_bytes(), &mut buf)?;
                send(w, &mut buf).await?;
            }
            Message::AuthenticationMd5Password(body) => {
                let h = md5_hash(config.user.as_bytes(), password()?.as_bytes(), body.salt());
                frontend::password_message(h.as_bytes(), &mut buf)?;
                send(w, &mut buf).await?;
            }
            Message::AuthenticationSasl(body) => {
                let mut plus = false;
                let mut plain = false;
                let mut mechs = body.mechanisms();
                while let Some(m) = mechs.next()? {
                    plus |= m == sasl::SCRAM_SHA_256_PLUS;
                    plain |= m == sasl::SCRAM_SHA_256;
                }
                let tls_end_point = tls_end_point
                    .as_ref()
                    .filter(|_| config.channel_binding != ChannelBinding::Disable);
                if require_binding && !(plus && tls_end_point.is_some()) {
                    return Err(Error::UnsupportedAuthentication(
                        "channel_binding=require, but SCRAM-SHA-256-PLUS is not available",
                    ));
                }
                bound = plus && tls_end_point.is_some();
                let (mechanism, binding) = match (tls_end_point, plus, plain) {
                    (Some(ep), true, _) => (
                        sasl::SCRAM_SHA_256_PLUS,
                        sasl::ChannelBinding::tls_server_end_point(ep.clone()),
                    ),
                    (Some(_), false, true) => {
                        (sasl::SCRAM_SHA_256, sasl::ChannelBinding::unrequested())
                    }
                    (None, _, true) => (sasl::SCRAM_SHA_256, sasl::ChannelBinding::unsupported()),
                    _ => {
                        return Err(Error::UnsupportedAuthentication(
                            "SASL without SCRAM-SHA-256",
                        ))
                    }
                };
                let mut scram = sasl::ScramSha256::new(password()?.as_bytes(), binding);
                frontend::sasl_initial_response(mechanism, scram.message(), &mut buf)?;
                send(w, &mut buf).await?;
                match r.read_ok().await? {
                    Backend::Other(Message::AuthenticationSaslContinue(b)) => {
                        scram.update(b.data()).map_err(Error::Sasl)?
                    }
                    _ => {
                        return Err(Error::UnexpectedMessage {
                            context: "SCRAM continue",
                            tag: b'R',
                        })
                    }
                }
                frontend::sasl_response(scram.message(), &mut buf)?;
                send(w, &mut buf).await?;
                match r.read_ok().await? {
                    Backend::Other(Message::AuthenticationSaslFinal(b)) => {
                        scram.finish(b.data()).map_err(Error::Sasl)?
                    }
                    _ => {
                        return Err(Error::UnexpectedMessage {
                            context: "SCRAM final",
                            tag: b'R',
                        })
                    }
                }
            }
            Message::AuthenticationGss | Message::AuthenticationGssContinue(_) => {
                return Err(Error::UnsupportedAuthentication("GSSAPI"))
            }
            Message::AuthenticationSspi => return Err(Error::UnsupportedAuthentication("SSPI")),
            Message::AuthenticationKerberosV5 => {
                return Err(Error::UnsupportedAuthentication("Kerberos V5"))
            }
            Message::AuthenticationScmCredential => {
                return Err(Error::UnsupportedAuthentication("SCM credential"))
            }
            _ => {
                return Err(Error::UnexpectedMessage {
                    context: "authentication",
                    tag: b'?',
                })
            }
        }
    }
    let mut info = StartupInfo::default();
    loop {
        match r.read().await? {
            Backend::Other(Message::ParameterStatus(p)) => {
                info.parameters
                    .push((p.name()?.to_owned(), p.value()?.to_owned()));
            }
            Backend::Other(Message::BackendKeyData(k)) => info.backend_pid = k.process_id(),
            Backend::Other(Message::ReadyForQuery(_)) => return Ok(info),
            Backend::Other(Message::ErrorResponse(b)) => {
                return Err(Error::Db(crate::framing::db_error(b.fields())?))
            }
            Backend::Other(Message::NoticeResponse(_)) => {}
            _ => {
                return Err(Error::UnexpectedMessage {
                    context: "startup",
                    tag: b'?',
                })
            }
        }
    }
}
