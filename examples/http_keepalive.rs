//! http_keepalive: a minimal HTTP/1.1 keep-alive responder on 127.0.0.1, with T
//! threads delivering on one poller.
//!
//! ```text
//! cargo run --release --example http_keepalive [-- --threads T --port PORT --peer pollshot|polling --backend NAME --seconds S]
//! cargo run --release --features io-uring --example http_keepalive -- --backend uring
//! wrk -t2 -c64 -d5s http://127.0.0.1:PORT/
//! ```
//!
//! - `--threads T`: threads sharing the one poller (default 2)
//! - `--port PORT`: default 0 (any free port; the one chosen is printed)
//! - `--peer polling`: the same responder on the `polling` crate (oneshot mode,
//!   re-armed with `modify`), for comparison; default `pollshot`
//! - `--backend NAME`: pollshot's backend: the default one (`epoll` on Linux,
//!   `kqueue` on the BSDs and macOS, `afd` on Windows; the default) or `uring`
//!   (Linux, built with `--features io-uring`)
//! - `--seconds S`: stop after S seconds (default: run until killed)
//!
//! Every request (anything ending in an empty line; bodies are not expected) gets
//! the same 13-byte `200 OK`. Connections stay open until the client closes them.
//! The pattern is a runtime's: try the I/O first, arm only when it would block; a
//! woken connection reads once (what it read may hold several pipelined requests),
//! answers and arms again. `benches/keepalive.rs` runs this file's [`serve`] under
//! `wrk` for both peers.
//!
//! The same code runs on Unix and on Windows: a socket is passed as
//! `&impl polling::AsSource`, which is `AsFd` on Unix and `AsSocket` on Windows,
//! what `Poller::register` takes on each.

use polling::AsSource;
use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

const RESPONSE: &[u8] =
    b"HTTP/1.1 200 OK\r\nContent-Length: 13\r\nContent-Type: text/plain\r\n\r\nHello, world!";

/// Which poller serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Peer {
    /// `pollshot::Poller` on the default backend.
    Pollshot,
    /// `pollshot::Poller<pollshot::backends::Uring>` (Linux, feature `io-uring`).
    #[cfg(all(target_os = "linux", feature = "io-uring"))]
    PollshotUring,
    /// `polling::Poller` in oneshot mode.
    Polling,
}

impl Peer {
    /// The name reports use: `pollshot-epoll` (the default backend's name),
    /// `pollshot-uring`, `polling`.
    pub fn name(self) -> String {
        match self {
            Peer::Pollshot => format!("pollshot-{}", default_backend()),
            #[cfg(all(target_os = "linux", feature = "io-uring"))]
            Peer::PollshotUring => "pollshot-uring".to_owned(),
            Peer::Polling => "polling".to_owned(),
        }
    }

    /// pollshot on the backend named `name` (`DefaultBackend`'s name, or `uring`
    /// where compiled), or why not.
    pub fn pollshot(name: &str) -> Result<Peer, String> {
        if name == default_backend() {
            return Ok(Peer::Pollshot);
        }
        #[cfg(all(target_os = "linux", feature = "io-uring"))]
        if name == "uring" {
            return Ok(Peer::PollshotUring);
        }
        Err(if name == "uring" {
            "uring needs Linux and --features io-uring".to_owned()
        } else {
            format!(
                "unknown backend {name:?}: expected {} or uring",
                default_backend()
            )
        })
    }
}

/// What a finished server counted.
#[derive(Debug, Default, Clone, Copy)]
pub struct Served {
    /// Requests answered.
    pub requests: u64,
    /// Connections accepted.
    pub connections: u64,
}

/// Readiness interest, as both pollers need it.
#[derive(Clone, Copy)]
enum Want {
    Read,
    ReadWrite,
}

/// The two pollers behind one small interface. A key names a registration.
trait Reactor: Send + Sync + 'static {
    type Events: Send;
    fn events() -> Self::Events;
    /// Registers `sock` and arms it once; returns its key.
    fn add(&self, sock: &impl AsSource, want: Want) -> io::Result<usize>;
    fn arm(&self, key: usize, sock: &impl AsSource, want: Want) -> io::Result<()>;
    /// Waits (up to `timeout`) and lists the keys delivered.
    fn wait(
        &self,
        events: &mut Self::Events,
        keys: &mut Vec<usize>,
        timeout: Option<Duration>,
    ) -> io::Result<()>;
    fn remove(&self, key: usize, sock: &impl AsSource) -> io::Result<()>;
    fn wake(&self) -> io::Result<()>;
}

