//! What differs between operating systems: the control channel's place
//! and transport, and the host's name. The rest of the crate has no
//! `cfg(target_os)`.

#[cfg(unix)]
mod unix;
#[cfg(unix)]
pub use unix::*;

#[cfg(windows)]
mod windows;
#[cfg(windows)]
pub use self::windows::*;
