//! Windows: what only administrators may change — checked before a
//! LocalSystem service is installed, and made so for its log folder. An
//! object's owner and access list are read as SDDL and every entry that
//! lets someone else write, add, delete, re-permission or take it is
//! named.

use std::io;
use std::os::windows::ffi::OsStrExt;
use std::os::windows::fs::MetadataExt;
use std::path::Path;
use std::ptr::null_mut;

use windows_sys::Win32::Foundation::LocalFree;
use windows_sys::Win32::Security::Authorization::{
    ConvertSecurityDescriptorToStringSecurityDescriptorW,
    ConvertStringSecurityDescriptorToSecurityDescriptorW, GetNamedSecurityInfoW, SDDL_REVISION_1,
    SE_FILE_OBJECT,
};
use windows_sys::Win32::Security::{
    DACL_SECURITY_INFORMATION, OWNER_SECURITY_INFORMATION, PSECURITY_DESCRIPTOR,
    SECURITY_ATTRIBUTES,
};
use windows_sys::Win32::Storage::FileSystem::{CreateDirectoryW, FILE_ATTRIBUTE_REPARSE_POINT};

use super::windows_access::user_sid;

/// Rights that change an object or put another in its place: write and
/// append data (add a file or folder, for a folder), delete a child,
/// delete, change the access list or the owner, generic write and all.
const CHANGE_RIGHTS: u32 =
    0x2 | 0x4 | 0x40 | 0x1_0000 | 0x4_0000 | 0x8_0000 | 0x1000_0000 | 0x4000_0000;
/// In a folder above it, what replaces an object: delete a child, delete
/// or rename the folder itself, change its access list or owner.
const REPLACE_RIGHTS: u32 = 0x40 | 0x1_0000 | 0x4_0000 | 0x8_0000 | 0x1000_0000;
/// TrustedInstaller, who owns the system's own files.
pub(super) const TRUSTED_INSTALLER: &str =
    "S-1-5-80-956008885-3418522649-1831038044-1853292631-2271478464";

/// Who, besides SYSTEM, Administrators, TrustedInstaller and this
/// process's user, could change `path` or put something else in its place
/// (through the folders above it, or a link or junction on the way); None
/// when no one. What a program running as LocalSystem reads must pass:
/// another user who could change it would run their own as the system.
pub fn changeable_by_others(path: &Path) -> io::Result<Option<String>> {
    // A link or junction on the way as spelled: whoever may change it, or
    // the folder holding it, chooses what is reached. Only real paths.
    let spelled = std::path::absolute(path)?;
    for p in spelled.ancestors() {
        if std::fs::symlink_metadata(p)
            .is_ok_and(|m| m.file_attributes() & FILE_ATTRIBUTE_REPARSE_POINT != 0)
        {
            return Ok(Some(format!(
                "{} goes through the link or junction {} (give the real path)",
                spelled.display(),
                p.display()
            )));
        }
    }
    let real = std::fs::canonicalize(path)?;
    let me = user_sid()?;
    let trusted = [
        "SY",
        "BA",
        "S-1-5-18",
        "S-1-5-32-544",
        TRUSTED_INSTALLER,
        &me,
    ];
    if let Some(who) = untrusted_in(&sddl_of(&real)?, CHANGE_RIGHTS, &trusted) {
        return Ok(Some(format!(
            "{} can be changed by {who}",
            shown_path(&real)
        )));
    }
    for folder in real.ancestors().skip(1) {
        if let Some(who) = untrusted_in(&sddl_of(folder)?, REPLACE_RIGHTS, &trusted) {
            return Ok(Some(format!(
                "{} can be replaced by {who} (through {})",
                shown_path(&real),
                shown_path(folder)
            )));
        }
    }
    Ok(None)
}

