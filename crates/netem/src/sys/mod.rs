//! What differs between systems: the emulator's system calls on Linux
//! (`linux.rs`), and a one-line refusal everywhere else (`other.rs`).

#[cfg(target_os = "linux")]
mod linux;
#[cfg(target_os = "linux")]
pub use linux::*;

#[cfg(not(target_os = "linux"))]
mod other;
#[cfg(not(target_os = "linux"))]
pub use other::*;
