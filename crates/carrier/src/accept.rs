//! One accept loop step for every listener longhaul runs.
//!
//! `accept` fails for two kinds of reasons. Some concern only the connection
//! being accepted (it was reset while it waited): the next one may be fine,
//! so try again at once. Others concern this process (EMFILE: no free file
//! descriptor; ENFILE, ENOBUFS, ENOMEM): the pending connection stays in the
//! backlog and the listener stays readable, so retrying at once spins a core
//! until something else frees a descriptor. Then pause, longer each time
//! (10 ms doubling to 1 s), and log once per pause.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};

const FIRST_PAUSE: Duration = Duration::from_millis(10);
const MAX_PAUSE: Duration = Duration::from_secs(1);

/// Whether an accept error concerns only the connection being accepted.
fn per_connection(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::Interrupted
            | io::ErrorKind::WouldBlock
    )
}

/// Accepts the next connection on `listener`, backing off on errors that a
/// retry cannot cure at once. `what` names the listener in log lines.
pub async fn accept_with_backoff(listener: &TcpListener, what: &str) -> (TcpStream, SocketAddr) {
    let mut pause = FIRST_PAUSE;
    loop {
        match listener.accept().await {
            Ok(a) => return a,
            Err(e) if per_connection(&e) => continue,
            Err(e) => {
                tracing::warn!("accept failed on {what}: {e}; retrying in {pause:?}");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(MAX_PAUSE);
            }
        }
    }
}