/// A path as the user typed it would look (no `\\?\`).
fn shown_path(p: &Path) -> String {
    let s = p.display().to_string();
    s.strip_prefix(r"\\?\").map(str::to_owned).unwrap_or(s)
}

/// Makes `path` and its parent (`%ProgramData%\longhaul\logs`: both
/// ours) folders only SYSTEM and Administrators may change, or checks
/// that existing ones are: real folders (not links or junctions, which
/// would send what is written there elsewhere), changeable by no one else
/// — nor replaceable through a folder above, or reached through a link.
pub fn admin_folder(path: &Path) -> io::Result<()> {
    if let Some(parent) = path.parent().filter(|p| p.parent().is_some()) {
        made_or_checked(parent)?;
    }
    made_or_checked(path)?;
    match changeable_by_others(path)? {
        None => Ok(()),
        Some(why) => Err(io::Error::other(format!(
            "{why}: remove what others made (it is made again for Administrators only)"
        ))),
    }
}

/// Makes folder `path` with an Administrators-only list, or checks the
/// one there.
fn made_or_checked(path: &Path) -> io::Result<()> {
    let sddl: Vec<u16> = "D:P(A;OICI;FA;;;SY)(A;OICI;FA;;;BA)\0"
        .encode_utf16()
        .collect();
    let mut sd: PSECURITY_DESCRIPTOR = null_mut();
    // SAFETY: NUL-terminated UTF-16; `sd` freed below.
    if unsafe {
        ConvertStringSecurityDescriptorToSecurityDescriptorW(
            sddl.as_ptr(),
            SDDL_REVISION_1,
            &mut sd,
            null_mut(),
        )
    } == 0
    {
        return Err(io::Error::last_os_error());
    }
    let attrs = SECURITY_ATTRIBUTES {
        nLength: std::mem::size_of::<SECURITY_ATTRIBUTES>() as u32,
        lpSecurityDescriptor: sd,
        bInheritHandle: 0,
    };
    let wide: Vec<u16> = path.as_os_str().encode_wide().chain([0]).collect();
    // SAFETY: a NUL-terminated path and attributes alive for the call.
    let made = unsafe { CreateDirectoryW(wide.as_ptr(), &attrs) } != 0;
    let err = io::Error::last_os_error();
    // SAFETY: allocated by the conversion above, freed once.
    unsafe { LocalFree(sd) };
    if made {
        return Ok(());
    }
    if err.kind() != io::ErrorKind::AlreadyExists {
        return Err(err);
    }
    let meta = std::fs::symlink_metadata(path)?;
    if meta.file_attributes() & FILE_ATTRIBUTE_REPARSE_POINT != 0 || !meta.is_dir() {
        return Err(io::Error::other(format!(
            "{} is a link, a junction or a file, not a folder: remove it, and it is made again",
            path.display()
        )));
    }
    match changeable_by_others(path)? {
        None => Ok(()),
        Some(why) => Err(io::Error::other(format!(
            "{why}: remove it (it is made again for Administrators only)"
        ))),
    }
}

/// The owner and access list of `path`, as SDDL.
pub(super) fn sddl_of(path: &Path) -> io::Result<String> {
    let wide: Vec<u16> = path.as_os_str().encode_wide().chain([0]).collect();
    let mut sd: PSECURITY_DESCRIPTOR = null_mut();
    // SAFETY: a NUL-terminated path; `sd` receives a descriptor freed below.
    let rc = unsafe {
        GetNamedSecurityInfoW(
            wide.as_ptr(),
            SE_FILE_OBJECT,
            OWNER_SECURITY_INFORMATION | DACL_SECURITY_INFORMATION,
            null_mut(),
            null_mut(),
            null_mut(),
            null_mut(),
            &mut sd,
        )
    };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc as i32));
    }
    let mut text: *mut u16 = null_mut();
    // SAFETY: `sd` from the call above; `text` freed below.
    let ok = unsafe {
        ConvertSecurityDescriptorToStringSecurityDescriptorW(
            sd,
            SDDL_REVISION_1,
            OWNER_SECURITY_INFORMATION | DACL_SECURITY_INFORMATION,
            &mut text,
            null_mut(),
        )
    };
    let err = io::Error::last_os_error();
    // SAFETY: allocated by the call above, freed once.
    unsafe { LocalFree(sd) };
    if ok == 0 {
        return Err(err);
    }
    // SAFETY: a NUL-terminated string from the call above, then freed.
    let s = unsafe {
        let n = (0..).take_while(|&i| *text.add(i) != 0).count();
        let s = String::from_utf16_lossy(std::slice::from_raw_parts(text, n));
        LocalFree(text.cast());
        s
    };
    Ok(s)
}

