//! Building the emulator's namespaces: TUN devices, addresses, routes and
//! sysctls, on both links.

use std::fs::File;
use std::process::Command;

use anyhow::{bail, Context};

use crate::{ip, sys, ADDR2_A, ADDR2_B, TUN2_NAME, TUN_NAME};

pub(crate) fn open_tun_in(ns: String, name: &'static str, offload: bool) -> anyhow::Result<File> {
    std::thread::spawn(move || {
        sys::enter_netns(&ns).with_context(|| format!("cannot enter namespace {ns}"))?;
        sys::open_tun(name, offload).with_context(|| format!("cannot create a TUN device in {ns}"))
    })
    .join()
    .map_err(|_| anyhow::anyhow!("TUN setup thread panicked"))?
}

/// Sets one sysctl (`key=value`) inside namespace `ns`.
fn sysctl_in(ns: &str, val: &str) -> anyhow::Result<()> {
    let out = Command::new("ip")
        .args(["netns", "exec", ns, "sysctl", "-q", "-w", val])
        .output()
        .context("cannot run sysctl")?;
    if !out.status.success() {
        bail!(
            "setting {val} in {ns}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

pub(crate) fn configure_side(ns: &str, addr: &str, tcp_max: Option<u64>) -> anyhow::Result<()> {
    ip(&["-n", ns, "link", "set", "lo", "up"])?;
    ip(&[
        "-n",
        ns,
        "addr",
        "add",
        &format!("{addr}/24"),
        "dev",
        TUN_NAME,
    ])?;
    ip(&["-n", ns, "link", "set", TUN_NAME, "mtu", "1500", "up"])?;
    if let Some(max) = tcp_max {
        for key in ["net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem"] {
            sysctl_in(ns, &format!("{key}=4096 131072 {max}"))?;
        }
    }
    Ok(())
}

/// The second link: its addresses, and side a's rule that sends from
/// `ADDR2_A` over it (side b answers that address on its own link).
pub(crate) fn configure_link2(na: &str, nb: &str) -> anyhow::Result<()> {
    for (ns, addr) in [(na, ADDR2_A), (nb, ADDR2_B)] {
        ip(&[
            "-n",
            ns,
            "addr",
            "add",
            &format!("{addr}/24"),
            "dev",
            TUN2_NAME,
        ])?;
        ip(&["-n", ns, "link", "set", TUN2_NAME, "mtu", "1500", "up"])?;
    }
    ip(&["-n", na, "rule", "add", "from", ADDR2_A, "lookup", "101"])?;
    ip(&[
        "-n",
        na,
        "route",
        "add",
        "198.18.0.0/15",
        "dev",
        TUN2_NAME,
        "table",
        "101",
    ])?;
    // Side b gets side a's second-link packets addressed to its first
    // address; a reverse-path filter would drop them.
    for key in ["all", "default", TUN_NAME, TUN2_NAME] {
        sysctl_in(nb, &format!("net.ipv4.conf.{key}.rp_filter=0"))?;
    }
    Ok(())
}
