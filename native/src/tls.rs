//! TLS (rustls with the ring provider), optionally requiring client certificates, and the
//! DNS names a verified client certificate carries, handed to Python with each call.

use std::sync::Arc;

use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::{RootCertStore, ServerConfig};
use x509_parser::extensions::GeneralName;

/// An acceptor for `cert_pem` (a chain, leaf first) and `key_pem`; with `client_ca_pem`,
/// clients must present a certificate that chains to one of its CAs.
pub fn acceptor(
    cert_pem: &[u8],
    key_pem: &[u8],
    client_ca_pem: Option<&[u8]>,
) -> Result<TlsAcceptor, String> {
    let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
    let certs = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("tls_cert: {e}"))?;
    if certs.is_empty() {
        return Err("tls_cert: no certificate in the PEM".into());
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| format!("tls_key: {e}"))?;
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let builder = match client_ca_pem {
        Some(pem) => {
            let mut roots = RootCertStore::empty();
            for ca in CertificateDer::pem_slice_iter(pem) {
                let ca = ca.map_err(|e| format!("client_ca: {e}"))?;
                roots.add(ca).map_err(|e| format!("client_ca: {e}"))?;
            }
            if roots.is_empty() {
                return Err("client_ca: no certificate in the PEM".into());
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| format!("client_ca: {e}"))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .map_err(|e| format!("tls_cert/tls_key: {e}"))?;
    // gRPC is HTTP/2 only: a client that offers ALPN without h2 is refused in the handshake.
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// The DNS subject-alternative names of a (DER) certificate; not IP, URI or email ones.
pub fn dns_names(der: &[u8]) -> Vec<String> {
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(der) else {
        return Vec::new();
    };
    let Ok(Some(san)) = cert.subject_alternative_name() else {
        return Vec::new();
    };
    san.value
        .general_names
        .iter()
        .filter_map(|name| match name {
            GeneralName::DNSName(dns) => Some((*dns).to_owned()),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SANs: DNS client.example, IP 10.0.0.1, a URI, an email, DNS worker-1.cronoq.test.
    const CLIENT_PEM: &[u8] = include_bytes!("../testdata/client-sans.pem");

    #[test]
    fn only_dns_names() {
        let der = CertificateDer::from_pem_slice(CLIENT_PEM).unwrap();
        assert_eq!(
            dns_names(&der),
            vec![
                "client.example".to_owned(),
                "worker-1.cronoq.test".to_owned()
            ]
        );
    }

    #[test]
    fn garbage_has_no_names() {
        assert!(dns_names(b"not a certificate").is_empty());
    }

    #[test]
    fn refuses_half_configs() {
        assert!(acceptor(CLIENT_PEM, b"", None).is_err());
        assert!(acceptor(b"", b"", None).is_err());
    }
}
