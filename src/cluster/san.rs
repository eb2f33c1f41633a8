//! The TLS subject alternative names (SANs) of a VM's Kubernetes API certificate, and the
//! check that a certificate covers the host the user will connect to (design 4.5, "TLS
//! SAN").
//!
//! k3s puts every `tls-san` entry of `/etc/rancher/k3s/config.yaml` into the API server's
//! serving certificate (k3s docs, "Server configuration: `--tls-san`"). gpuprov renders
//! that list from [`SanList`]; `Validating` later reads the certificate the API actually
//! serves and asks [`cert_coverage`] whether the host in the user's kubeconfig is in it.

use std::fmt;
use std::net::IpAddr;

use thiserror::Error;

/// One subject alternative name: an IP address or a DNS name.
///
/// DNS names are kept lowercase (DNS is case-insensitive, RFC 4343), IPs in their
/// canonical text form, so equal names compare equal.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum San {
    Ip(IpAddr),
    Dns(String),
}

impl San {
    /// Parses a host as the user or a cloud gives it: an IPv4/IPv6 address (IPv6 may be
    /// in brackets, as in a URL) or a DNS name (letters, digits, `-` and `.`, labels of
    /// 1–63 characters, at most 253 in all; one leading `*.` wildcard label allowed, as
    /// k3s accepts it).
    ///
    /// Errors: anything else, naming the value (a host name is not a secret).
    pub fn parse(s: &str) -> Result<San, SanError> {
        let t = s.trim();
        let unbracketed = t
            .strip_prefix('[')
            .and_then(|r| r.strip_suffix(']'))
            .unwrap_or(t);
        if let Ok(ip) = unbracketed.parse::<IpAddr>() {
            return Ok(San::Ip(ip));
        }
        let name = t.trim_end_matches('.').to_ascii_lowercase();
        let body = name.strip_prefix("*.").unwrap_or(&name);
        let label_ok = |l: &str| {
            !l.is_empty()
                && l.len() <= 63
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        };
        if name.is_empty() || name.len() > 253 || !body.split('.').all(label_ok) {
            return Err(SanError::InvalidName(s.to_string()));
        }
        Ok(San::Dns(name))
    }
}

impl fmt::Display for San {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            San::Ip(ip) => write!(f, "{ip}"),
            San::Dns(d) => f.write_str(d),
        }
    }
}

/// Errors of SAN handling. No variant carries key material.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SanError {
    #[error("`{0}` is neither an IP address nor a valid DNS name")]
    InvalidName(String),
    #[error("the API certificate is not a readable PEM X.509 certificate: {0}")]
    BadCertificate(String),
}

/// The deduplicated, ordered TLS SAN list of one VM.
///
/// Order is stable so the rendered k3s config is byte-identical across runs with the same
/// inputs, which is what lets the installer restart k3s only when the list really changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SanList(Vec<San>);

/// What the SAN list of a VM is built from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SanInputs {
    /// The public IP or DNS name the user reaches the VM at (`Endpoint::host`), if any.
    pub public_host: Option<String>,
    /// The VM's private (VPC) IP, if the cloud reports one.
    pub private_ip: Option<IpAddr>,
    /// `tls_san` names from the user's config, in config order.
    pub extra: Vec<String>,
}

impl SanList {
    /// Builds the list in this order: public host, `127.0.0.1`, `localhost`, private IP,
    /// the user's extra names; later duplicates are dropped. `127.0.0.1` is what an SSH
    /// tunnel connects to (`gpuprov tunnel`), so it is always present.
    ///
    /// Errors: a public host or extra name that is not an IP or DNS name.
    pub fn for_vm(inputs: &SanInputs) -> Result<SanList, SanError> {
        let mut list = SanList::default();
        if let Some(h) = &inputs.public_host {
            list.push(San::parse(h)?);
        }
        list.push(San::Ip(IpAddr::from([127, 0, 0, 1])));
        list.push(San::Dns("localhost".into()));
        if let Some(ip) = inputs.private_ip {
            list.push(San::Ip(ip));
        }
        for e in &inputs.extra {
            list.push(San::parse(e)?);
        }
        Ok(list)
    }

    /// Appends `san` unless it is already present.
    pub fn push(&mut self, san: San) {
        if !self.0.contains(&san) {
            self.0.push(san);
        }
    }

    /// The names in order.
    pub fn as_slice(&self) -> &[San] {
        &self.0
    }

    /// Whether `host` (as [`San::parse`] reads it) is in the list.
    pub fn contains_host(&self, host: &str) -> bool {
        San::parse(host).is_ok_and(|h| self.0.contains(&h))
    }

