//! The proto crate's integration tests, one binary (each binary links the
//! whole tree, so one per crate keeps the build short).

mod common;
mod mux_common;

mod connection_sim;
mod link_sim;
mod mux_close;
mod mux_drain;
mod mux_frames;
mod mux_keepalive;
mod mux_states;
mod striped_sim;
