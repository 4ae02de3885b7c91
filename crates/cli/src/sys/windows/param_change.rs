//! PARAMCHANGE sent to a service: the windows-service crate sends stop,
//! pause and user-defined controls, not this one.

use std::io;
use std::ptr::null;

use windows_sys::Win32::System::Services::{
    CloseServiceHandle, ControlService, OpenSCManagerW, OpenServiceW, SC_HANDLE,
    SC_MANAGER_CONNECT, SERVICE_CONTROL_PARAMCHANGE, SERVICE_PAUSE_CONTINUE, SERVICE_STATUS,
};

/// A service-manager handle, closed on drop.
struct Handle(SC_HANDLE);

impl Handle {
    fn new(h: SC_HANDLE) -> io::Result<Handle> {
        match h.is_null() {
            true => Err(io::Error::last_os_error()),
            false => Ok(Handle(h)),
        }
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: a handle the manager gave, closed once.
        unsafe { CloseServiceHandle(self.0) };
    }
}

/// Asks service `name` to reload (needs the right to pause it).
pub(crate) fn param_change(name: &str) -> io::Result<()> {
    let wide: Vec<u16> = name.encode_utf16().chain([0]).collect();
    // SAFETY: null names the local machine and its active database.
    let manager = Handle::new(unsafe { OpenSCManagerW(null(), null(), SC_MANAGER_CONNECT) })?;
    // SAFETY: an open manager and a NUL-terminated name.
    let service =
        Handle::new(unsafe { OpenServiceW(manager.0, wide.as_ptr(), SERVICE_PAUSE_CONTINUE) })?;
    // SAFETY: plain data, written by the call.
    let mut status: SERVICE_STATUS = unsafe { std::mem::zeroed() };
    // SAFETY: an open service handle and a status to fill.
    if unsafe { ControlService(service.0, SERVICE_CONTROL_PARAMCHANGE, &mut status) } == 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
