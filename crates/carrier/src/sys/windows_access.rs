//! Windows: what only this user may open — a private key, the control
//! pipe — gets an explicit access list instead of its folder's: full
//! access for the user the process runs as (the SID from its token),
//! SYSTEM and Administrators; protected, so nothing is inherited. The
//! Unix counterpart is mode 0600.

use std::fs::File;
use std::io;
use std::os::windows::ffi::OsStrExt;
use std::os::windows::io::{AsRawHandle, FromRawHandle};
use std::path::Path;
use std::ptr::null_mut;
use std::sync::OnceLock;

use windows_sys::Win32::Foundation::{
    CloseHandle, LocalFree, GENERIC_WRITE, HANDLE, INVALID_HANDLE_VALUE,
};
use windows_sys::Win32::Security::Authorization::{
    ConvertSidToStringSidW, ConvertStringSecurityDescriptorToSecurityDescriptorW, GetSecurityInfo,
    SDDL_REVISION_1, SE_FILE_OBJECT,
};
use windows_sys::Win32::Security::{
    GetTokenInformation, TokenOwner, TokenUser, OWNER_SECURITY_INFORMATION, PSECURITY_DESCRIPTOR,
    PSID, SECURITY_ATTRIBUTES, TOKEN_INFORMATION_CLASS, TOKEN_QUERY,
};
use windows_sys::Win32::Storage::FileSystem::{CreateFileW, CREATE_NEW, FILE_ATTRIBUTE_NORMAL};
use windows_sys::Win32::System::Pipes::GetNamedPipeServerProcessId;
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

/// The process that serves the pipe at the other end of `pipe` (a client).
pub fn pipe_server_pid(pipe: &impl AsRawHandle) -> io::Result<u32> {
    let mut pid = 0u32;
    // SAFETY: a pipe handle the caller holds open through the call.
    if unsafe { GetNamedPipeServerProcessId(pipe.as_raw_handle(), &mut pid) } == 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(pid)
}

/// This process's user, as an SDDL SID string (`S-1-5-21-…`).
pub fn user_sid() -> io::Result<String> {
    token_sid(TokenUser)
}

/// A SID of this process's token: its user (`TokenUser`) or the owner it
/// gives what it makes (`TokenOwner`: Administrators, for an elevated
/// administrator). Both structures begin with the SID's pointer.
fn token_sid(class: TOKEN_INFORMATION_CLASS) -> io::Result<String> {
    let mut token: HANDLE = null_mut();
    // SAFETY: the current-process pseudo handle; `token` receives a
    // handle closed below.
    if unsafe { OpenProcessToken(GetCurrentProcess(), TOKEN_QUERY, &mut token) } == 0 {
        return Err(io::Error::last_os_error());
    }
    // The structure and the SID it points into, in one buffer (u64s:
    // aligned for the structure).
    let mut buf = vec![0u64; 64];
    let mut len = 0u32;
    // SAFETY: `buf` holds `buf.len() * 8` writable bytes.
    let ok = unsafe {
        GetTokenInformation(
            token,
            class,
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
    // SAFETY: the call filled `buf` with a TOKEN_USER or TOKEN_OWNER, whose
    // first field is the SID's pointer (into `buf`, alive here).
    let sid = unsafe { *(buf.as_ptr() as *const PSID) };
    sid_text(sid)
}

/// A SID as text (`S-1-5-…`).
fn sid_text(sid: PSID) -> io::Result<String> {
    let mut text: *mut u16 = null_mut();
    // SAFETY: `sid` is valid for the call (the caller's); `text` receives
    // a string the system allocated (freed below).
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

/// Who owns the file or folder behind a handle.
#[derive(Debug, Clone, Copy)]
pub struct Owner {
    /// This process's user, or the owner its token gives what it makes.
    pub mine: bool,
    /// SYSTEM, Administrators or TrustedInstaller.
    pub system: bool,
}

/// The owner of what `h` is open on (the handle needs READ_CONTROL, which
/// reading gives).
pub fn owner_of(h: &impl AsRawHandle) -> io::Result<Owner> {
    static MINE: OnceLock<(String, String)> = OnceLock::new();
    let mut owner: PSID = null_mut();
    let mut sd: PSECURITY_DESCRIPTOR = null_mut();
    // SAFETY: a handle the caller holds open; `owner` points into `sd`,
    // which the system allocated (freed below).
    let rc = unsafe {
        GetSecurityInfo(
            h.as_raw_handle(),
            SE_FILE_OBJECT,
            OWNER_SECURITY_INFORMATION,
            &mut owner,
            null_mut(),
            null_mut(),
            null_mut(),
            &mut sd,
        )
    };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc as i32));
    }
    let text = match owner.is_null() {
        true => Err(io::Error::other("no owner")),
        false => sid_text(owner),
    };
    // SAFETY: allocated by the call above, freed once (after its SID's use).
    unsafe { LocalFree(sd) };
    let text = text?;
    let mine = match MINE.get() {
        Some(m) => m,
        None => {
            let m = (token_sid(TokenUser)?, token_sid(TokenOwner)?);
            MINE.get_or_init(|| m)
        }
    };
    Ok(Owner {
        // Everyone: a volume without owners (FAT, exFAT), where anyone is.
        mine: text == mine.0 || text == mine.1 || text == "S-1-1-0",
        system: [
            "S-1-5-18",
            "S-1-5-32-544",
            super::windows_admin::TRUSTED_INSTALLER,
        ]
        .contains(&text.as_str()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The access list a file has, as SDDL (its owner left out).
    fn dacl_of(path: &Path) -> String {
        let s = super::super::windows_admin::sddl_of(path).unwrap();
        s[s.find("D:").unwrap_or(s.len())..].to_string()
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
