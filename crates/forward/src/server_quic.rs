//! The server's `quic://` listeners: each client's first packet becomes a
//! pending handshake, as a TCP connection does.

use longhaul_carrier::quic::QuicListener;
use longhaul_carrier::ListenUrl;

use crate::server::{Gate, Serving};
use crate::server_config::Ends;

/// Accepts QUIC connections until the endpoint closes. Under load (a
/// quarter of the handshake table taken, or half of one address's share)
/// a client's address is checked first with a Retry: packets with forged sources then cost one stateless
/// reply each and take no place. A client counts per address, as on TCP.
pub(crate) async fn accept_loop(listener: QuicListener, url: ListenUrl, serving: Serving) {
    let local = listener.local_addr().ok();
    while let Some(incoming) = listener.accept().await {
        let source = crate::pending::source_of(incoming.remote_address().ip());
        if !incoming.remote_address_validated() && serving.pending().busy(source) {
            // A Retry can fail only for a packet that already carried a
            // token; such a client is simply not answered.
            if let Err(e) = incoming.retry() {
                e.into_incoming().ignore();
            }
            continue;
        }
        let from = incoming.remote_address();
        let ends = local.map(|local| Ends {
            client: from,
            local,
        });
        let ticket = serving.pending().admit(Some(source));
        let serving = serving.clone();
        tokio::spawn(async move {
            let setup = longhaul_carrier::quic::accept(incoming);
            serving
                .handshake_and_serve(from.to_string(), ends, setup, Gate::Pending(ticket))
                .await;
        });
    }
    tracing::warn!("{url}: the QUIC endpoint closed");
}
