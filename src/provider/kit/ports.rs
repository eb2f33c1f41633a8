//! Inbound ports of the per-VM firewalls gpuprov creates, and the SSH endpoint of a listed
//! instance.

use super::super::SshEndpoint;

/// The SSH endpoint `user@ip:port` of an instance whose listing carries `ip`; `None`
/// while the address is missing or blank (the instance is still booting).
pub fn ssh_at(ip: Option<&str>, port: u16, user: &str) -> Option<SshEndpoint> {
    ip.map(str::trim)
        .filter(|ip| !ip.is_empty())
        .map(|ip| SshEndpoint {
            host: ip.to_string(),
            port,
            user: Some(user.to_string()),
        })
}

/// The TCP ports a VM's firewall opens: 22 (SSH) and `ports`, each once, ascending.
pub fn with_ssh(ports: &[u16]) -> Vec<u16> {
    let mut all: Vec<u16> = vec![22];
    all.extend(ports.iter().copied());
    all.sort_unstable();
    all.dedup();
    all
}

#[cfg(test)]
mod tests {
    #[test]
    fn ssh_is_always_open_and_ports_are_listed_once() {
        assert_eq!(super::with_ssh(&[]), [22]);
        assert_eq!(super::with_ssh(&[8080, 22, 443, 8080]), [22, 443, 8080]);
    }

    #[test]
    fn an_endpoint_needs_an_address() {
        assert_eq!(super::ssh_at(Some("  "), 22, "root"), None);
        assert_eq!(super::ssh_at(None, 22, "root"), None);
        let ep = super::ssh_at(Some(" 10.0.0.1 "), 2222, "ubuntu").unwrap();
        assert_eq!(
            (ep.host.as_str(), ep.port, ep.user.as_deref()),
            ("10.0.0.1", 2222, Some("ubuntu"))
        );
    }
}