    /// The comma-separated form the installer reads from `GPUPROV_TLS_SANS`. Safe to
    /// split on `,`: no valid name contains one.
    pub fn to_env_value(&self) -> String {
        self.0
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// Whether a certificate covers a host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Coverage {
    Covered,
    /// The host is not among the certificate's SANs, which are listed for the message.
    Missing {
        host: San,
        cert_sans: Vec<San>,
    },
}

/// The SANs (DNS names and IP addresses) of the first certificate in `pem` (the leaf, when
/// `pem` is a chain). Other name kinds (e-mail, URI) are skipped; a DNS name that is not a
/// valid host name is skipped too.
///
/// Errors: no PEM certificate, or DER that does not parse as X.509.
pub fn cert_sans(pem: &str) -> Result<Vec<San>, SanError> {
    use x509_parser::extensions::GeneralName;

    let (_, pem) = x509_parser::pem::parse_x509_pem(pem.as_bytes())
        .map_err(|e| SanError::BadCertificate(e.to_string()))?;
    let cert = pem
        .parse_x509()
        .map_err(|e| SanError::BadCertificate(e.to_string()))?;
    let ext = cert
        .subject_alternative_name()
        .map_err(|e| SanError::BadCertificate(e.to_string()))?;
    let mut out = Vec::new();
    for name in ext.map(|e| &e.value.general_names).into_iter().flatten() {
        let san = match name {
            // A DNS SAN that spells an IP stays a DNS name: TLS clients never match it
            // against an IP host.
            GeneralName::DNSName(d) => San::parse(d).ok().map(|s| match s {
                San::Ip(_) => San::Dns(d.to_ascii_lowercase()),
                dns => dns,
            }),
            GeneralName::IPAddress(b) => <[u8; 4]>::try_from(*b)
                .map(IpAddr::from)
                .or_else(|_| <[u8; 16]>::try_from(*b).map(IpAddr::from))
                .ok()
                .map(San::Ip),
            _ => None,
        };
        if let Some(s) = san {
            if !out.contains(&s) {
                out.push(s);
            }
        }
    }
    Ok(out)
}

/// Whether the certificate in `pem` is valid for `host` by its SANs, as a TLS client
/// checks it (RFC 6125): an IP host needs an IP SAN with that address (a DNS SAN spelling
/// the IP does not count); a DNS host needs an equal DNS SAN or a `*.` wildcard covering
/// exactly its first label. The subject CN is ignored, as Go's TLS (kubectl) ignores it.
///
/// Errors: `host` is not a host name, or `pem` is not a certificate.
pub fn cert_coverage(pem: &str, host: &str) -> Result<Coverage, SanError> {
    let host = San::parse(host)?;
    let sans = cert_sans(pem)?;
    let covered = sans.iter().any(|s| match (s, &host) {
        (San::Ip(a), San::Ip(b)) => a == b,
        (San::Dns(pattern), San::Dns(h)) => dns_matches(pattern, h),
        _ => false,
    });
    Ok(if covered {
        Coverage::Covered
    } else {
        Coverage::Missing {
            host,
            cert_sans: sans,
        }
    })
}

/// RFC 6125 6.4.3 matching, restricted to a whole-label leftmost wildcard.
fn dns_matches(pattern: &str, host: &str) -> bool {
    match pattern.strip_prefix("*.") {
        Some(suffix) => host
            .split_once('.')
            .is_some_and(|(first, rest)| !first.is_empty() && rest == suffix),
        None => pattern == host,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(l: &SanList) -> Vec<String> {
        l.as_slice().iter().map(ToString::to_string).collect()
    }

    #[test]
    fn list_order_and_dedup() {
        let l = SanList::for_vm(&SanInputs {
            public_host: Some("203.0.113.7".into()),
            private_ip: Some("10.0.0.5".parse().unwrap()),
            extra: vec![
                "GPU.Example.com.".into(),
                "gpu.example.com".into(),
                "203.0.113.7".into(),
                "localhost".into(),
                "[2001:db8::1]".into(),
                "2001:DB8:0::1".into(),
            ],
        })
        .unwrap();
        assert_eq!(
            names(&l),
            [
                "203.0.113.7",
                "127.0.0.1",
                "localhost",
                "10.0.0.5",
                "gpu.example.com",
                "2001:db8::1"
            ]
        );
        assert_eq!(
            l.to_env_value(),
            "203.0.113.7,127.0.0.1,localhost,10.0.0.5,gpu.example.com,2001:db8::1"
        );
        assert!(l.contains_host("GPU.example.com"));
        assert!(!l.contains_host("other.example.com"));
    }

    #[test]
    fn list_without_public_host_still_has_loopback() {
        let l = SanList::for_vm(&SanInputs::default()).unwrap();
        assert_eq!(names(&l), ["127.0.0.1", "localhost"]);
    }

    #[test]
    fn same_inputs_same_list() {
        let i = SanInputs {
            public_host: Some("h.example".into()),
            private_ip: None,
            extra: vec!["a.example".into(), "b.example".into()],
        };
        assert_eq!(SanList::for_vm(&i), SanList::for_vm(&i));
    }

    #[test]
    fn bad_names_are_rejected() {
        for bad in [
            "",
            "a b",
            "a,b",
            "x\"y",
            "-lead.example",
            "trail-.example",
            "a..b",
            "$(reboot)",
            "é.example",
            &"a".repeat(64),
            "*.*.example",
        ] {
            assert!(
                matches!(San::parse(bad), Err(SanError::InvalidName(_))),
                "{bad:?}"
            );
            let r = SanList::for_vm(&SanInputs {
                extra: vec![bad.to_string()],
                ..Default::default()
            });
            assert!(r.is_err(), "{bad:?}");
        }
        assert_eq!(
            San::parse("*.nodes.example").unwrap(),
            San::Dns("*.nodes.example".into())
        );
    }

    fn cert(sans: &[&str]) -> String {
        rcgen::generate_simple_self_signed(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>())
            .unwrap()
            .cert
            .pem()
    }

    #[test]
    fn cert_sans_are_read() {
        let pem = cert(&["localhost", "203.0.113.7", "::1", "Api.Example.com"]);
        assert_eq!(
            cert_sans(&pem).unwrap(),
            vec![
                San::Dns("localhost".into()),
                San::Ip("203.0.113.7".parse().unwrap()),
                San::Ip("::1".parse().unwrap()),
                San::Dns("api.example.com".into()),
            ]
        );
    }

    #[test]
    fn coverage_by_ip_and_name() {
        let pem = cert(&["127.0.0.1", "localhost", "*.nodes.example", "api.example"]);
        let cov = |h: &str| cert_coverage(&pem, h).unwrap();
        assert_eq!(cov("127.0.0.1"), Coverage::Covered);
        assert_eq!(cov("LOCALHOST"), Coverage::Covered);
        assert_eq!(cov("api.example"), Coverage::Covered);
        assert_eq!(cov("gpu1.nodes.example"), Coverage::Covered);
        // A wildcard covers exactly one label.
        assert!(matches!(cov("a.b.nodes.example"), Coverage::Missing { .. }));
        assert!(matches!(cov("nodes.example"), Coverage::Missing { .. }));
        match cov("203.0.113.7") {
            Coverage::Missing { host, cert_sans } => {
                assert_eq!(host, San::Ip("203.0.113.7".parse().unwrap()));
                assert_eq!(cert_sans.len(), 4);
            }
            c => panic!("{c:?}"),
        }
    }

    #[test]
    fn dns_san_spelling_an_ip_does_not_cover_the_ip() {
        // rcgen makes "203.0.113.7" an IP SAN, so build the DNS-spelled one by hand.
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.subject_alt_names = vec![rcgen::SanType::DnsName(
            "203.0.113.7".to_string().try_into().unwrap(),
        )];
        let key = rcgen::KeyPair::generate().unwrap();
        let pem = params.self_signed(&key).unwrap().pem();
        assert!(matches!(
            cert_coverage(&pem, "203.0.113.7").unwrap(),
            Coverage::Missing { .. }
        ));
    }

    #[test]
    fn chain_uses_the_leaf() {
        let leaf = cert(&["leaf.example"]);
        let other = cert(&["other.example"]);
        let chain = format!("{leaf}{other}");
        assert_eq!(
            cert_coverage(&chain, "leaf.example").unwrap(),
            Coverage::Covered
        );
        assert!(matches!(
            cert_coverage(&chain, "other.example").unwrap(),
            Coverage::Missing { .. }
        ));
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        for bad in [
            "",
            "not a cert",
            "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
            "-----BEGIN CERTIFICATE-----\n!!!\n-----END CERTIFICATE-----\n",
        ] {
            assert!(
                matches!(cert_sans(bad), Err(SanError::BadCertificate(_))),
                "{bad:?}"
            );
        }
        assert!(matches!(
            cert_coverage(&cert(&["a.example"]), "not a host"),
            Err(SanError::InvalidName(_))
        ));
    }
}
