//! Live progress: a spinner per resource on a terminal, plain lines otherwise (CI logs).

use std::collections::HashMap;

use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use tokio::sync::mpsc::UnboundedReceiver;

use crate::machine::Progress;

/// Renders executor progress events until the channel closes.
pub struct Renderer {
    task: tokio::task::JoinHandle<()>,
}

impl Renderer {
    pub fn spawn(mut rx: UnboundedReceiver<Progress>, live: bool) -> Renderer {
        let task = tokio::spawn(async move {
            let multi = MultiProgress::new();
            let mut bars: HashMap<String, ProgressBar> = HashMap::new();
            let style =
                ProgressStyle::with_template("{spinner} {prefix:.bold} {wide_msg} [{elapsed}]")
                    .unwrap_or_else(|_| ProgressStyle::default_spinner());
            while let Some(ev) = rx.recv().await {
                if !live {
                    match &ev {
                        Progress::Transition { key, label, .. } => errln!("{key}: {label}"),
                        Progress::Retry {
                            key,
                            attempt,
                            max,
                            error,
                        } => {
                            errln!("{key}: retry {attempt}/{max}: {error}")
                        }
                        Progress::Poll { .. } => {}
                    }
                    continue;
                }
                let key = match &ev {
                    Progress::Transition { key, .. }
                    | Progress::Poll { key, .. }
                    | Progress::Retry { key, .. } => key.clone(),
                };
                let bar = bars.entry(key.clone()).or_insert_with(|| {
                    let b = multi.add(ProgressBar::new_spinner());
                    b.set_style(style.clone());
                    b.set_prefix(key.clone());
                    b.enable_steady_tick(std::time::Duration::from_millis(120));
                    b
                });
                match ev {
                    Progress::Transition {
                        label, terminal, ..
                    } => {
                        if terminal {
                            bar.finish_with_message(label);
                        } else {
                            bar.set_message(label);
                        }
                    }
                    Progress::Poll { note, .. } => bar.set_message(note),
                    Progress::Retry {
                        attempt,
                        max,
                        error,
                        ..
                    } => bar.set_message(format!("retry {attempt}/{max}: {error}")),
                }
            }
            for b in bars.values() {
                if !b.is_finished() {
                    b.abandon();
                }
            }
        });
        Renderer { task }
    }

    /// Waits until every event sent so far is rendered (the senders must be dropped).
    pub async fn finish(self) {
        let _ = self.task.await;
    }
}