/// The default backend's name (`epoll`, `kqueue`, `ports`, `blocking`, `afd`),
/// as a poller on it reports it.
fn default_backend() -> &'static str {
    pollshot::Poller::new().map_or("default", |p| p.backend_name())
}

struct PollshotReactor<B: pollshot::Backend>(pollshot::Poller<B>);

impl<B: pollshot::Backend> Reactor for PollshotReactor<B> {
    type Events = pollshot::Events;
    fn events() -> pollshot::Events {
        pollshot::Events::with_capacity(64)
    }
    fn add(&self, sock: &impl AsSource, want: Want) -> io::Result<usize> {
        let token = self.0.register(sock)?;
        let key = token.to_u64() as usize;
        self.arm(key, sock, want)?;
        Ok(key)
    }
    fn arm(&self, key: usize, _sock: &impl AsSource, want: Want) -> io::Result<()> {
        let interest = match want {
            Want::Read => pollshot::Interest::READABLE,
            Want::ReadWrite => pollshot::Interest::BOTH,
        };
        self.0.arm(pollshot::Token::from_u64(key as u64), interest)
    }
    fn wait(
        &self,
        events: &mut pollshot::Events,
        keys: &mut Vec<usize>,
        timeout: Option<Duration>,
    ) -> io::Result<()> {
        match self.0.deliver(events, timeout) {
            // A signal ended the wait: the caller's loop waits again.
            Err(e) if e.kind() == io::ErrorKind::Interrupted => return Ok(()),
            r => r?,
        };
        keys.extend(events.iter().map(|e| e.token().to_u64() as usize));
        Ok(())
    }
    fn remove(&self, key: usize, _sock: &impl AsSource) -> io::Result<()> {
        self.0.deregister(pollshot::Token::from_u64(key as u64))
    }
    fn wake(&self) -> io::Result<()> {
        self.0.notify()
    }
}

struct PollingReactor {
    poller: polling::Poller,
    next: AtomicUsize,
}

impl Reactor for PollingReactor {
    type Events = polling::Events;
    fn events() -> polling::Events {
        polling::Events::with_capacity(std::num::NonZeroUsize::new(64).unwrap())
    }
    fn add(&self, sock: &impl AsSource, want: Want) -> io::Result<usize> {
        let key = self.next.fetch_add(1, Ordering::Relaxed);
        // SAFETY: polling requires a source to be deleted before it is closed: the
        // server calls `remove` before dropping any registered socket.
        unsafe {
            self.poller.add_with_mode(
                &sock.source(),
                event(key, want),
                polling::PollMode::Oneshot,
            )?
        };
        Ok(key)
    }
    fn arm(&self, key: usize, sock: &impl AsSource, want: Want) -> io::Result<()> {
        self.poller
            .modify_with_mode(sock.source(), event(key, want), polling::PollMode::Oneshot)
    }
    fn wait(
        &self,
        events: &mut polling::Events,
        keys: &mut Vec<usize>,
        timeout: Option<Duration>,
    ) -> io::Result<()> {
        events.clear();
        self.poller.wait(events, timeout)?;
        keys.extend(events.iter().map(|e| e.key));
        Ok(())
    }
    fn remove(&self, _key: usize, sock: &impl AsSource) -> io::Result<()> {
        self.poller.delete(sock.source())
    }
    fn wake(&self) -> io::Result<()> {
        self.poller.notify()
    }
}

fn event(key: usize, want: Want) -> polling::Event {
    match want {
        Want::Read => polling::Event::readable(key),
        Want::ReadWrite => polling::Event::all(key),
    }
}

/// One connection: the socket and what its handler keeps between wake-ups.
struct Conn {
    sock: TcpStream,
    state: Mutex<ConnState>,
}

#[derive(Default)]
struct ConnState {
    /// Bytes of a request not yet complete.
    pending: Vec<u8>,
    /// Response bytes the socket did not take yet.
    unsent: Vec<u8>,
}

struct Server<R: Reactor> {
    reactor: R,
    listener: TcpListener,
    listener_key: usize,
    conns: RwLock<HashMap<usize, Arc<Conn>>>,
    stop: Arc<AtomicBool>,
    requests: AtomicU64,
    connections: AtomicU64,
}

/// What a handler asks for next.
enum Next {
    Arm(Want),
    Close,
}

