//! `longhaul cp` run as a user would: real server and client processes,
//! real TLS, files compared by hash.

use crate::common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// A server offering `files` to three keys: one read-write, one read-only,
/// one with no file access.
struct Fixture {
    dir: PathBuf,
    files: PathBuf,
    port: u16,
    fp: String,
    log: PathBuf,
    _server: Kill,
}

impl Fixture {
    fn start(name: &str, files: Option<PathBuf>) -> Fixture {
        Fixture::start_with(name, files, &[])
    }

    /// With more server arguments (e.g. `--listen` URLs beside TLS on
    /// loopback).
    fn start_with(name: &str, files: Option<PathBuf>, more: &[String]) -> Fixture {
        let dir = tmpdir(name);
        let files = files.unwrap_or_else(|| {
            let f = dir.join("served");
            std::fs::create_dir_all(&f).unwrap();
            f
        });
        let fp = keygen(&dir.join("server.key"));
        let rw = keygen(&dir.join("rw.key"));
        let ro = keygen(&dir.join("ro.key"));
        let none = keygen(&dir.join("none.key"));
        std::fs::write(
            dir.join("authorized_keys"),
            format!("{rw} files=rw # writer\n{ro} files=ro # reader\n{none} # forwards only\n"),
        )
        .unwrap();
        let port = free_port();
        let log = dir.join("server.log");
        let more: Vec<&str> = more.iter().map(String::as_str).collect();
        let server = spawn_logged(
            &[
                &[
                    "server",
                    "--listen",
                    &format!("127.0.0.1:{port}"),
                    "--key",
                    dir.join("server.key").to_str().unwrap(),
                    "--authorized-keys",
                    dir.join("authorized_keys").to_str().unwrap(),
                    "--files",
                    files.to_str().unwrap(),
                ],
                &more[..],
            ]
            .concat(),
            &log,
        );
        wait_port(port);
        Fixture {
            dir,
            files,
            port,
            fp,
            log,
            _server: server,
        }
    }

    /// `SERVER:PATH` for this server.
    fn at(&self, path: &str) -> String {
        format!("127.0.0.1:{}:{path}", self.port)
    }

    fn cp_command(&self, key: &str, args: &[&str]) -> Command {
        let mut c = Command::new(BIN);
        c.args(["cp", "--json", "--key"])
            .arg(self.dir.join(format!("{key}.key")))
            .args(["--pin", &self.fp])
            .args(args);
        c
    }

    fn cp(&self, key: &str, args: &[&str]) -> Output {
        self.cp_command(key, args).output().unwrap()
    }