/// In an SDDL owner-and-access-list, the first who is not `trusted` and
/// owns the object or is allowed any of `rights` on it (access entries
/// that only pass on to children skipped); its name.
pub(crate) fn untrusted_in(sddl: &str, rights: u32, trusted: &[&str]) -> Option<String> {
    // A conditional entry's quoted strings may hold anything, parentheses
    // included: out before the entries are split (they come after the SID).
    let unquoted: String = sddl.split('"').step_by(2).collect();
    let sddl = unquoted.as_str();
    let part = |tag: &str| {
        let start = sddl.find(tag)? + tag.len();
        let rest = &sddl[start..];
        let end = ["O:", "G:", "D:", "S:"]
            .iter()
            .filter_map(|t| rest.find(t))
            .filter(|&i| rest[..i].matches('(').count() == rest[..i].matches(')').count())
            .min()
            .unwrap_or(rest.len());
        Some(&rest[..end])
    };
    let is_trusted = |sid: &str| trusted.iter().any(|t| t.eq_ignore_ascii_case(sid));
    match part("O:") {
        Some(owner) if !is_trusted(owner) => {
            return Some(format!("{} (its owner)", sid_name(owner)))
        }
        _ => {}
    }
    let Some(dacl) = part("D:") else {
        return Some("everyone (it has no access list)".into());
    };
    if dacl.starts_with("NO_ACCESS_CONTROL") {
        return Some("everyone (it has no access list)".into());
    }
    for ace in aces(dacl) {
        let f: Vec<&str> = ace.splitn(7, ';').collect();
        let [kind, flags, mask, _, _, sid, ..] = f[..] else {
            return Some(format!("an access entry not understood ({ace})"));
        };
        let allows = matches!(kind, "A" | "XA" | "OA" | "ZA");
        let children_only = flags.as_bytes().chunks(2).any(|c| c == b"IO");
        // CREATOR OWNER/GROUP and OWNER RIGHTS: the owner, checked above.
        if !allows || children_only || matches!(sid, "CO" | "CG" | "OW") || is_trusted(sid) {
            continue;
        }
        if access_mask(mask) & rights != 0 {
            return Some(sid_name(sid));
        }
    }
    None
}

/// The access entries of an SDDL access list, parentheses balanced (a
/// conditional entry holds its own).
fn aces(dacl: &str) -> Vec<&str> {
    let (mut out, mut depth, mut start) = (vec![], 0usize, 0);
    for (i, c) in dacl.char_indices() {
        match c {
            '(' => {
                if depth == 0 {
                    start = i + 1;
                }
                depth += 1;
            }
            ')' if depth > 0 => {
                depth -= 1;
                if depth == 0 {
                    out.push(&dacl[start..i]);
                }
            }
            _ => {}
        }
    }
    out
}

/// An SDDL rights field as a mask: hex, or two-letter codes (an unknown
/// code counts as every right).
fn access_mask(s: &str) -> u32 {
    if let Some(hex) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        return u32::from_str_radix(hex, 16).unwrap_or(u32::MAX);
    }
    let code = |c: &[u8]| -> u32 {
        match c {
            b"GA" => 0x1000_0000,
            b"GR" => 0x8000_0000,
            b"GW" => 0x4000_0000,
            b"GX" => 0x2000_0000,
            b"RC" => 0x2_0000,
            b"SD" => 0x1_0000,
            b"WD" => 0x4_0000,
            b"WO" => 0x8_0000,
            b"CC" => 0x1,
            b"DC" => 0x2,
            b"LC" => 0x4,
            b"SW" => 0x8,
            b"RP" => 0x10,
            b"WP" => 0x20,
            b"DT" => 0x40,
            b"LO" => 0x80,
            b"CR" => 0x100,
            b"FA" => 0x1F_01FF,
            b"FR" => 0x12_0089,
            b"FW" => 0x12_0116,
            b"FX" => 0x12_00A0,
            _ => u32::MAX,
        }
    };
    s.as_bytes().chunks(2).map(code).fold(0, |a, b| a | b)
}

