//! The folder carrier on real files: torn and corrupt records, stale and
//! concurrent carriers in one directory, a vanished folder. (The disk
//! bound under load is in `folder_disk.rs`: its CPU use would blur the
//! checks here that waiting costs none.)

use std::path::Path;
use std::time::{Duration, Instant};

use longhaul_carrier::folder::record::{self, Kind};
use longhaul_carrier::folder::{dial, FolderListener, FolderStream, FolderUrl, CORRUPT_AFTER};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::common;
use common::TempDir;

/// CPU time this process has used (user + system), from /proc. Zero for
/// a Windows build: under Wine, /proc is read by Wine's server (its CPU,
/// not ours), so the no-busy-loop checks are Linux's.
fn cpu() -> Duration {
    if cfg!(windows) {
        return Duration::ZERO;
    }
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<u64> = after.split(' ').map(|x| x.parse().unwrap_or(0)).collect();
    // Fields 14 and 15 (utime, stime) are the 12th and 13th after the name.
    Duration::from_millis((f[11] + f[12]) * 1000 / 100)
}

use common::within;

/// Checks that a read stays pending for `d` and that waiting costs next to
/// no CPU (no busy loop).
async fn stays_pending(s: &mut FolderStream, d: Duration) {
    let before = cpu();
    let mut b = [0u8; 16];
    assert!(
        tokio::time::timeout(d, s.read(&mut b)).await.is_err(),
        "read returned early"
    );
    let used = cpu() - before;
    assert!(used < d / 5, "waiting used {used:?} of CPU in {d:?}");
}

#[tokio::test]
async fn torn_record_is_read_again_in_place_until_complete() {
    if !common::alone(
        module_path!(),
        "torn_record_is_read_again_in_place_until_complete",
    ) {
        return;
    }
    let dir = TempDir::new("torn");
    let mut listener = FolderListener::bind(&dir.url()).unwrap();
    // A client that died mid-record: half of its first record is there.
    let c0 = dir.0.join("lh-00000000000000aa.c.0");
    let rec = record::encode(Kind::Data, 0, b"hello, folder");
    std::fs::write(&c0, &rec[..rec.len() / 2]).unwrap();
    let mut server = within(5, listener.accept()).await.unwrap();
    stays_pending(&mut server, Duration::from_millis(600)).await;
    // Its writer comes back and writes the record whole, in place.
    std::fs::write(&c0, &rec).unwrap();
    let mut got = [0u8; 13];
    within(5, server.read_exact(&mut got)).await.unwrap();
    assert_eq!(&got, b"hello, folder");
    // Then ends its half: EOF, and the reader removes what it has read.
    let mut all = rec.clone();
    all.extend(record::encode(Kind::End, 1, &[]));
    std::fs::write(&c0, &all).unwrap();
    assert_eq!(within(5, server.read(&mut got)).await.unwrap(), 0);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!c0.exists(), "read segment not removed");
}

#[tokio::test]
async fn a_record_that_never_checks_out_ends_the_carrier() {
    if !common::alone(
        module_path!(),
        "a_record_that_never_checks_out_ends_the_carrier",
    ) {
        return;
    }
    let dir = TempDir::new("crc");
    let mut listener = FolderListener::bind(&dir.url()).unwrap();
    let mut rec = record::encode(Kind::Data, 0, b"payload");
    let last = rec.len() - 1;
    rec[last] ^= 0x55;
    std::fs::write(dir.0.join("lh-00000000000000bb.c.0"), &rec).unwrap();
    let mut server = within(5, listener.accept()).await.unwrap();
    let before = (cpu(), Instant::now());
    let mut b = [0u8; 8];
    let e = within(10, server.read(&mut b)).await.unwrap_err();
    assert!(e.to_string().contains("corrupt"), "{e}");
    assert!(before.1.elapsed() >= CORRUPT_AFTER, "gave up too soon");
    let used = cpu() - before.0;
    assert!(
        used < Duration::from_millis(400),
        "waiting used {used:?} of CPU"
    );
}

