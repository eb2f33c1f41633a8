//! Inbound ports of the per-VM firewalls gpuprov creates.

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
}
