//! Building the sshd image (`prepare`): the build context from [`super::image`], the
//! Engine's build stream, and the tail of its log when it fails.

use super::*;

impl DockerProvider {
    /// Builds `tag` from `base` through `POST /build` (classic builder) and checks the
    /// result. Build errors arrive in the JSON stream (`error`/`errorDetail`), not as an
    /// HTTP status, so the stream is read to the end.
    pub(super) async fn build_sshd_image(
        &self,
        docker: &Docker,
        base: &str,
        tag: &str,
    ) -> Result<()> {
        let context = image::build_context(base).map_err(|e| {
            ProviderError::new(ErrorKind::Failed, format!("packing the build context: {e}"))
        })?;
        let options = BuildImageOptions {
            dockerfile: "Dockerfile".to_string(),
            t: Some(tag.to_string()),
            rm: true,
            forcerm: true,
            // Never contact a registry: the base image is local by contract.
            pull: None,
            labels: Some(HashMap::from([(
                MANAGED_LABEL.to_string(),
                "true".to_string(),
            )])),
            ..Default::default()
        };
        let mut stream =
            docker.build_image(options, None, Some(bollard::body_full(context.into())));
        let mut log: Vec<String> = Vec::new();
        let mut failure: Option<String> = None;
        while let Some(item) = stream.next().await {
            match item {
                Ok(info) => {
                    if let Some(s) = info.stream {
                        log.extend(
                            s.lines()
                                .filter(|l| !l.trim().is_empty())
                                .map(str::to_string),
                        );
                    }
                    let detail = info.error_detail.and_then(|d| d.message);
                    if let Some(e) = info.error.or(detail) {
                        failure = Some(e);
                    }
                }
                Err(e @ DockerError::DockerStreamError { .. }) => {
                    failure = Some(e.to_string());
                    break;
                }
                Err(e) => return Err(self.err(e)),
            }
        }
        if let Some(reason) = failure {
            let tail = log[log.len().saturating_sub(BUILD_LOG_TAIL)..].join("\n");
            return Err(ProviderError::new(
                ErrorKind::Failed,
                format!(
                    "building {tag} from {base} failed: {reason}\n--- build log tail ---\n{tail}"
                ),
            ));
        }
        match docker.inspect_image(tag).await {
            Ok(_) => Ok(()),
            Err(e) if is_not_found(&e) => Err(ProviderError::new(
                ErrorKind::Failed,
                format!("building {tag} reported success but the image does not exist"),
            )),
            Err(e) => Err(self.err(e)),
        }
    }
}
