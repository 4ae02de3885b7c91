//! The system calls the emulator needs that std does not offer: creating a
//! TUN device, entering a network namespace, and tuning the forwarding
//! threads. This is the crate's only `unsafe`; each call is a plain ioctl,
//! prctl, setns or setpriority on a descriptor or buffer we own.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;

const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
const TUNSETOFFLOAD: libc::c_ulong = 0x4004_54d0;
const IFF_TUN: i16 = 0x0001;
const IFF_NO_PI: i16 = 0x1000;
const IFF_VNET_HDR: i16 = 0x4000;
const TUN_F_CSUM: libc::c_ulong = 0x01;
const TUN_F_TSO4: libc::c_ulong = 0x02;
const TUN_F_TSO6: libc::c_ulong = 0x04;

/// Creates TUN device `name` in the calling thread's network namespace.
/// With `offload`, packets carry a virtio-net header and may be GSO
/// super-packets (up to 64 KiB), which is what makes Gbit/s cheap.
pub fn open_tun(name: &str, offload: bool) -> io::Result<File> {
    if name.len() >= 16 {
        return Err(io::Error::other(format!(
            "interface name '{name}' longer than 15 bytes"
        )));
    }
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/net/tun")?;
    // struct ifreq: 16-byte name, then a union whose first member is the
    // short flags; 40 bytes in all on Linux.
    let mut ifr = [0u8; 40];
    ifr[..name.len()].copy_from_slice(name.as_bytes());
    let mut flags = IFF_TUN | IFF_NO_PI;
    if offload {
        flags |= IFF_VNET_HDR;
    }
    ifr[16..18].copy_from_slice(&flags.to_ne_bytes());
    // SAFETY: `ifr` is a 40-byte buffer laid out as struct ifreq and lives
    // for the whole call; the fd is open.
    if unsafe { libc::ioctl(f.as_raw_fd(), TUNSETIFF, ifr.as_mut_ptr()) } < 0 {
        return Err(io::Error::last_os_error());
    }
    if offload {
        // SAFETY: TUNSETOFFLOAD takes its argument by value.
        let rc = unsafe {
            libc::ioctl(
                f.as_raw_fd(),
                TUNSETOFFLOAD,
                TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6,
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(f)
}

/// Moves the calling thread into the network namespace `ns` (a name under
/// /var/run/netns). Only this thread changes namespace.
pub fn enter_netns(ns: &str) -> io::Result<()> {
    let f = File::open(format!("/var/run/netns/{ns}"))?;
    // SAFETY: plain syscall on an fd we hold open.
    if unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Makes the calling thread's sleeps wake on time (1 ns timer slack instead
/// of the default 50 µs) and raises its priority, so packets are released
/// when due even on a loaded machine. Failures are ignored: the emulator
/// still works, `status` shows how late it was.
pub fn tune_forwarding_thread() {
    // SAFETY: prctl and setpriority with integer arguments only.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0);
        libc::setpriority(libc::PRIO_PROCESS, 0, -15);
    }
}

/// Whether this process may administer the network (root or CAP_NET_ADMIN).
pub fn has_net_admin() -> bool {
    let Ok(s) = std::fs::read_to_string("/proc/self/status") else {
        return false;
    };
    s.lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << 12) != 0)
}

/// The daemon leaves the caller's process group (a Ctrl-C there does not
/// take the emulator down with it).
pub fn own_process_group(cmd: &mut std::process::Command) {
    std::os::unix::process::CommandExt::process_group(cmd, 0);
}
