//! Windows: what only this user may open — a private key, the control
//! pipe — gets an explicit access list instead of its folder's: full
//! access for the user the process runs as (the SID from its token),
//! SYSTEM and Administrators; protected, so nothing is inherited. The
//! Unix counterpart is mode 0600.

use std::fs::File;
use std::io;
use std::os::windows::ffi::OsStrExt;
use std::os::windows::io::FromRawHandle;
use std::path::Path;
use std::ptr::null_mut;

use windows_sys::Win32::Foundation::{
    CloseHandle, LocalFree, GENERIC_WRITE, HANDLE, INVALID_HANDLE_VALUE,
};
use windows_sys::Win32::Security::Authorization::{
    ConvertSidToStringSidW, ConvertStringSecurityDescriptorToSecurityDescriptorW, SDDL_REVISION_1,
};
use windows_sys::Win32::Security::{
    GetTokenInformation, TokenUser, PSECURITY_DESCRIPTOR, SECURITY_ATTRIBUTES, TOKEN_QUERY,
    TOKEN_USER,
};
use windows_sys::Win32::Storage::FileSystem::{CreateFileW, CREATE_NEW, FILE_ATTRIBUTE_NORMAL};
use windows_sys::Win32::System::Threading::{GetCurrentProcess, OpenProcessToken};

/// A security descriptor that admits only this user, SYSTEM and
/// Administrators, as `SECURITY_ATTRIBUTES` for the calls that create.
pub struct SecurityAttributes {
    sd: PSECURITY_DESCRIPTOR,
    attrs: SECURITY_ATTRIBUTES,
}

impl SecurityAttributes {
    pub fn owner_only() -> io::Result<SecurityAttributes> {
        let sddl = format!("D:P(A;;GA;;;SY)(A;;GA;;;BA)(A;;GA;;;{})\0", user_sid()?);
        let sddl: Vec<u16> = sddl.encode_utf16().collect();
        let mut sd: PSECURITY_DESCRIPTOR = null_mut();
        // SAFETY: `sddl` is NUL-terminated UTF-16 that outlives the call;
        // `sd` receives a descriptor the system allocated (freed on drop).
        let ok = unsafe {
            ConvertStringSecurityDescriptorToSecurityDescriptorW(
                sddl.as_ptr(),
                SDDL_REVISION_1,
                &mut sd,
                null_mut(),
            )
        };
        if ok == 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(SecurityAttributes {
            sd,
            attrs: SECURITY_ATTRIBUTES {
                nLength: std::mem::size_of::<SECURITY_ATTRIBUTES>() as u32,
                lpSecurityDescriptor: sd,
                bInheritHandle: 0,
            },
        })
    }

    /// For the system calls: valid while `self` lives.
    pub fn as_ptr(&mut self) -> *mut std::ffi::c_void {
        (&mut self.attrs as *mut SECURITY_ATTRIBUTES).cast()
    }
}

impl Drop for SecurityAttributes {
    fn drop(&mut self) {
        // SAFETY: allocated by the conversion in `owner_only`, freed once.
        unsafe { LocalFree(self.sd) };
    }
}

