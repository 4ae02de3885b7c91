//! What differs between operating systems: the socket pair between a
//! stream's pumps and an in-process service (a Unix socket pair; loopback
//! TCP on Windows). The rest of the crate has no `cfg(target_os)`.

#[cfg(unix)]
mod unix;
#[cfg(unix)]
pub use unix::*;

#[cfg(windows)]
mod windows;
#[cfg(windows)]
pub use self::windows::*;
