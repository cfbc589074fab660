//! The signals that stop pgwal: Ctrl-C (SIGINT) and SIGTERM, which
//! systemd, Kubernetes and other supervisors send. Every command that runs
//! until stopped (`stream` to stdout or Kafka, `receive`) waits on
//! [`stop_signal`], so a supervisor's stop sends the last acknowledgement
//! before pgwal exits, as Ctrl-C does.
//!
//! A clean stop can itself hang: a full stdout pipe nobody reads, a Kafka
//! commit waiting on a broker. A second signal therefore ends pgwal at
//! once, with the status a shell gives a process killed by that signal
//! (130 for SIGINT, 143 for SIGTERM). Nothing is lost by it: what was not
//! acknowledged comes again at the next start.

/// Completes at the first SIGINT or SIGTERM; the second one exits the
/// process. The handlers are installed when this is called, not when it
/// is first polled: from then on, such a signal no longer ends the process
/// by its default action. The signals are counted by a task of their own,
/// so the second one is seen even while the caller is blocked (a write to
/// a full pipe) and never polls the returned future.
pub(crate) fn stop_signal() -> impl std::future::Future<Output = ()> {
    let (first_tx, first_rx) = tokio::sync::oneshot::channel::<()>();
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) {
            (Ok(mut term), Ok(mut int)) => {
                tokio::spawn(async move {
                    let (name, _) = next(&mut term, &mut int).await;
                    tracing::info!(
                        signal = name,
                        "stopping after the last acknowledgement (a second signal exits at once)"
                    );
                    let _ = first_tx.send(());
                    let (name, status) = next(&mut term, &mut int).await;
                    eprintln!("pgwal: {name} again: exiting at once; what was not acknowledged comes again at the next start");
                    std::process::exit(status);
                });
            }
            _ => {
                tokio::spawn(async move {
                    let _ = tokio::signal::ctrl_c().await;
                    let _ = first_tx.send(());
                    let _ = tokio::signal::ctrl_c().await;
                    eprintln!("pgwal: Ctrl-C again: exiting at once");
                    std::process::exit(130);
                });
            }
        }
    }
    #[cfg(not(unix))]
    tokio::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        let _ = first_tx.send(());
        let _ = tokio::signal::ctrl_c().await;
        eprintln!("pgwal: Ctrl-C again: exiting at once");
        std::process::exit(130);
    });
    async move {
        // a dropped sender (the runtime shutting down) is no stop signal
        if first_rx.await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// The next SIGTERM or SIGINT: its name and the status of a process it
/// killed.
#[cfg(unix)]
async fn next(
    term: &mut tokio::signal::unix::Signal,
    int: &mut tokio::signal::unix::Signal,
) -> (&'static str, i32) {
    tokio::select! {
        _ = term.recv() => ("SIGTERM", 143),
        _ = int.recv() => ("SIGINT", 130),
    }
}