/// Creates `path` for writing, never over an existing file, with the
/// owner-only access list from the start (set afterwards, another process
/// could open it in between and keep its handle).
pub fn create_new(path: &Path) -> io::Result<File> {
    let mut sa = SecurityAttributes::owner_only()?;
    let wide: Vec<u16> = path.as_os_str().encode_wide().chain([0]).collect();
    // SAFETY: a NUL-terminated path and attributes alive for the call.
    let h = unsafe {
        CreateFileW(
            wide.as_ptr(),
            GENERIC_WRITE,
            0,
            sa.as_ptr().cast(),
            CREATE_NEW,
            FILE_ATTRIBUTE_NORMAL,
            null_mut(),
        )
    };
    if h == INVALID_HANDLE_VALUE {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a handle we own, handed to the File that closes it.
    Ok(unsafe { File::from_raw_handle(h) })
}

/// This process's user, as an SDDL SID string (`S-1-5-21-…`).
pub fn user_sid() -> io::Result<String> {
    let mut token: HANDLE = null_mut();
    // SAFETY: the current-process pseudo handle; `token` receives a
    // handle closed below.
    if unsafe { OpenProcessToken(GetCurrentProcess(), TOKEN_QUERY, &mut token) } == 0 {
        return Err(io::Error::last_os_error());
    }
    // TOKEN_USER and the SID it points into, in one buffer (u64s: aligned
    // for the struct).
    let mut buf = vec![0u64; 64];
    let mut len = 0u32;
    // SAFETY: `buf` holds `buf.len() * 8` writable bytes.
    let ok = unsafe {
        GetTokenInformation(
            token,
            TokenUser,
            buf.as_mut_ptr().cast(),
            (buf.len() * 8) as u32,
            &mut len,
        )
    };
    let err = io::Error::last_os_error();
    // SAFETY: opened above, closed once.
    unsafe { CloseHandle(token) };
    if ok == 0 {
        return Err(err);
    }
    // SAFETY: the call filled `buf` with a TOKEN_USER.
    let sid = unsafe { (*(buf.as_ptr() as *const TOKEN_USER)).User.Sid };
    let mut text: *mut u16 = null_mut();
    // SAFETY: `sid` points into `buf`, alive here; `text` receives a
    // string the system allocated (freed below).
    if unsafe { ConvertSidToStringSidW(sid, &mut text) } == 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a NUL-terminated UTF-16 string from the call above.
    let s = unsafe {
        let n = (0..).take_while(|&i| *text.add(i) != 0).count();
        String::from_utf16_lossy(std::slice::from_raw_parts(text, n))
    };
    // SAFETY: allocated by the conversion, not used after this.
    unsafe { LocalFree(text.cast()) };
    Ok(s)
}

#[cfg(test)]
mod tests {
    use windows_sys::Win32::Security::Authorization::{
        ConvertSecurityDescriptorToStringSecurityDescriptorW, GetNamedSecurityInfoW, SE_FILE_OBJECT,
    };
    use windows_sys::Win32::Security::DACL_SECURITY_INFORMATION;

    use super::*;

    /// The access list a file has, as SDDL.
    fn dacl_of(path: &Path) -> String {
        let wide: Vec<u16> = path.as_os_str().encode_wide().chain([0]).collect();
        let mut sd: PSECURITY_DESCRIPTOR = null_mut();
        // SAFETY: a NUL-terminated path; `sd` receives a descriptor freed below.
        let rc = unsafe {
            GetNamedSecurityInfoW(
                wide.as_ptr(),
                SE_FILE_OBJECT,
                DACL_SECURITY_INFORMATION,
                null_mut(),
                null_mut(),
                null_mut(),
                null_mut(),
                &mut sd,
            )
        };
        assert_eq!(rc, 0, "GetNamedSecurityInfoW");
        let mut text: *mut u16 = null_mut();
        // SAFETY: `sd` from the call above; `text` freed below.
        let ok = unsafe {
            ConvertSecurityDescriptorToStringSecurityDescriptorW(
                sd,
                SDDL_REVISION_1,
                DACL_SECURITY_INFORMATION,
                &mut text,
                null_mut(),
            )
        };
        assert_ne!(ok, 0);
        // SAFETY: a NUL-terminated string from the call above.
        let s = unsafe {
            let n = (0..).take_while(|&i| *text.add(i) != 0).count();
            String::from_utf16_lossy(std::slice::from_raw_parts(text, n))
        };
        // SAFETY: both allocated by the calls above.
        unsafe {
            LocalFree(text.cast());
            LocalFree(sd);
        }
        s
    }

    #[test]
    fn a_private_file_admits_only_its_user_system_and_administrators() {
        let dir = std::env::temp_dir().join(format!("lh-private-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("key");
        let _ = std::fs::remove_file(&path);
        drop(create_new(&path).unwrap());
        assert!(create_new(&path).is_err(), "never over an existing file");
        let dacl = dacl_of(&path);
        let me = user_sid().unwrap();
        // Wine keeps only what maps onto the Unix mode (no "P", no
        // Administrators); Windows keeps the list as made.
        assert!(dacl.contains(&me), "{dacl} lacks {me}");
        for other in [";WD)", ";BU)", ";AU)", ";IU)"] {
            assert!(!dacl.contains(other), "{dacl} admits {other}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
