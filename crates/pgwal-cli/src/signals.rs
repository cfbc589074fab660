//! The signals that stop pgwal cleanly: Ctrl-C (SIGINT) and SIGTERM, which
//! systemd, Kubernetes and other supervisors send. Every command that runs
//! until stopped (`stream` to stdout or Kafka, `receive`) waits on
//! [`stop_signal`], so a supervisor's stop sends the last acknowledgement
//! before pgwal exits, as Ctrl-C does.

/// Completes at the first SIGINT or SIGTERM. The handlers are installed
/// when this is called, not when it is first polled: from then on, such a
/// signal no longer ends the process by its default action.
pub(crate) fn stop_signal() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let term = signal(SignalKind::terminate());
        let int = signal(SignalKind::interrupt());
        async move {
            match (term, int) {
                (Ok(mut term), Ok(mut int)) => {
                    tokio::select! {
                        _ = term.recv() => {}
                        _ = int.recv() => {}
                    }
                }
                _ => {
                    let _ = tokio::signal::ctrl_c().await;
                }
            }
        }
    }
    #[cfg(not(unix))]
    async {
        let _ = tokio::signal::ctrl_c().await;
    }
}
