//! The sshd image the Docker test cloud runs: a Dockerfile layered on the base image plus
//! an entrypoint script, packed into an in-memory tar build context.
//!
//! The image tag is derived from a hash of everything that goes into it, so a change of
//! entrypoint or base image yields a new tag instead of silently reusing a stale image.

use sha2::{Digest, Sha256};

/// Repository part of every image `prepare` builds (`gpuprov/sshd:<hash>`).
pub const SSHD_REPOSITORY: &str = "gpuprov/sshd";
/// Label put on images (and containers) gpuprov manages, so they can be found and pruned.
pub const MANAGED_LABEL: &str = "gpuprov-managed";
/// Where the entrypoint lives inside the image.
const ENTRYPOINT_PATH: &str = "/usr/local/sbin/gpuprov-entrypoint.sh";
/// Name of the entrypoint file inside the build context.
const ENTRYPOINT_CONTEXT_NAME: &str = "gpuprov-entrypoint.sh";

/// The container's entrypoint. Host keys are generated per container (`ssh-keygen -A`) so
/// no two containers share one and none is baked into an image; the only credential in
/// the container is the project's *public* key, delivered through the environment.
pub const ENTRYPOINT: &str = r#"#!/bin/sh
# gpuprov Docker test cloud: run sshd in the foreground with the project's public key.
set -eu
: "${GPUPROV_AUTHORIZED_KEY:?GPUPROV_AUTHORIZED_KEY is not set}"
mkdir -p /run/sshd /root/.ssh
chmod 0755 /run/sshd
chmod 0700 /root/.ssh
umask 077
printf '%s\n' "$GPUPROV_AUTHORIZED_KEY" > /root/.ssh/authorized_keys
chmod 0600 /root/.ssh/authorized_keys
ssh-keygen -A
# -D: stay in the foreground (the container lives as long as sshd); -e: log to stderr so
# `docker logs` shows why a login failed.
exec /usr/sbin/sshd -D -e
"#;

/// The Dockerfile for `base`. Only `COPY` (no `RUN`), so the build needs no network and
/// creates no intermediate container. `CMD []` clears the base image's `/bin/bash`, which
/// would otherwise be passed to the entrypoint as an argument.
pub fn dockerfile(base: &str) -> String {
    format!(
        "FROM {base}\n\
         LABEL {MANAGED_LABEL}=true\n\
         COPY {ENTRYPOINT_CONTEXT_NAME} {ENTRYPOINT_PATH}\n\
         EXPOSE 22/tcp\n\
         ENTRYPOINT [\"{ENTRYPOINT_PATH}\"]\n\
         CMD []\n"
    )
}

/// The tag `prepare` builds for `base`: `gpuprov/sshd:<first 12 hex digits of
/// sha256(Dockerfile, entrypoint, base image name)>`.
pub fn sshd_image_tag(base: &str) -> String {
    let mut h = Sha256::new();
    // Length-prefix each part so that moving bytes between parts changes the hash.
    for part in [dockerfile(base).as_str(), ENTRYPOINT, base] {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part.as_bytes());
    }
    let digest = h.finalize();
    let hex: String = digest.iter().take(6).map(|b| format!("{b:02x}")).collect();
    format!("{SSHD_REPOSITORY}:{hex}")
}

/// The build context for `base` as an uncompressed tar archive (the Engine's `POST /build`
/// body): `Dockerfile` (0644) and the entrypoint (0755; `COPY` keeps the mode, so no
/// `RUN chmod` is needed).
pub fn build_context(base: &str) -> std::io::Result<Vec<u8>> {
    let mut builder = tar::Builder::new(Vec::new());
    for (name, body, mode) in [
        ("Dockerfile", dockerfile(base), 0o644),
        (ENTRYPOINT_CONTEXT_NAME, ENTRYPOINT.to_string(), 0o755),
    ] {
        let mut header = tar::Header::new_gnu();
        header.set_size(body.len() as u64);
        header.set_mode(mode);
        // A fixed mtime keeps the context byte-identical across runs (build cache hits).
        header.set_mtime(0);
        header.set_cksum();
        builder.append_data(&mut header, name, body.as_bytes())?;
    }
    builder.into_inner()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tag_is_stable_and_depends_on_base() {
        let a = sshd_image_tag("gpuprov/debian-sshd-base:bookworm");
        assert_eq!(a, sshd_image_tag("gpuprov/debian-sshd-base:bookworm"));
        assert_ne!(a, sshd_image_tag("other/base:1"));
        let hash = a.strip_prefix("gpuprov/sshd:").unwrap();
        assert_eq!(hash.len(), 12);
        assert!(hash.chars().all(|c| c.is_ascii_hexdigit()));
    }

    #[test]
    fn context_holds_dockerfile_and_executable_entrypoint() {
        let bytes = build_context("base:1").unwrap();
        let mut archive = tar::Archive::new(bytes.as_slice());
        let mut seen = vec![];
        for entry in archive.entries().unwrap() {
            let entry = entry.unwrap();
            let path = entry.path().unwrap().to_string_lossy().into_owned();
            seen.push((path, entry.header().mode().unwrap()));
        }
        assert_eq!(
            seen,
            vec![
                ("Dockerfile".to_string(), 0o644),
                (ENTRYPOINT_CONTEXT_NAME.to_string(), 0o755)
            ]
        );
        assert!(dockerfile("base:1").starts_with("FROM base:1\n"));
    }

    #[test]
    fn entrypoint_does_what_the_contract_says() {
        for needle in [
            "mkdir -p /run/sshd /root/.ssh",
            "/root/.ssh/authorized_keys",
            "chmod 0600 /root/.ssh/authorized_keys",
            "ssh-keygen -A",
            "exec /usr/sbin/sshd -D -e",
        ] {
            assert!(ENTRYPOINT.contains(needle), "{needle}");
        }
    }
}
