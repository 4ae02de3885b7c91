//! Forwarders: what turns local sockets into streams and streams into
//! connections.
//!
//! * [`rules`] — deny-by-default target and bind rules (`--allow`,
//!   `--allow-bind`);
//! * [`spec`] — ssh-style `-L`/`-R`/`-D` argument parsing;
//! * [`server`] — accepts carriers and connects allowed targets; `drain`
//!   ends its sessions when it stops, letting their clients move first;
//! * [`client`] — local forwards, reverse forwards, SOCKS5 and HTTP CONNECT
//!   listeners over one session; `reconnect` keeps that session alive
//!   across carrier drops.
// `unsafe` only in `sys`: Windows' access list for the control pipe.
#![deny(unsafe_code)]

pub mod auth;
pub mod client;
mod client_config;
pub mod connect;
pub mod dashboard;
mod dial;
pub mod doctor;
mod drain;
pub mod flow_ports;
pub mod http_connect;
pub mod known_hosts;
pub mod metrics;
mod pending;
pub mod policy;
mod reconnect;
pub mod rules;
pub mod server;
mod server_acceptor;
mod server_config;
mod server_session;
mod sessions;
pub mod socks5;
pub mod spec;
pub mod status;
#[allow(unsafe_code)]
mod sys;
mod udp;

pub use client::{Client, ClientConfig};
pub use server::{Server, ServerConfig};