    fn server_log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// The fixture's folder goes with it, pass or fail: these tests write
/// gibibytes, and a full temporary disk fails every test after them. The
/// server stops first (it could still create files), and a failing
/// test's server log is printed before it goes.
impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = self._server.0.kill();
        let _ = self._server.0.wait();
        if std::thread::panicking() {
            eprintln!("--- server log ---\n{}", self.server_log());
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn json(out: &Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|_| {
        panic!(
            "no JSON from cp: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Writes `size` pseudo-random bytes; returns their BLAKE3 hash (hex).
fn random_file(path: &Path, size: u64, seed: u64) -> String {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    let mut h = blake3::Hasher::new();
    let mut x = seed | 1;
    let mut block = vec![0u8; 1 << 20];
    let mut left = size;
    while left > 0 {
        for w in block.chunks_exact_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            w.copy_from_slice(&x.to_le_bytes());
        }
        let n = left.min(block.len() as u64) as usize;
        h.update(&block[..n]);
        f.write_all(&block[..n]).unwrap();
        left -= n as u64;
    }
    f.flush().unwrap();
    h.finalize().to_hex().to_string()
}

fn hash_file(path: &Path) -> String {
    let mut h = blake3::Hasher::new();
    let mut f = std::fs::File::open(path).unwrap();
    std::io::copy(&mut f, &mut h).unwrap();
    h.finalize().to_hex().to_string()
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn a_gibibyte_goes_both_ways_intact() {
    let f = Fixture::start("cp-gib", None);
    let src = f.dir.join("big.bin");
    let want = random_file(&src, 1 << 30, 7);
    let out = f.cp("rw", &[src.to_str().unwrap(), &f.at("/")]);
    assert!(out.status.success(), "{}", stderr(&out));
    let j = json(&out);
    assert_eq!(j["bytes"], 1u64 << 30);
    assert_eq!(j["copied"][0]["blake3"], want.as_str());
    assert_eq!(hash_file(&f.files.join("big.bin")), want);
    assert_eq!(names(&f.files), ["big.bin"], "no partial file left");
    // Two copies on disk at a time, not three.
    std::fs::remove_file(&src).unwrap();

    let back = f.dir.join("back.bin");
    let out = f.cp("ro", &[&f.at("/big.bin"), back.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(json(&out)["copied"][0]["blake3"], want.as_str());
    assert_eq!(hash_file(&back), want);
}

/// Kills `cp` once its partial file holds a quarter of `size`.
fn kill_when_partial(mut cmd: Command, part: &Path, size: u64) -> u64 {
    let mut child = Kill(
        cmd.stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let t = std::time::Instant::now();
    loop {
        let len = std::fs::metadata(part).map(|m| m.len()).unwrap_or(0);
        if len >= size / 4 {
            // SIGKILL: no chance to tidy up, like a lost machine.
            let _ = child.0.kill();
            let _ = child.0.wait();
            return std::fs::metadata(part).unwrap().len();
        }
        assert!(
            child.0.try_wait().unwrap().is_none(),
            "the copy finished before it could be interrupted"
        );
        assert!(t.elapsed() < Duration::from_secs(60), "no progress");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn an_interrupted_copy_resumes_from_the_verified_prefix() {
    let f = Fixture::start("cp-resume", None);
    let size = 512 << 20;
    let src = f.dir.join("src.bin");
    let want = random_file(&src, size, 11);

    // Download, killed half-way, then the same command again.
    std::fs::copy(&src, f.files.join("down.bin")).unwrap();
    let dest = f.dir.join("down.bin");
    let part = f.dir.join(".longhaul-partial/down.bin");
    let args = [f.at("/down.bin"), dest.to_str().unwrap().to_string()];
    let args: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
    let had = kill_when_partial(f.cp_command("rw", &args), &part, size);
    assert!(
        !dest.exists(),
        "an unfinished copy must not have the final name"
    );
    let out = f.cp("rw", &args);
    assert!(out.status.success(), "{}", stderr(&out));
    let j = json(&out);
    let resumed = j["resumed"].as_u64().unwrap();
    let moved = j["transferred"].as_u64().unwrap();
    assert!(resumed > 0 && resumed <= had, "resumed {resumed} of {had}");
    assert_eq!(moved, size - resumed, "only the remainder is sent again");
    assert_eq!(hash_file(&dest), want);
    assert!(!part.exists());

    // Upload, killed half-way: the server keeps the part (its session
    // waits for a resume) and the next upload takes it over at once.
    let part = f.files.join(".longhaul-partial/up.bin");
    let args = [src.to_str().unwrap().to_string(), f.at("/up.bin")];
    let args: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
    let had = kill_when_partial(f.cp_command("rw", &args), &part, size);
    let out = f.cp("rw", &args);
    assert!(out.status.success(), "{}", stderr(&out));
    let j = json(&out);
    let resumed = j["resumed"].as_u64().unwrap();
    assert!(
        resumed > 0 && resumed <= had + (64 << 20),
        "resumed {resumed}, had {had}"
    );
    assert_eq!(j["transferred"].as_u64().unwrap(), size - resumed);
    assert_eq!(hash_file(&f.files.join("up.bin")), want);
    assert_eq!(names(&f.files), ["down.bin", "up.bin"]);

    // A partial file that does not match the source is not trusted.
    std::fs::create_dir_all(part.parent().unwrap()).unwrap();
    std::fs::write(&part, vec![0u8; 4 << 20]).unwrap();
    let out = f.cp("rw", &args);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(json(&out)["resumed"], 0);
    assert_eq!(hash_file(&f.files.join("up.bin")), want);
}

#[test]
fn keys_get_only_the_access_they_are_given() {
    let f = Fixture::start("cp-access", None);
    let src = f.dir.join("a.txt");
    std::fs::write(&src, b"hello").unwrap();
    std::fs::write(f.files.join("there.txt"), b"there").unwrap();

    let out = f.cp("ro", &[src.to_str().unwrap(), &f.at("/a.txt")]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("read-only"), "{}", stderr(&out));
    assert_eq!(
        names(&f.files),
        ["there.txt"],
        "nothing written, not even a part"
    );

    let out = f.cp(
        "none",
        &[&f.at("/there.txt"), f.dir.join("x").to_str().unwrap()],
    );
    assert!(!out.status.success());
    assert!(stderr(&out).contains("no file access"), "{}", stderr(&out));

    let got = f.dir.join("got.txt");
    let out = f.cp("ro", &[&f.at("/there.txt"), got.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(std::fs::read(&got).unwrap(), b"there");
    assert!(
        f.server_log().contains("read-only access"),
        "refusal logged"
    );
    // The refusals name the fix.
    let out = f.cp("ro", &[src.to_str().unwrap(), &f.at("/b.txt")]);
    assert!(stderr(&out).contains("files=rw"), "{}", stderr(&out));
}

#[test]
fn an_identical_file_is_verified_not_sent_again_and_a_missing_folder_is_named() {
    let f = Fixture::start("cp-identical", None);
    let src = f.dir.join("big.bin");
    random_file(&src, 8 << 20, 7);
    for round in 0..2 {
        let out = f.cp("rw", &[src.to_str().unwrap(), &f.at("/")]);
        assert!(out.status.success(), "{}", stderr(&out));
        let v = json(&out);
        if round == 1 {
            // Verified by hash where it is: nothing sent again.
            assert_eq!(v["resumed"].as_u64(), Some(8 << 20), "{v}");
        }
    }
    assert_eq!(hash_file(&src), hash_file(&f.files.join("big.bin")));
    assert_eq!(names(&f.files), ["big.bin"], "no partial copy left");
    // The same name, other bytes: sent in full, and replaced.
    random_file(&src, 8 << 20, 8);
    let out = f.cp("rw", &[src.to_str().unwrap(), &f.at("/")]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(hash_file(&src), hash_file(&f.files.join("big.bin")));
    // A folder that is not there is named as the server's, and the
    // failure is said once.
    let out_text = Command::new(BIN)
        .args(["cp", "--key"])
        .arg(f.dir.join("rw.key"))
        .args(["--pin", &f.fp, src.to_str().unwrap(), &f.at("/nope/")])
        .output()
        .unwrap();
    assert!(!out_text.status.success());
    let err = stderr(&out_text);
    assert!(err.contains("no folder /nope on the server"), "{err}");
    assert_eq!(err.matches("failed").count(), 1, "{err}");
}

#[test]
fn folders_copy_with_r_and_not_without() {
    let f = Fixture::start("cp-tree", None);
    let tree = f.dir.join("tree");
    std::fs::create_dir_all(tree.join("sub/deeper")).unwrap();
    std::fs::create_dir_all(tree.join("empty")).unwrap();
    let mut want = vec![];
    for (i, p) in ["a.bin", "sub/b.bin", "sub/deeper/c.bin"]
        .iter()
        .enumerate()
    {
        want.push((
            p,
            random_file(&tree.join(p), 1000 + i as u64 * 70_000, i as u64),
        ));
    }
    let out = f.cp("rw", &[tree.to_str().unwrap(), &f.at("/")]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("-r"), "{}", stderr(&out));

    let out = f.cp("rw", &["-r", tree.to_str().unwrap(), &f.at("/")]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(json(&out)["files"], 3);
    assert!(f.files.join("tree/empty").is_dir());

    let back = f.dir.join("back");
    std::fs::create_dir(&back).unwrap();
    let out = f.cp("rw", &["-r", &f.at("/tree"), back.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    for (p, h) in &want {
        assert_eq!(&hash_file(&back.join("tree").join(p)), h, "{p}");
    }
    assert!(back.join("tree/empty").is_dir());
}

/// Rewrites the first byte of `path` every few milliseconds until `stop`.
fn keep_touching(
    path: PathBuf,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        let mut b = 0u8;
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            b = b.wrapping_add(1);
            f.write_all_at(&[b], 0).unwrap();
            std::thread::sleep(Duration::from_millis(5));
        }
    })
}

#[test]
fn a_file_changing_while_read_is_reported_not_copied_torn() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let f = Fixture::start("cp-torn", None);
    let src = f.dir.join("live.bin");
    random_file(&src, 256 << 20, 3);
    std::fs::copy(&src, f.files.join("live.bin")).unwrap();

    // Upload: the client reads a file that changes.
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let t = keep_touching(src.clone(), stop.clone());
    let out = f.cp("rw", &[src.to_str().unwrap(), &f.at("/up.bin")]);
    stop.store(true, Ordering::Relaxed);
    t.join().unwrap();
    assert!(!out.status.success(), "a torn copy was accepted");
    assert!(
        stderr(&out).contains("changed while being read"),
        "{}",
        stderr(&out)
    );
    assert_eq!(names(&f.files), ["live.bin"], "no up.bin, no part");

    // Download: the server reads a file that changes.
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let t = keep_touching(f.files.join("live.bin"), stop.clone());
    let dest = f.dir.join("down.bin");
    let out = f.cp("rw", &[&f.at("/live.bin"), dest.to_str().unwrap()]);
    stop.store(true, Ordering::Relaxed);
    t.join().unwrap();
    assert!(!out.status.success(), "a torn copy was accepted");
    assert!(
        stderr(&out).contains("changed while being read"),
        "{}",
        stderr(&out)
    );
    assert!(!dest.exists());
    assert!(!f.dir.join(".longhaul-partial/down.bin").exists());
}

/// A tmpfs of `size` at a fresh directory (root only), unmounted on drop.
struct SmallTmpfs(PathBuf);

impl SmallTmpfs {
    fn mount(dir: PathBuf, size: &str) -> Option<SmallTmpfs> {
        std::fs::create_dir_all(&dir).unwrap();
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&dir)
            .status()
            .is_ok_and(|s| s.success());
        ok.then_some(SmallTmpfs(dir))
    }
}

impl Drop for SmallTmpfs {
    fn drop(&mut self) {
        // Lazy: a server that still holds a file open must not leave the
        // mount (and its folder) behind.
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

#[test]
fn a_full_disk_is_a_clear_error_and_leaves_no_file() {
    let base = tmpdir("cp-full");
    let Some(full) = SmallTmpfs::mount(base.join("small"), "32m") else {
        assert!(
            std::env::var("CI").is_err(),
            "CI runs as root: mount must work"
        );
        return eprintln!("skipping: cannot mount a tmpfs (not root?)");
    };
    let f = Fixture::start("cp-full-srv", Some(full.0.clone()));
    let src = base.join("big.bin");
    random_file(&src, 64 << 20, 5);

    // The server's disk fills.
    let out = f.cp("rw", &[src.to_str().unwrap(), &f.at("/big.bin")]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("No space left on device"), "{err}");
    assert!(
        names(&full.0).is_empty(),
        "left behind: {:?}",
        names(&full.0)
    );

    // The client's disk fills.
    std::fs::remove_dir_all(&f.files).ok();
    drop(f);
    let f = Fixture::start("cp-full-cl", None);
    std::fs::copy(&src, f.files.join("big.bin")).unwrap();
    let out = f.cp(
        "rw",
        &[&f.at("/big.bin"), full.0.join("big.bin").to_str().unwrap()],
    );
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("No space left on device"),
        "{}",
        stderr(&out)
    );
    assert!(
        names(&full.0).is_empty(),
        "left behind: {:?}",
        names(&full.0)
    );
    drop(full);
    let _ = std::fs::remove_dir_all(&base);
}

#[test]
fn bad_cp_arguments_get_one_line() {
    for (args, want) in [
        (vec!["a", "b"], "no side is remote"),
        (
            vec!["127.0.0.1:1:/a", "127.0.0.1:1:/b"],
            "both sides are remote",
        ),
        (vec!["a", "127.0.0.1:1:/../x"], "'..' is refused"),
    ] {
        let out = Command::new(BIN).arg("cp").args(&args).output().unwrap();
        assert!(!out.status.success());
        let err = stderr(&out);
        assert!(err.contains(want), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
    }
}

#[test]
fn partial_uploads_nobody_resumes_are_removed_in_time() {
    let base = tmpdir("cp-sweep");
    let served = base.join("served");
    std::fs::create_dir_all(served.join("deep/.longhaul-partial")).unwrap();
    std::fs::create_dir_all(served.join(".longhaul-partial")).unwrap();
    let ten_days_ago = std::time::SystemTime::now() - Duration::from_secs(10 * 86_400);
    for (name, old) in [
        (".longhaul-partial/old.iso", true),
        ("deep/.longhaul-partial/old2.iso", true),
        (".longhaul-partial/new.iso", false),
        ("kept.iso", true),
    ] {
        let f = std::fs::File::create(served.join(name)).unwrap();
        if old {
            f.set_modified(ten_days_ago).unwrap();
        }
    }
    let f = Fixture::start_with(
        "cp-sweep-srv",
        Some(served.clone()),
        &["--files-keep-partial".into(), "2d".into()],
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    let said = "removed 2 partial upload(s)";
    while !f.server_log().contains(said) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(f.server_log().contains(said), "{}", f.server_log());
    assert!(!served.join(".longhaul-partial/old.iso").exists());
    assert!(!served.join("deep/.longhaul-partial").exists());
    assert!(served.join(".longhaul-partial/new.iso").exists());
    assert!(served.join("kept.iso").exists());
    // A bad age is one line that says what to write instead.
    let out = Command::new(BIN)
        .args(["server", "--files-keep-partial", "a week"])
        .output()
        .unwrap();
    let err = stderr(&out);
    assert!(!out.status.success());
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("7d"), "{err}");
    let _ = std::fs::remove_dir_all(&base);
}

#[test]
fn cp_works_over_every_carrier() {
    let ws_port = free_port();
    let base = tmpdir("cp-carriers");
    let share = base.join("share");
    std::fs::create_dir_all(&share).unwrap();
    let f = Fixture::start_with(
        "cp-carriers-srv",
        None,
        &[
            "--listen".into(),
            format!("ws://127.0.0.1:{ws_port}/lh"),
            "--listen".into(),
            format!("dir://{}", share.display()),
        ],
    );
    wait_port(ws_port);
    let src = f.dir.join("src.bin");
    let want = random_file(&src, 24 << 20, 9);
    for (server, name) in [
        (
            format!("tls://127.0.0.1:{}?stripes=3", f.port),
            "striped.bin",
        ),
        (format!("ws://127.0.0.1:{ws_port}/lh"), "ws.bin"),
        (format!("dir://{}", share.display()), "folder.bin"),
    ] {
        let out = f.cp("rw", &[src.to_str().unwrap(), &format!("{server}:/{name}")]);
        assert!(out.status.success(), "{server}: {}", stderr(&out));
        assert_eq!(hash_file(&f.files.join(name)), want, "{server}");
        let back = f.dir.join(format!("back-{name}"));
        let out = f.cp(
            "ro",
            &[&format!("{server}:/{name}"), back.to_str().unwrap()],
        );
        assert!(out.status.success(), "{server}: {}", stderr(&out));
        assert_eq!(hash_file(&back), want, "{server}");
    }
    let _ = std::fs::remove_dir_all(&base);
}

#[test]
fn path_escapes_are_refused_and_logged() {
    use longhaul_files::client::{Counters, Remote};
    let f = Fixture::start("cp-escape", None);
    std::fs::write(f.dir.join("secret.txt"), b"secret").unwrap();
    std::fs::write(f.files.join("inside.txt"), b"inside").unwrap();
    std::os::unix::fs::symlink(&f.dir, f.files.join("out")).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", f.files.join("abs")).unwrap();
    std::os::unix::fs::symlink("inside.txt", f.files.join("in")).unwrap();

    // A client that sends whatever paths it likes (the cp command itself
    // refuses '..' before sending).
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut cfg =
        longhaul_forward::ClientConfig::new(format!("127.0.0.1:{}", f.port).parse().unwrap());
    cfg.identity = Some(longhaul_carrier::Identity::load(&f.dir.join("rw.key")).unwrap());
    cfg.pin = Some(f.fp.parse().unwrap());
    let client = std::sync::Arc::new(rt.block_on(longhaul_forward::Client::start(cfg)).unwrap());
    let c = client.clone();
    let remote = Remote {
        runtime: rt.handle().clone(),
        session: std::sync::Arc::new(move || c.session()),
    };
    let mut conn = remote.connect().unwrap();
    let counters = Counters::default();
    let dest = f.dir.join("got");
    let dest = &longhaul_files::local::LocalDest::path(&dest).unwrap();
    let err = |r: anyhow::Result<()>| format!("{:#}", r.unwrap_err());

    assert!(err(conn.stat(b"../secret.txt").map(drop)).contains("'..' is refused"));
    assert!(err(conn.stat(b"/etc/passwd").map(drop)).contains("absolute paths are refused"));
    assert!(err(conn.get(b"out/secret.txt", dest, &counters).map(drop)).contains("leads out"));
    assert!(err(conn.get(b"abs", dest, &counters).map(drop)).contains("leads out"));
    let src = f.dir.join("secret.txt");
    assert!(err(conn
        .put(&src, b"out/planted.txt", b"", None, &counters)
        .map(drop))
    .contains("leads out"));
    assert!(err(conn
        .put(&src, b"sub/../../planted.txt", b"", None, &counters)
        .map(drop))
    .contains("'..' is refused"));
    assert!(err(conn
        .put(&src, b"", b"../planted.txt", None, &counters)
        .map(drop))
    .contains("'..' is refused"));
    assert!(!f.dir.join("planted.txt").exists());
    assert!(!f.dir.join("got").exists());

    // What stays inside works, on the same stream.
    let listed: Vec<String> = conn
        .list(b"")
        .unwrap()
        .iter()
        .map(|e| String::from_utf8_lossy(&e.path).into_owned())
        .collect();
    assert_eq!(listed, ["inside.txt"], "symbolic links are not listed");
    conn.get(b"in", dest, &counters).unwrap();
    assert_eq!(std::fs::read(f.dir.join("got")).unwrap(), b"inside");

    client.stop("done");
    let log = f.server_log();
    assert!(log.matches("file request refused").count() >= 6, "{log}");
}