impl<R: Reactor> Server<R> {
    fn accept(&self) -> io::Result<()> {
        loop {
            match self.listener.accept() {
                Ok((sock, _)) => {
                    sock.set_nonblocking(true)?;
                    sock.set_nodelay(true)?;
                    let conn = Arc::new(Conn {
                        sock,
                        state: Mutex::new(ConnState::default()),
                    });
                    // Hold the table while adding, so a delivery for the new key
                    // finds its entry.
                    let mut conns = self.conns.write().unwrap();
                    let key = self.reactor.add(&conn.sock, Want::Read)?;
                    conns.insert(key, conn);
                    self.connections.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                // The client gave up before we accepted (ECONNABORTED) or a signal: go on.
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::ConnectionAborted | io::ErrorKind::Interrupted
                    ) => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// A delivery for connection `conn`: flush what is owed, read once, answer.
    fn handle(&self, conn: &Conn) -> Next {
        let mut st = conn.state.lock().unwrap();
        let st = &mut *st;
        if !st.unsent.is_empty() && !flush(&conn.sock, &mut st.unsent) {
            return Next::Close;
        }
        let mut buf = [0u8; 4096];
        match (&conn.sock).read(&mut buf) {
            Ok(0) => return Next::Close,
            Ok(n) => st.pending.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(_) => return Next::Close,
        }
        let mut answered = 0;
        while let Some(end) = find_end(&st.pending) {
            st.pending.drain(..end + 4);
            st.unsent.extend_from_slice(RESPONSE);
            answered += 1;
        }
        self.requests.fetch_add(answered, Ordering::Relaxed);
        if st.pending.len() > 64 * 1024 {
            return Next::Close; // not a request this responder understands
        }
        if !st.unsent.is_empty() && !flush(&conn.sock, &mut st.unsent) {
            return Next::Close;
        }
        Next::Arm(if st.unsent.is_empty() {
            Want::Read
        } else {
            Want::ReadWrite
        })
    }

    fn close(&self, key: usize) {
        if let Some(conn) = self.conns.write().unwrap().remove(&key) {
            // Deregister before the socket closes (dropped with the last Arc).
            let _ = self.reactor.remove(key, &conn.sock);
        }
    }

    /// One delivering thread.
    fn run(&self) -> io::Result<()> {
        let mut events = R::events();
        let mut keys = Vec::with_capacity(64);
        while !self.stop.load(Ordering::Acquire) {
            keys.clear();
            self.reactor.wait(&mut events, &mut keys, None)?;
            for &key in &keys {
                if key == self.listener_key {
                    self.accept()?;
                    self.reactor.arm(key, &self.listener, Want::Read)?;
                    continue;
                }
                let conn = self.conns.read().unwrap().get(&key).cloned();
                let Some(conn) = conn else { continue };
                match self.handle(&conn) {
                    Next::Arm(want) => {
                        if self.reactor.arm(key, &conn.sock, want).is_err() {
                            self.close(key);
                        }
                    }
                    Next::Close => self.close(key),
                }
            }
        }
        // Pass the stop on to a thread still waiting.
        self.reactor.wake()
    }
}

/// Writes what the socket takes; false when the connection is gone.
fn flush(mut sock: &TcpStream, unsent: &mut Vec<u8>) -> bool {
    while !unsent.is_empty() {
        match sock.write(unsent) {
            Ok(0) => return false,
            Ok(n) => {
                unsent.drain(..n);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return false,
        }
    }
    true
}

/// The offset of the first `\r\n\r\n`.
fn find_end(b: &[u8]) -> Option<usize> {
    b.windows(4).position(|w| w == b"\r\n\r\n")
}

/// Serves HTTP/1.1 keep-alive on `listener` with `threads` threads delivering on
/// one poller of kind `peer`, until `stop` is set (then call [`Stopper::stop`] to
/// wake the threads). Returns the counts when every thread has finished.
pub fn serve(
    listener: TcpListener,
    threads: usize,
    peer: Peer,
) -> io::Result<(Stopper, std::thread::JoinHandle<io::Result<Served>>)> {
    listener.set_nonblocking(true)?;
    let stop = Arc::new(AtomicBool::new(false));
    match peer {
        Peer::Pollshot => start(
            PollshotReactor(pollshot::Poller::new()?),
            listener,
            threads,
            stop,
        ),
        #[cfg(all(target_os = "linux", feature = "io-uring"))]
        Peer::PollshotUring => start(
            PollshotReactor(pollshot::Poller::<pollshot::backends::Uring>::with_backend()?),
            listener,
            threads,
            stop,
        ),
        Peer::Polling => start(
            PollingReactor {
                poller: polling::Poller::new()?,
                next: AtomicUsize::new(0),
            },
            listener,
            threads,
            stop,
        ),
    }
}

/// Stops a running [`serve`].
pub struct Stopper {
    stop: Arc<AtomicBool>,
    wake: Box<dyn Fn() -> io::Result<()> + Send>,
}

impl Stopper {
    /// Asks every thread to finish and wakes them.
    pub fn stop(&self) -> io::Result<()> {
        self.stop.store(true, Ordering::Release);
        (self.wake)()
    }
}

fn start<R: Reactor>(
    reactor: R,
    listener: TcpListener,
    threads: usize,
    stop: Arc<AtomicBool>,
) -> io::Result<(Stopper, std::thread::JoinHandle<io::Result<Served>>)> {
    let listener_key = reactor.add(&listener, Want::Read)?;
    let server = Arc::new(Server {
        reactor,
        listener,
        listener_key,
        conns: RwLock::new(HashMap::new()),
        stop: stop.clone(),
        requests: AtomicU64::new(0),
        connections: AtomicU64::new(0),
    });
    let workers: Vec<_> = (0..threads.max(1))
        .map(|_| {
            let s = server.clone();
            std::thread::spawn(move || s.run())
        })
        .collect();
    let waker = server.clone();
    let stopper = Stopper {
        stop,
        wake: Box::new(move || waker.reactor.wake()),
    };
    let joiner = std::thread::spawn(move || {
        for w in workers {
            w.join()
                .map_err(|_| io::Error::other("a server thread panicked"))??;
        }
        // Deregister what is left before the sockets close.
        let keys: Vec<usize> = server.conns.read().unwrap().keys().copied().collect();
        for k in keys {
            server.close(k);
        }
        let _ = server.reactor.remove(server.listener_key, &server.listener);
        Ok(Served {
            requests: server.requests.load(Ordering::Relaxed),
            connections: server.connections.load(Ordering::Relaxed),
        })
    });
    Ok((stopper, joiner))
}

fn usage(msg: &str) -> ! {
    eprintln!("http_keepalive: {msg}");
    eprintln!(
        "usage: http_keepalive [--threads T] [--port PORT] [--peer pollshot|polling] [--backend epoll|kqueue|uring] [--seconds S]"
    );
    std::process::exit(2)
}

fn parse<T: std::str::FromStr>(flag: &str, value: &str) -> T {
    value
        .parse()
        .unwrap_or_else(|_| usage(&format!("{flag} {value:?}: not a valid number")))
}

fn main() -> io::Result<()> {
    let (mut threads, mut port, mut peer, mut seconds) =
        (2usize, 0u16, Peer::Pollshot, None::<u64>);
    let mut backend = None::<String>;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args
            .next()
            .unwrap_or_else(|| usage(&format!("{flag} needs a value")));
        match flag.as_str() {
            "--threads" => threads = parse::<usize>(&flag, &value).max(1),
            "--port" => port = parse(&flag, &value),
            "--seconds" => seconds = Some(parse(&flag, &value)),
            "--peer" => {
                peer = match value.as_str() {
                    "pollshot" => Peer::Pollshot,
                    "polling" => Peer::Polling,
                    _ => usage(&format!("--peer {value:?}: expected pollshot or polling")),
                }
            }
            "--backend" => backend = Some(value),
            _ => usage(&format!("unknown flag {flag:?}")),
        }
    }
    if let Some(name) = backend {
        if peer == Peer::Polling {
            usage("--backend is pollshot's: not with --peer polling");
        }
        peer = Peer::pollshot(&name).unwrap_or_else(|why| usage(&format!("--backend: {why}")));
    }
    let listener = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], port)))?;
    println!(
        "listening on http://{}/ ({}, {threads} threads)",
        listener.local_addr()?,
        peer.name()
    );
    let (stopper, joiner) = serve(listener, threads, peer)?;
    match seconds {
        Some(s) => {
            std::thread::sleep(Duration::from_secs(s));
            stopper.stop()?;
        }
        None => {
            // Run until killed; the threads end only on an error.
            let r = joiner
                .join()
                .map_err(|_| io::Error::other("server panicked"))?;
            return r.map(drop);
        }
    }
    let served = joiner
        .join()
        .map_err(|_| io::Error::other("server panicked"))??;
    println!(
        "served {} requests on {} connections",
        served.requests, served.connections
    );
    Ok(())
}
