//! The file service and `longhaul cp` against hostile input (issue 24,
//! items 13–17): listings that would pin the server's memory and
//! descriptors, FIFOs under the served folder, permissions widened by a
//! copy, partial copies a user's own file or a hard link could be taken
//! for, and downloads through symbolic links in the destination. Real
//! server and client processes on loopback, real files.

use crate::common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use longhaul_files::wire::{self, Request};
use longhaul_session::{LocalStream, ServicePipe};

/// A server (started under `umask`) offering a folder to a read-write and
/// a read-only key.
struct Fixture {
    dir: PathBuf,
    files: PathBuf,
    port: u16,
    fp: String,
    log: PathBuf,
    server: Kill,
}

/// `sh -c 'umask U; exec BIN ARGS'`: the umask for one process only.
fn with_umask(umask: &str) -> Command {
    let mut c = Command::new("sh");
    c.arg("-c")
        .arg(format!("umask {umask} && exec \"$0\" \"$@\""))
        .arg(BIN);
    c
}

impl Fixture {
    fn start(name: &str, umask: &str, more: &[&str]) -> Fixture {
        let dir = tmpdir(name);
        let files = dir.join("served");
        std::fs::create_dir_all(&files).unwrap();
        Fixture::start_on(dir, files, umask, more)
    }

    fn start_on(dir: PathBuf, files: PathBuf, umask: &str, more: &[&str]) -> Fixture {
        let fp = keygen(&dir.join("server.key"));
        let rw = keygen(&dir.join("rw.key"));
        let ro = keygen(&dir.join("ro.key"));
        std::fs::write(
            dir.join("authorized_keys"),
            format!("{rw} files=rw\n{ro} files=ro\n"),
        )
        .unwrap();
        let port = free_port();
        let log = dir.join("server.log");
        let server = Kill(
            with_umask(umask)
                .args(["server", "--listen", &format!("127.0.0.1:{port}"), "--key"])
                .arg(dir.join("server.key"))
                .arg("--authorized-keys")
                .arg(dir.join("authorized_keys"))
                .arg("--files")
                .arg(&files)
                .args(more)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&log).unwrap())
                .spawn()
                .unwrap(),
        );
        wait_port(port);
        Fixture {
            dir,
            files,
            port,
            fp,
            log,
            server,
        }
    }

    fn at(&self, path: &str) -> String {
        format!("127.0.0.1:{}:{path}", self.port)
    }

    fn cp_command(&self, key: &str, umask: &str, args: &[&str]) -> Command {
        let mut c = with_umask(umask);
        c.args(["cp", "--json", "--key"])
            .arg(self.dir.join(format!("{key}.key")))
            .args(["--pin", &self.fp])
            .args(args);
        c
    }

    fn cp(&self, key: &str, args: &[&str]) -> Output {
        self.cp_command(key, "022", args).output().unwrap()
    }

    fn server_log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// A client in this process that speaks the file service's wire
    /// format itself.
    fn raw(&self, key: &str) -> Raw {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let mut cfg = longhaul_forward::ClientConfig::new(
            format!("127.0.0.1:{}", self.port).parse().unwrap(),
        );
        cfg.identity =
            Some(longhaul_carrier::Identity::load(&self.dir.join(format!("{key}.key"))).unwrap());
        cfg.pin = Some(self.fp.parse().unwrap());
        let client = Arc::new(rt.block_on(longhaul_forward::Client::start(cfg)).unwrap());
        Raw { rt, client }
    }
}

struct Raw {
    rt: tokio::runtime::Runtime,
    client: Arc<longhaul_forward::Client>,
}

impl Raw {
    fn stream(&self) -> ServicePipe {
        let session = self.client.session();
        self.rt.block_on(async move {
            let opened = session.open(longhaul_files::SERVICE).await.unwrap();
            let (ours, theirs) = LocalStream::service(Duration::from_secs(120));
            opened.attach(ours);
            theirs
        })
    }
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
}

fn count(dir: &Path) -> usize {
    std::fs::read_dir(dir).map(|d| d.count()).unwrap_or(0)
}

fn fds(pid: u32) -> usize {
    count(Path::new(&format!("/proc/{pid}/fd")))
}