/// A SID for people: the well-known groups by name.
fn sid_name(sid: &str) -> String {
    match sid {
        "WD" | "S-1-1-0" => "Everyone".into(),
        "AU" | "S-1-5-11" => "Authenticated Users".into(),
        "BU" | "S-1-5-32-545" => "Users".into(),
        "IU" | "S-1-5-4" => "Interactive users".into(),
        "BG" | "S-1-5-32-546" => "Guests".into(),
        "AN" | "S-1-5-7" => "Anonymous".into(),
        "NU" | "S-1-5-2" => "Network users".into(),
        "PU" | "S-1-5-32-547" => "Power Users".into(),
        other => other
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || *c == '-')
            .take(80)
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_others_may_change_is_named() {
        let t = ["SY", "BA", "S-1-5-21-1-2-3-1001"];
        let w = CHANGE_RIGHTS;
        // Program Files: the system's, others read and run.
        let pf =
            "O:S-1-5-80-1G:SYD:PAI(A;;FA;;;SY)(A;;FA;;;BA)(A;;0x1200a9;;;BU)(A;OICIIO;GA;;;CO)";
        assert_eq!(
            untrusted_in(pf, w, &t).as_deref(),
            Some("S-1-5-80-1 (its owner)")
        );
        assert_eq!(
            untrusted_in(&pf.replace("O:S-1-5-80-1", "O:BA"), w, &t),
            None
        );
        // A folder under C:\ made by a user: Authenticated Users modify.
        let c = "O:S-1-5-21-1-2-3-1001D:AI(A;ID;FA;;;BA)(A;ID;FA;;;SY)(A;ID;0x1301bf;;;AU)(A;ID;0x1200a9;;;BU)";
        assert_eq!(
            untrusted_in(c, w, &t).as_deref(),
            Some("Authenticated Users")
        );
        // ProgramData: Users may add folders, not replace what is there.
        let pd =
            "O:SYD:P(A;OICI;FA;;;SY)(A;OICI;FA;;;BA)(A;OICI;0x1200a9;;;BU)(A;CI;DCLCRPCR;;;BU)";
        assert_eq!(untrusted_in(pd, REPLACE_RIGHTS, &t), None);
        assert_eq!(untrusted_in(pd, w, &t).as_deref(), Some("Users"));
        // Letters, an unknown code, a conditional entry, no list at all.
        assert_eq!(
            untrusted_in("O:SYD:(A;;WD;;;WD)", w, &t).as_deref(),
            Some("Everyone")
        );
        assert!(untrusted_in("O:SYD:(A;;QQ;;;IU)", w, &t).is_some());
        assert!(untrusted_in("O:SYD:(XA;;FA;;;WD;(Member_of {SID(BA)}))", w, &t).is_some());
        assert!(untrusted_in("O:SYD:NO_ACCESS_CONTROL", w, &t).is_some());
        // A parenthesis in a condition's string hides no later entry.
        let quoted = r#"O:SYD:(XA;;0x1;;;WD;(@User.x == "("))(A;;FA;;;S-1-5-21-9)"#;
        assert_eq!(untrusted_in(quoted, w, &t).as_deref(), Some("S-1-5-21-9"));
        assert!(untrusted_in("O:SY", w, &t).is_some());
        assert_eq!(untrusted_in("O:SYD:(D;;FA;;;WD)(A;;FR;;;WD)", w, &t), None);
    }

    #[test]
    fn an_admin_folder_is_made_and_a_file_in_its_place_refused() {
        let base = std::env::temp_dir().join(format!("lh-admin-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(&base).unwrap();
        let logs = base.join("longhaul").join("logs");
        admin_folder(&logs).unwrap();
        assert!(logs.is_dir());
        admin_folder(&logs).unwrap();
        let file = base.join("file");
        std::fs::write(&file, b"x").unwrap();
        let e = admin_folder(&file).unwrap_err().to_string();
        assert!(e.contains("not a folder"), "{e}");
        std::fs::remove_dir_all(&base).unwrap();
    }
}