#[tokio::test]
async fn stale_files_are_ignored_and_sessions_stay_apart() {
    let dir = TempDir::new("stale");
    // An old carrier (both first files) and a lone client file from before
    // the server started.
    for f in [
        "lh-00000000000000cc.c.0",
        "lh-00000000000000cc.s.0",
        "lh-00000000000000dd.c.0",
    ] {
        let p = dir.0.join(f);
        std::fs::write(&p, record::encode(Kind::Data, 0, b"old")).unwrap();
        // An earlier run's: older than the listener (by the folder's clock).
        let f = std::fs::File::options().write(true).open(&p).unwrap();
        f.set_modified(std::time::SystemTime::now() - Duration::from_secs(60))
            .unwrap();
    }
    let mut listener = FolderListener::bind(&dir.url()).unwrap();
    let (mut a, mut b) = (dial(&dir.url()).unwrap(), dial(&dir.url()).unwrap());
    a.write_all(b"from a").await.unwrap();
    b.write_all(b"from b").await.unwrap();
    let mut served = vec![];
    for _ in 0..2 {
        let mut s = within(5, listener.accept()).await.unwrap();
        let mut got = [0u8; 6];
        within(5, s.read_exact(&mut got)).await.unwrap();
        s.write_all(&got).await.unwrap();
        served.push(s);
    }
    // Nothing else was taken for a carrier.
    assert!(
        tokio::time::timeout(Duration::from_millis(300), listener.accept())
            .await
            .is_err()
    );
    for (mut s, want) in [(a, b"from a"), (b, b"from b")] {
        let mut got = [0u8; 6];
        within(5, s.read_exact(&mut got)).await.unwrap();
        assert_eq!(&got, want, "a carrier got another's bytes");
        s.shutdown().await.unwrap();
    }
    for mut s in served {
        let mut rest = vec![];
        within(5, s.read_to_end(&mut rest)).await.unwrap();
        assert!(rest.is_empty());
    }
    // The old carrier's files were not touched.
    assert!(dir.0.join("lh-00000000000000cc.s.0").exists());
}

// Windows does not let a folder vanish while files in it are open.
#[cfg(unix)]
#[tokio::test]
async fn a_vanished_folder_ends_both_sides() {
    let dir = TempDir::new("gone");
    let mut listener = FolderListener::bind(&dir.url()).unwrap();
    let mut client = dial(&dir.url()).unwrap();
    client.write_all(b"x").await.unwrap();
    let mut server = within(5, listener.accept()).await.unwrap();
    let mut b = [0u8; 1];
    within(5, server.read_exact(&mut b)).await.unwrap();
    std::fs::remove_dir_all(&dir.0).unwrap();
    let e = within(5, client.read(&mut b)).await.unwrap_err();
    assert!(e.to_string().contains("folder carrier"), "{e}");
    let e = within(5, server.read(&mut b)).await.unwrap_err();
    assert!(e.to_string().contains("folder carrier"), "{e}");
}

// FIFOs exist only on Unix (a Windows reparse point is never followed:
// sys::no_surprises).
#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fifo_or_a_symlink_named_like_a_carrier_file_ends_only_that_carrier() {
    let dir = TempDir::new("fifo");
    let outside = TempDir::new("fifo-outside");
    let mut listener = FolderListener::bind(&dir.url()).unwrap();
    let fifo = dir.0.join("lh-0123456789abcdef.c.0");
    assert!(std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    let target = outside.0.join("elsewhere.fifo");
    assert!(std::process::Command::new("mkfifo")
        .arg(&target)
        .status()
        .unwrap()
        .success());
    std::os::unix::fs::symlink(&target, dir.0.join("lh-0123456789abcde0.c.0")).unwrap();
    for _ in 0..2 {
        let mut s = within(5, listener.accept()).await.unwrap();
        let mut b = [0u8; 1];
        let e = within(5, s.read(&mut b)).await.unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
    }
    // The FIFO outside was not touched; a real carrier still works.
    assert!(target.exists());
    let mut c = dial(&dir.url()).unwrap();
    c.write_all(b"hi").await.unwrap();
    let mut s = within(5, listener.accept()).await.unwrap();
    let mut b = [0u8; 2];
    within(5, s.read_exact(&mut b)).await.unwrap();
    assert_eq!(&b, b"hi");
}