/// Item 13: listings of a tree with many long paths, deep, asked for on
/// 16 streams that never read the answer. Before, each listing was built
/// whole (twice) before a byte was sent: 16 × ≈ 35 MiB here. Streamed,
/// each holds its pipe and a batch, and two descriptors whatever the
/// depth.
#[test]
fn listings_stream_with_bounded_memory_and_descriptors() {
    let f = Fixture::start("cp-list", "022", &[]);
    // 60 levels of 60-byte names, then 4 000 files of 200-byte names:
    // paths of ≈ 3 860 bytes.
    let mut deep = f.files.join("deep");
    for i in 0..60 {
        deep.push(format!("{i:02}{}", "d".repeat(58)));
    }
    std::fs::create_dir_all(&deep).unwrap();
    for i in 0..4000 {
        std::fs::File::create(deep.join(format!("{i:04}{}", "f".repeat(196)))).unwrap();
    }
    let pid = f.server.pid();
    let raw = f.raw("ro");
    // The session and its threads first, so what grows is the listings'.
    drop(raw.stream());
    std::thread::sleep(Duration::from_millis(300));
    let (rss0, fds0) = (status_kib(pid, "VmHWM:"), fds(pid));
    let list = Request::List {
        path: b"deep".to_vec(),
    }
    .encode();
    let mut held = vec![];
    for _ in 0..16 {
        let mut s = raw.stream();
        std::io::Write::write_all(&mut s, &list).unwrap();
        held.push(s);
    }
    std::thread::sleep(Duration::from_secs(4));
    let grown_mib = status_kib(pid, "VmHWM:").saturating_sub(rss0) >> 10;
    let more_fds = fds(pid).saturating_sub(fds0);
    eprintln!("16 stalled listings: peak RSS +{grown_mib} MiB, {more_fds} more descriptors");
    assert!(grown_mib < 48, "peak RSS grew by {grown_mib} MiB");
    assert!(more_fds <= 16 * 3 + 8, "{more_fds} more descriptors");

    // Meanwhile the service works for others: a small folder comes over.
    std::fs::create_dir_all(f.files.join("small/sub")).unwrap();
    std::fs::write(f.files.join("small/sub/x.txt"), b"x").unwrap();
    let dest = f.dir.join("got");
    std::fs::create_dir_all(&dest).unwrap();
    let out = f.cp("ro", &["-r", &f.at("/small"), dest.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(std::fs::read(dest.join("small/sub/x.txt")).unwrap(), b"x");

    // Deeper than 64 levels: a message, not a walk without end.
    let mut deeper = f.files.join("deeper");
    for _ in 0..70 {
        deeper.push("d");
    }
    std::fs::create_dir_all(&deeper).unwrap();
    let out = f.cp("ro", &["-r", &f.at("/deeper"), dest.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("deeper than 64"), "{}", stderr(&out));
    drop(held);
    raw.client.stop("done");
    let _ = std::fs::remove_dir_all(&f.dir);
}

/// Sends a GET on a new stream; its answer (the status), or `None` if
/// none came within 5 s.
fn get_status(raw: &Raw, path: &[u8]) -> Option<Result<(), String>> {
    let mut s = raw.stream();
    let req = Request::Get {
        path: path.to_vec(),
        have: 0,
        have_hash: [0; 32],
    }
    .encode();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        std::io::Write::write_all(&mut s, &req).unwrap();
        let _ = tx.send(wire::read_status(&mut s).ok());
    });
    rx.recv_timeout(Duration::from_secs(5)).ok().flatten()
}

/// Item 14: a FIFO in the served folder, and a link to it, asked for more
/// times than there are file-service threads: each is refused at once and
/// the service keeps working. Before, the first GET blocked its thread in
/// `open` for good.
#[test]
fn a_fifo_under_the_served_folder_is_refused_at_once() {
    let f = Fixture::start("cp-fifo", "022", &[]);
    let fifo = f.files.join("fifo");
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    std::os::unix::fs::symlink("fifo", f.files.join("link-to-fifo")).unwrap();
    std::fs::write(f.files.join("ok.txt"), b"fine").unwrap();
    let raw = f.raw("ro");
    let t = Instant::now();
    for i in 0..70 {
        let path: &[u8] = if i % 2 == 0 { b"fifo" } else { b"link-to-fifo" };
        match get_status(&raw, path) {
            Some(Err(msg)) => assert!(msg.contains("not a regular file"), "{msg}"),
            other => panic!("GET {i} of a FIFO: {other:?} (no answer within 5 s)"),
        }
    }
    assert!(t.elapsed() < Duration::from_secs(30));
    raw.client.stop("done");
    let dest = f.dir.join("ok.txt");
    let out = f.cp("ro", &[&f.at("/ok.txt"), dest.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(std::fs::read(&dest).unwrap(), b"fine");
    // A folder holding one copies without it.
    std::fs::create_dir_all(f.files.join("d")).unwrap();
    assert!(Command::new("mkfifo")
        .arg(f.files.join("d/fifo"))
        .status()
        .unwrap()
        .success());
    std::fs::write(f.files.join("d/a.txt"), b"a").unwrap();
    let out = f.cp("ro", &["-r", &f.at("/d"), f.dir.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(f.dir.join("d/a.txt").exists() && !f.dir.join("d/fifo").exists());
    let _ = std::fs::remove_dir_all(&f.dir);
}

/// Item 15: permissions are the source's, less the receiver's umask, both
/// ways; never wider than the file they replace.
#[test]
fn permissions_are_kept_never_widened() {
    let f = Fixture::start("cp-modes", "022", &[]);
    let local = f.dir.join("local");
    std::fs::create_dir_all(&local).unwrap();
    for (name, m) in [("key", 0o600), ("tool", 0o755), ("doc", 0o644)] {
        let p = local.join(name);
        std::fs::write(&p, name).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(m)).unwrap();
    }
    let srcs: Vec<String> = ["key", "tool", "doc"]
        .iter()
        .map(|n| local.join(n).to_str().unwrap().to_string())
        .collect();
    let mut args: Vec<&str> = srcs.iter().map(String::as_str).collect();
    let to = f.at("/");
    args.push(&to);
    let out = f.cp("rw", &args);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        mode(&f.files.join("key")),
        0o600,
        "upload widened a 0600 file"
    );
    assert_eq!(mode(&f.files.join("tool")), 0o755);
    assert_eq!(mode(&f.files.join("doc")), 0o644);

    let back = f.dir.join("back");
    std::fs::create_dir_all(&back).unwrap();
    let srcs = [f.at("/key"), f.at("/tool"), f.at("/doc")];
    let mut args: Vec<&str> = srcs.iter().map(String::as_str).collect();
    args.push(back.to_str().unwrap());
    let out = f.cp("ro", &args);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        mode(&back.join("key")),
        0o600,
        "download widened a 0600 file"
    );
    assert_eq!(mode(&back.join("tool")), 0o755);
    assert_eq!(mode(&back.join("doc")), 0o644);

    // The receiver's umask narrows: 0755 under 027 is 0750.
    let narrow = f.dir.join("narrow");
    let out = f
        .cp_command("ro", "027", &[&f.at("/tool"), narrow.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(mode(&narrow), 0o750);
    // Copied over a 0600 file, a 0644 one does not open it up.
    let secret = f.dir.join("secret");
    std::fs::write(&secret, b"old").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    let out = f.cp("ro", &[&f.at("/doc"), secret.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(std::fs::read(&secret).unwrap(), b"doc");
    assert_eq!(mode(&secret), 0o600, "a copy widened the file it replaced");
    let _ = std::fs::remove_dir_all(&f.dir);
}

/// Item 16: a user's own `.X.longhaul-part` is a file like any other
/// (listed, not swept, not truncated by an upload of X); a hard link
/// placed where a partial copy goes is refused on both sides, never
/// written through.
#[test]
fn partial_copies_cannot_be_confused_or_hard_linked() {
    let dir = tmpdir("cp-parts");
    let files = dir.join("served");
    std::fs::create_dir_all(files.join("d")).unwrap();
    let mine = files.join("d/.a.txt.longhaul-part");
    let f = std::fs::File::create(&mine).unwrap();
    std::io::Write::write_all(&mut &f, b"mine").unwrap();
    f.set_modified(std::time::SystemTime::now() - Duration::from_secs(10 * 86_400))
        .unwrap();
    drop(f);
    let f = Fixture::start_on(dir, files, "022", &["--files-keep-partial", "1d"]);
    // The sweep at start has run when the server answers a copy.
    let local = f.dir.join("a.txt");
    std::fs::write(&local, b"the upload").unwrap();
    let out = f.cp("rw", &[local.to_str().unwrap(), &f.at("/d/a.txt")]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        std::fs::read(f.files.join("d/a.txt")).unwrap(),
        b"the upload"
    );
    assert_eq!(
        std::fs::read(&mine).unwrap(),
        b"mine",
        "a user's file was taken"
    );
    let got = f.dir.join("got");
    std::fs::create_dir_all(&got).unwrap();
    let out = f.cp("ro", &["-r", &f.at("/d"), got.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        std::fs::read(got.join("d/.a.txt.longhaul-part")).unwrap(),
        b"mine",
        "a user's file was left out of the listing"
    );

    // Server side: hard links to a file outside, where an upload of b.txt
    // keeps its partial copy (in this version and the one before).
    let victim = f.dir.join("victim");
    std::fs::write(&victim, b"precious").unwrap();
    let hl = f.files.join("hl");
    std::fs::create_dir_all(hl.join(".longhaul-partial")).unwrap();
    std::fs::set_permissions(
        hl.join(".longhaul-partial"),
        std::fs::Permissions::from_mode(0o700),
    )
    .unwrap();
    std::fs::hard_link(&victim, hl.join(".longhaul-partial/b.txt")).unwrap();
    std::fs::hard_link(&victim, hl.join(".b.txt.longhaul-part")).unwrap();
    let b = f.dir.join("b.txt");
    std::fs::write(&b, b"overwritten!").unwrap();
    let out = f.cp("rw", &[b.to_str().unwrap(), &f.at("/hl/b.txt")]);
    assert!(!out.status.success(), "an upload wrote through a hard link");
    assert!(stderr(&out).contains("links"), "{}", stderr(&out));
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
    assert!(!hl.join("b.txt").exists());
    assert!(
        f.server_log().contains("partial upload refused"),
        "{}",
        f.server_log()
    );

    // Client side: the same in the destination folder of a download.
    let dest = f.dir.join("dest");
    std::fs::create_dir_all(dest.join(".longhaul-partial")).unwrap();
    std::fs::hard_link(&victim, dest.join(".longhaul-partial/a.txt")).unwrap();
    std::fs::hard_link(&victim, dest.join(".a.txt.longhaul-part")).unwrap();
    let out = f.cp("ro", &[&f.at("/d/a.txt"), dest.to_str().unwrap()]);
    assert!(
        !out.status.success(),
        "a download wrote through a hard link"
    );
    assert!(stderr(&out).contains("links"), "{}", stderr(&out));
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious");

    // The state folder is nobody's to name, and not listed.
    std::fs::create_dir_all(f.files.join("d/.longhaul-partial")).unwrap();
    std::fs::write(f.files.join("d/.longhaul-partial/zz"), b"half").unwrap();
    let out = f.cp(
        "rw",
        &[b.to_str().unwrap(), &f.at("/d/.longhaul-partial/zz")],
    );
    assert!(!out.status.success());
    assert!(stderr(&out).contains("refused"), "{}", stderr(&out));
    assert_eq!(
        std::fs::read(f.files.join("d/.longhaul-partial/zz")).unwrap(),
        b"half"
    );
    let again = f.dir.join("again");
    std::fs::create_dir_all(&again).unwrap();
    let out = f.cp("ro", &["-r", &f.at("/d"), again.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        !again.join("d/.longhaul-partial").exists(),
        "state folder listed"
    );
    let _ = std::fs::remove_dir_all(&f.dir);
}

/// Item 17: `cp -r` never writes through a symbolic link beneath the
/// destination: one already there, or a folder swapped for one while the
/// copy runs.
#[test]
fn downloads_never_write_through_links_in_the_destination() {
    let f = Fixture::start("cp-links", "022", &[]);
    std::fs::create_dir_all(f.files.join("tree/sub")).unwrap();
    std::fs::write(f.files.join("tree/sub/file.txt"), b"payload").unwrap();
    std::fs::write(f.files.join("tree/top.txt"), b"top").unwrap();
    let other = f.dir.join("other");
    std::fs::create_dir_all(&other).unwrap();

    // A link inside the destination, where the copy makes a folder.
    let dest = f.dir.join("dest");
    std::fs::create_dir_all(dest.join("tree")).unwrap();
    std::os::unix::fs::symlink(&other, dest.join("tree/sub")).unwrap();
    let out = f.cp("ro", &["-r", &f.at("/tree"), dest.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("symbolic link"), "{}", stderr(&out));
    assert_eq!(count(&other), 0, "wrote through a link: {:?}", other);

    // The folder the copy is named after, a link of another user's (one
    // planted first in a shared place): refused.
    let dest2 = f.dir.join("dest2");
    std::fs::create_dir_all(&dest2).unwrap();
    std::os::unix::fs::symlink(&other, dest2.join("tree")).unwrap();
    if std::os::unix::fs::lchown(dest2.join("tree"), Some(65534), Some(65534)).is_ok() {
        let out = f.cp("ro", &["-r", &f.at("/tree"), dest2.to_str().unwrap()]);
        assert!(!out.status.success());
        assert!(stderr(&out).contains("symbolic link"), "{}", stderr(&out));
        assert_eq!(count(&other), 0, "wrote through a link");
    }
    // The user's own link there (`~/photos -> /mnt/big/photos`) is the
    // user's choice, as with cp and scp: the copy goes where it points.
    let dest4 = f.dir.join("dest4");
    let mine = f.dir.join("mine");
    std::fs::create_dir_all(&dest4).unwrap();
    std::fs::create_dir_all(&mine).unwrap();
    std::os::unix::fs::symlink(&mine, dest4.join("tree")).unwrap();
    let out = f.cp("ro", &["-r", &f.at("/tree"), dest4.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        std::fs::read(mine.join("sub/file.txt")).unwrap(),
        b"payload"
    );
    // A folder the copy makes is never wider than its source could be.
    assert_eq!(mode(&mine.join("sub")), 0o700);
    // A folder of that name another user made first (in /tmp, say): refused.
    let dest5 = f.dir.join("dest5");
    std::fs::create_dir_all(dest5.join("tree")).unwrap();
    if std::os::unix::fs::chown(dest5.join("tree"), Some(65534), Some(65534)).is_ok() {
        let out = f.cp("ro", &["-r", &f.at("/tree"), dest5.to_str().unwrap()]);
        assert!(!out.status.success());
        assert!(
            stderr(&out).contains("belongs to another user"),
            "{}",
            stderr(&out)
        );
        assert_eq!(count(&dest5.join("tree")), 0);
    }

    // Swapped while the copy runs: a/big.bin first (one file at a time),
    // then b/small.txt, whose folder is by then a link to elsewhere.
    std::fs::create_dir_all(f.files.join("race/a")).unwrap();
    std::fs::create_dir_all(f.files.join("race/b")).unwrap();
    let big = std::fs::File::create(f.files.join("race/a/big.bin")).unwrap();
    let block: Vec<u8> = (0..1u32 << 20)
        .map(|i| i.wrapping_mul(2_654_435_761) as u8)
        .collect();
    for _ in 0..256 {
        std::io::Write::write_all(&mut &big, &block).unwrap();
    }
    drop(big);
    std::fs::write(f.files.join("race/b/small.txt"), b"small").unwrap();
    let dest3 = f.dir.join("dest3");
    std::fs::create_dir_all(&dest3).unwrap();
    let mut child = Kill(
        f.cp_command(
            "ro",
            "022",
            &["-r", "--jobs", "1", &f.at("/race"), dest3.to_str().unwrap()],
        )
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap(),
    );
    let a = dest3.join("race/a");
    let writing = || {
        a.join(".big.bin.longhaul-part").exists() || a.join(".longhaul-partial/big.bin").exists()
    };
    wait_until(30, "the download of big.bin to start", || {
        writing() && dest3.join("race/b").is_dir()
    });
    std::fs::rename(dest3.join("race/b"), dest3.join("race/b-moved")).unwrap();
    std::os::unix::fs::symlink(&other, dest3.join("race/b")).unwrap();
    assert!(!a.join("big.bin").exists(), "swapped too late to tell");
    let status = child.0.wait().unwrap();
    assert!(!status.success(), "small.txt was written somewhere");
    assert_eq!(count(&other), 0, "wrote through a swapped link");
    assert!(a.join("big.bin").exists());
    let _ = std::fs::remove_dir_all(&f.dir);
}
