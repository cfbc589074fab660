//! TLS with rustls for each `sslmode`.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, RootCertStore, SignatureScheme};

use crate::config::{Config, SslMode};
use crate::error::{Error, Result};

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Accepts any certificate (`prefer`, `require`) but still checks the
/// handshake signature, as libpq does without a root certificate.
#[derive(Debug)]
struct NoVerify(Arc<CryptoProvider>);

impl ServerCertVerifier for NoVerify {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(m, c, d, &self.0.signature_verification_algorithms)
    }
    fn verify_tls13_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(m, c, d, &self.0.signature_verification_algorithms)
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// Verifies the chain but not the host name (`verify-ca`).
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end: &CertificateDer<'_>,
        inter: &[CertificateDer<'_>],
        name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self.0.verify_server_cert(end, inter, name, ocsp, now) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            r => r,
        }
    }
    fn verify_tls12_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(m, c, d)
    }
    fn verify_tls13_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(m, c, d)
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

fn roots(config: &Config) -> Result<RootCertStore> {
    let mut store = RootCertStore::empty();
    match &config.ssl_root_cert {
        Some(path) => {
            let pem = std::fs::read(path)?;
            for cert in rustls_pemfile::certs(&mut pem.as_slice()) {
                store.add(cert?).map_err(Error::Tls)?;
            }
        }
        None => store.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
    }
    Ok(store)
}

/// The rustls client configuration for `config.ssl_mode`.
pub(crate) fn client_config(config: &Config) -> Result<Arc<rustls::ClientConfig>> {
    let provider = provider();
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(Error::Tls)?;
    let mut tls = match config.ssl_mode {
        SslMode::VerifyFull => builder
            .with_root_certificates(roots(config)?)
            .with_no_client_auth(),
        SslMode::VerifyCa => {
            let v = WebPkiServerVerifier::builder_with_provider(Arc::new(roots(config)?), provider)
                .build()
                .map_err(|e| Error::Tls(rustls::Error::General(e.to_string())))?;
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(ChainOnly(v)))
                .with_no_client_auth()
        }
        _ => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(NoVerify(provider)))
            .with_no_client_auth(),
    };
    tls.alpn_protocols = vec![b"postgresql".to_vec()];
    Ok(Arc::new(tls))
}

/// The server name to present and verify.
pub(crate) fn server_name(host: &str) -> Result<ServerName<'static>> {
    ServerName::try_from(host.to_owned()).map_err(|_| Error::Config {
        key: format!("host={host}"),
        reason: "not a valid DNS name or IP address for TLS",
    })
}

/// `tls-server-end-point` channel binding data: SHA-256 of the server's
/// certificate (correct for certificates signed with SHA-1 or SHA-256).
pub(crate) fn end_point_hash(cert: &[u8]) -> Vec<u8> {
    ring::digest::digest(&ring::digest::SHA256, cert)
        .as_ref()
        .to_vec()
}
