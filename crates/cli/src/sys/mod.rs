//! What differs between operating systems: signals (stop, reload, a
//! terminal's hang-up), becoming another command, and what is not built
//! for a system yet. The rest of the crate has no `cfg(target_os)`.

#[cfg(unix)]
mod unix;
#[cfg(unix)]
pub(crate) use unix::*;

#[cfg(windows)]
mod windows;
#[cfg(windows)]
pub(crate) use self::windows::*;
