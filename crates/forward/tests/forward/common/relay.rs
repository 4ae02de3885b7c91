//! A TCP relay between client and server that the test controls: it can
//! reset every connection it holds (a dropped carrier), refuse new ones for
//! a while (the path is down), or stop forwarding while keeping the
//! connections open (a path gone silent: a NAT that forgot the flow) —
//! for all connections, or for one (a lane of a striped session).

#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

pub struct Relay {
    pub addr: SocketAddr,
    /// Bumped to reset every connection held.
    kill: watch::Sender<u64>,
    down: Arc<AtomicBool>,
    silent: Arc<AtomicBool>,
    /// Each connection's own controls, in the order they came.
    each: Arc<Mutex<Vec<One>>>,
}

/// One connection's controls.
#[derive(Clone)]
struct One {
    kill: watch::Sender<bool>,
    silent: Arc<AtomicBool>,
    /// Client-to-server bytes are read and thrown away (a black hole that
    /// still takes them); the other way still flows.
    discard_up: Arc<AtomicBool>,
    /// Still relaying.
    open: Arc<AtomicBool>,
}

impl Relay {
    pub async fn start(upstream: SocketAddr) -> Relay {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let (kill, _) = watch::channel(0u64);
        let down = Arc::new(AtomicBool::new(false));
        let silent = Arc::new(AtomicBool::new(false));
        let (k, d, s) = (kill.clone(), down.clone(), silent.clone());
        let each = Arc::new(Mutex::new(Vec::new()));
        let e = each.clone();
        tokio::spawn(async move {
            while let Ok((a, _)) = l.accept().await {
                if d.load(Ordering::SeqCst) {
                    reset(&a);
                    continue;
                }
                let Ok(b) = TcpStream::connect(upstream).await else {
                    reset(&a);
                    continue;
                };
                let one = One {
                    kill: watch::channel(false).0,
                    silent: Arc::new(AtomicBool::new(false)),
                    discard_up: Arc::new(AtomicBool::new(false)),
                    open: Arc::new(AtomicBool::new(true)),
                };
                e.lock().unwrap().push(one.clone());
                tokio::spawn(pair(a, b, k.subscribe(), s.clone(), one));
            }
        });
        Relay {
            addr,
            kill,
            down,
            silent,
            each,
        }
    }

    /// Connections made through the relay so far.
    pub fn connections(&self) -> usize {
        self.each.lock().unwrap().len()
    }

    /// The indexes of the connections still relaying.
    pub fn live(&self) -> Vec<usize> {
        let each = self.each.lock().unwrap();
        (0..each.len())
            .filter(|&i| each[i].open.load(Ordering::SeqCst))
            .collect()
    }

    /// Resets connection `i` (in the order they came) only.
    pub fn reset_one(&self, i: usize) {
        let _ = self.each.lock().unwrap()[i].kill.send(true);
    }

    /// Stops forwarding on connection `i` only (it stays open).
    pub fn silence_one(&self, i: usize) {
        self.each.lock().unwrap()[i]
            .silent
            .store(true, Ordering::SeqCst);
    }

    /// From now on connection `i` throws away what the client sends (it
    /// still reads it, so the client's socket never fills), and still
    /// forwards what the server sends: a lane that hears and cannot send.
    pub fn black_hole_upstream(&self, i: usize) {
        self.each.lock().unwrap()[i]
            .discard_up
            .store(true, Ordering::SeqCst);
    }

    /// Resets every connection now held (both sides see a reset).
    pub fn reset_all(&self) {
        self.kill.send_modify(|k| *k += 1);
    }

    /// While down, new connections are reset at once.
    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
    }

    /// Stops forwarding on the connections held now (they stay open);
    /// new connections forward normally.
    pub fn go_silent(&self) {
        self.silent.store(true, Ordering::SeqCst);
    }

    /// Drops the connection that went silent, then lets new ones through.
    pub fn reset_silent(&self) {
        self.reset_all();
        self.silent.store(false, Ordering::SeqCst);
    }

    /// A drop: resets everything, refuses new connections for `outage`.
    pub async fn outage(&self, outage: Duration) {
        self.set_down(true);
        self.reset_all();
        tokio::time::sleep(outage).await;
        self.set_down(false);
    }
}

fn reset(s: &TcpStream) {
    // A zero linger resets at close, at once (it never blocks).
    let _ = socket2::SockRef::from(s).set_linger(Some(Duration::ZERO));
}

/// Copies both ways until either side ends or the test resets the pair.
async fn pair(
    a: TcpStream,
    b: TcpStream,
    mut kill: watch::Receiver<u64>,
    silent: Arc<AtomicBool>,
    one: One,
) {
    let _ = a.set_nodelay(true);
    let _ = b.set_nodelay(true);
    // Whenever the pair is dropped, both ends see a reset, not an end.
    reset(&a);
    reset(&b);
    let (ar, aw) = a.into_split();
    let (br, bw) = b.into_split();
    let quiet = [&*silent, &*one.silent];
    let never = AtomicBool::new(false);
    let copy = async {
        tokio::join!(
            one_way(ar, bw, &quiet, &one.discard_up),
            one_way(br, aw, &quiet, &never)
        );
    };
    let start = *kill.borrow_and_update();
    let mut kill_one = one.kill.subscribe();
    tokio::select! {
        _ = copy => {}
        _ = kill.wait_for(|k| *k != start) => {}
        _ = kill_one.wait_for(|k| *k) => {}
    }
    one.open.store(false, Ordering::SeqCst);
}

/// Copies one direction, holding bytes while the path is silent; passes the
/// end of data on.
async fn one_way(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    silent: &[&AtomicBool; 2],
    discard: &AtomicBool,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if discard.load(Ordering::SeqCst) {
            continue;
        }
        while silent.iter().any(|s| s.load(Ordering::SeqCst)) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}