#[test]
fn folder_identities_have_no_whitespace_or_options_and_round_trip() {
    // Windows spells a drive's folder dir:///C:/…, a share's
    // dir:////server/…; a bare dir://name is relative, never a host.
    let (root, paths) = match cfg!(windows) {
        false => ("", ["/a b/c\td%e", "/x/\u{2003}y\nz", "/plain/path"]),
        true => (
            "/C:",
            [
                "C:\\a b\\c\td%e",
                "\\\\srv\\x\\\u{2003}y\nz",
                "D:\\plain\\path",
            ],
        ),
    };
    let a: FolderUrl = format!("dir://{root}/media/sf_My Share/./lh/")
        .parse()
        .unwrap();
    let b: FolderUrl = format!("dir://{root}/media/sf_My Share/lh?poll=20ms")
        .parse()
        .unwrap();
    assert_eq!(a.identity(), format!("dir://{root}/media/sf_My%20Share/lh"));
    assert_eq!(a.identity(), b.identity());
    if cfg!(windows) {
        let share: FolderUrl = "dir:////vmhost/share/tunnel".parse().unwrap();
        assert_eq!(share.dir, Path::new("\\\\vmhost\\share\\tunnel"));
        assert_eq!(share.identity(), "dir:////vmhost/share/tunnel");
        let bare: FolderUrl = "dir://tunnel/x".parse().unwrap();
        assert_eq!(bare.dir, Path::new("tunnel\\x"));
        let drive: FolderUrl = "dir://C:\\share\\tunnel".parse().unwrap();
        assert_eq!(drive.dir, Path::new("C:\\share\\tunnel"));
        assert_eq!(drive.to_string(), "dir:///C:/share/tunnel");
    }
    for p in paths {
        let u = FolderUrl {
            dir: p.into(),
            poll: longhaul_carrier::folder::PollMode::Auto,
            tls: true,
        };
        let id = u.identity();
        assert!(!id.contains(char::is_whitespace), "{id}");
        assert_eq!(FolderUrl::path_of_identity(&id).unwrap(), Path::new(p));
    }
    // A name that is not UTF-8 (Unix) is percent-encoded and comes back.
    #[cfg(unix)]
    {
        use std::os::unix::ffi::OsStrExt;
        let odd = Path::new(std::ffi::OsStr::from_bytes(b"/srv/\xff\xfe name"));
        let u = FolderUrl {
            dir: odd.into(),
            poll: longhaul_carrier::folder::PollMode::Auto,
            tls: true,
        };
        let id = u.identity();
        assert!(id.contains("%FF%FE%20name"), "{id}");
        assert_eq!(FolderUrl::path_of_identity(&id).unwrap(), odd);
    }
    let off: FolderUrl = "dir:///srv/x?tls=off".parse().unwrap();
    assert!(!off.tls);
    assert_eq!(off.to_string(), "dir:///srv/x?tls=off");
    assert!("dir:///srv/x".parse::<FolderUrl>().unwrap().tls);
    assert!("dir:///srv/x?tls=maybe".parse::<FolderUrl>().is_err());
}

#[test]
fn urls_parse_with_one_line_errors() {
    let u: FolderUrl = "dir:///srv/share?poll=20ms".parse().unwrap();
    assert_eq!(u.dir, Path::new("/srv/share"));
    assert_eq!(u.to_string(), "dir:///srv/share?poll=20000us");
    for bad in [
        "dir://",
        "dir:///x?poll=fast",
        "dir:///x?poll=1us",
        "dir:///x?speed=1",
    ] {
        let e = bad.parse::<FolderUrl>().unwrap_err();
        assert!(e.contains("dir://PATH"), "{bad}: {e}");
    }
}
