//! The VM's startup scripts (`/scripts`), which carry its boot script: one per location
//! and text, named `gpuprov-<vm>-<lineage8>-<location>-<sha8 of the text>`.

use serde_json::{json, Value};

use super::api::StartupScript;
use super::{errors, id_of, VerdaProvider};
use crate::provider::identity::located_name;
use crate::provider::kit::Call;
use crate::provider::{BootScript, ErrorKind, ProviderError, Result};

/// The first 8 hex digits of the SHA-256 of `text`.
pub(super) fn sha8(text: &str) -> String {
    use sha2::Digest as _;
    sha2::Sha256::digest(text.as_bytes())
        .iter()
        .take(4)
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Whether `name` is a startup script of the VM whose location name is `located`:
/// `<located>-<8 hex digits>`.
pub(super) fn is_script_of(name: &str, located: &str) -> bool {
    name.strip_prefix(located)
        .and_then(|r| r.strip_prefix('-'))
        .is_some_and(|h| h.len() == 8 && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

impl VerdaProvider {
    /// The id of the VM's startup script in `location` holding `boot`'s shell form, created
    /// when missing. Errors: a boot script that cannot be rendered → `InvalidRequest`.
    pub(super) async fn ensure_script(
        &self,
        vm_name: &str,
        location: &str,
        boot: &BootScript,
    ) -> Result<String> {
        let text = boot.to_shell().map_err(|e| {
            ProviderError::new(ErrorKind::InvalidRequest, format!("boot script: {e}"))
        })?;
        let name = format!(
            "{}-{}",
            located_name(vm_name, &self.settings.lineage, location),
            sha8(&text)
        );
        let scripts: Vec<StartupScript> = self
            .api
            .get("/scripts", &[], Call::other("list startup scripts"))
            .await?;
        if let Some(s) = scripts.iter().find(|s| s.name == name && s.script == text) {
            return Ok(s.id.clone());
        }
        let what = format!("create startup script {name}");
        let body = json!({ "name": name, "script": text });
        let v: Value = self.api.post("/scripts", &body, Call::other(&what)).await?;
        id_of(&v).ok_or_else(|| {
            ProviderError::new(
                ErrorKind::Failed,
                format!("verda {what}: no script id in the answer"),
            )
        })
    }

    /// Deletes the startup scripts of the VM whose location name is `located` (not found
    /// → success).
    pub(super) async fn delete_scripts(&self, located: &str) -> Result<()> {
        let scripts: Vec<StartupScript> = self
            .api
            .get("/scripts", &[], Call::other("list startup scripts"))
            .await?;
        for s in scripts.iter().filter(|s| is_script_of(&s.name, located)) {
            let what = format!("delete startup script {}", s.name);
            self.api
                .delete(
                    &format!("/scripts/{}", s.id),
                    errors::is_gone,
                    Call::other(&what),
                )
                .await?;
        }
        Ok(())
    }
}
