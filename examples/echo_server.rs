//! echo_server: a multi-threaded TCP echo server on one shared [`Poller`], the
//! server that the guide (`pollshot::guide`, "Writing a runtime on pollshot")
//! walks through. The same code runs on Linux, the BSDs, macOS, illumos and
//! Windows: no `cfg`.
//!
//! ```text
//! cargo run --release --example echo_server [-- --threads T --port PORT --idle-ms MS --first-byte-ms MS --seconds S]
//! ```
//!
//! - `--threads T`: worker threads, all delivering on the one poller (default 2)
//! - `--port PORT`: default 0 (any free port; the one chosen is printed)
//! - `--idle-ms MS`: a connection with no traffic for this long is closed
//!   (default 30,000)
//! - `--first-byte-ms MS`: a new connection must send its first byte within this
//!   (default 5,000)
//! - `--seconds S`: shut down after S seconds and print the counters (default:
//!   run until killed)
//!
//! What it shows, each where the code does it:
//!
//! - one poller shared by every worker; each event reaches exactly one worker,
//!   and a delivery disarms its registration, so the worker that got it owns the
//!   connection until it arms it again ([`Shared::on_conn`]);
//! - a key per registration: a pointer to the connection's state
//!   (`Arc::into_raw`), so an event leads to its connection with no lookup
//!   ([`Shared::add_conn`], [`Conn::from_key`]);
//! - write backpressure by arming `WRITABLE` only ([`Shared::drive`]);
//! - deadlines (idle, first byte) kept by a sweeper thread, which closes a
//!   connection that another thread may be handling without a use-after-free:
//!   the key's reference outlives every event taken before the deregister
//!   ([`Shared::sweep`], [`Graveyard`]);
//! - the close rules: deregister, then close ([`Shared::close`]);
//! - kernel refusals (ENOMEM and the like) survived: a refused wait is made
//!   again, a refused arm of the listener and a refused deregister are retried
//!   by the sweeper, and a worker that stops (an error, a panic) holds no key
//!   back ([`Passes`]);
//! - stopping every worker with one `Poller::shutdown` ([`Server::shutdown`]).
//!
//! `tests/echo_server.rs` runs it under a few hundred connections and checks
//! every byte, on the default backend (epoll on Linux; poll(2) when forced) and
//! on Windows.

use pollshot::{Events, Interest, Poller, Token};
use std::collections::HashMap;
use std::io::{self, ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// How the server behaves.
#[derive(Clone, Copy, Debug)]
pub struct Config {
    /// Worker threads delivering on the one poller.
    pub threads: usize,
    /// A connection with no traffic (no byte read or written) for this long is
    /// closed.
    pub idle: Duration,
    /// A new connection must send its first byte within this.
    pub first_byte: Duration,
    /// Bytes read and not yet echoed, per connection, past which the server stops
    /// reading from it (backpressure) until its peer takes some.
    pub max_buffered: usize,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            threads: 2,
            idle: Duration::from_secs(30),
            first_byte: Duration::from_secs(5),
            max_buffered: 64 * 1024,
        }
    }
}

impl Config {
    /// How often the sweeper looks for connections past their deadline: a
    /// quarter of the shorter deadline, between 1 ms and 1 s. A deadline is kept
    /// to within this.
    pub fn sweep_period(&self) -> Duration {
        let shorter = self.idle.min(self.first_byte);
        (shorter / 4).clamp(Duration::from_millis(1), Duration::from_secs(1))
    }
}

/// What the server did, counted as it happened.
#[derive(Debug, Default)]
pub struct Counters {
    /// Connections accepted.
    pub accepted: AtomicU64,
    /// Connections closed after the peer's half-close, once everything read was
    /// echoed (the server then half-closes too).
    pub closed_eof: AtomicU64,
    /// Connections closed on an error: a reset (ECONNRESET), a write to a peer
    /// that is gone (EPIPE).
    pub closed_error: AtomicU64,
    /// Connections closed by the sweeper: idle, or no first byte in time.
    pub closed_deadline: AtomicU64,
    /// Connections closed by the shutdown.
    pub closed_shutdown: AtomicU64,
    /// Connection states freed (their last reference dropped): equal to
    /// `accepted` once the server is shut down.
    pub freed: AtomicU64,
    /// Times a connection's buffer filled, so that it stopped reading and armed
    /// `WRITABLE` only.
    pub paused: AtomicU64,
    /// Events after which the connection's handler neither read nor wrote a byte,
    /// nor closed it: spurious wake-ups. A spinning registration would count here.
    pub wasted: AtomicU64,
}

impl Counters {
    /// A counter's value.
    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }

    /// Connections accepted and not closed yet.
    pub fn open(&self) -> u64 {
        let closed = Self::get(&self.closed_eof)
            + Self::get(&self.closed_error)
            + Self::get(&self.closed_deadline)
            + Self::get(&self.closed_shutdown);
        Self::get(&self.accepted) - closed
    }
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// A running server; [`Server::shutdown`] stops it.
pub struct Server {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<io::Result<()>>>,
    sweeper: JoinHandle<()>,
    /// Dropped to stop the sweeper.
    stop_sweeper: mpsc::Sender<()>,
}

impl Server {
    /// Binds `addr`, registers the listener and starts `config.threads` workers
    /// and the sweeper.
    ///
    /// A poller belongs to the process that made it: a server that forks (to
    /// daemonize, or to run one process per core) forks first and starts its
    /// `Server` in each child; a poller made before the fork needs
    /// `Poller::reinit_after_fork` in the child.
    pub fn start(addr: SocketAddr, config: Config) -> io::Result<Server> {
        assert!(config.threads > 0, "a server needs a worker");
        let listener = TcpListener::bind(addr)?;
        listener.set_nonblocking(true)?;
        let poller = Poller::new()?;
        let listener_token = poller.register(&listener)?; // key 0: no connection
        let shared = Arc::new(Shared {
            poller,
            listener,
            listener_token,
            conns: Mutex::new(HashMap::new()),
            passes: Passes::new(config.threads),
            graveyard: Mutex::new(Graveyard::default()),
            listener_unarmed: AtomicBool::new(false),
            undeleted: Mutex::new(Vec::new()),
            config,
            counters: Arc::new(Counters::default()),
        });
        shared.poller.arm(listener_token, Interest::READABLE)?;
        let workers = (0..config.threads)
            .map(|i| {
                let shared = Arc::clone(&shared);
                thread::Builder::new()
                    .name(format!("echo-worker-{i}"))
                    .spawn(move || shared.worker(i))
            })
            .collect::<io::Result<Vec<_>>>()?;
        let (stop_sweeper, stopped) = mpsc::channel();
        let sweeper = {
            let shared = Arc::clone(&shared);
            thread::Builder::new()
                .name("echo-sweeper".into())
                .spawn(move || shared.sweeper(stopped))?
        };
        Ok(Server {
            shared,
            workers,
            sweeper,
            stop_sweeper,
        })
    }

    /// The address the listener is bound to.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.shared.listener.local_addr()
    }

    /// What the server did so far (a handle that outlives the server, to read
    /// `freed` after the shutdown).
    pub fn counters(&self) -> &Arc<Counters> {
        &self.shared.counters
    }

    /// Stops every worker and the sweeper, then closes every connection left
    /// (deregistered first) and the listener. Returns the first error a worker
    /// stopped on (a worker that panicked is one), or the kernel's refusal of a
    /// deregister made again here.
    ///
    /// One `Poller::shutdown` ends every `deliver`, blocked in the kernel or
    /// about to block, and every later one: each worker sees
    /// `Events::is_shutdown` and leaves its loop. (A stop flag and a notify per
    /// worker would not do: notifies coalesce beyond the number of workers
    /// blocked, so a worker busy when they were sent could block for good.)
    pub fn shutdown(self) -> io::Result<()> {
        let shared = &self.shared;
        let mut first_error = shared.poller.shutdown();
        for worker in self.workers {
            let result = worker
                .join()
                .unwrap_or_else(|_| Err(io::Error::other("a worker panicked")));
            if first_error.is_ok() {
                first_error = result;
            }
        }
        drop(self.stop_sweeper);
        if self.sweeper.join().is_err() {
            first_error = first_error.and(Err(io::Error::other("the sweeper panicked")));
        }
        // No worker and no sweeper runs: what is left is ours, and no event is in
        // anyone's hands, so every key's reference is released at once.
        let left: Vec<_> = lock(&shared.conns).values().cloned().collect();
        for conn in left {
            let mut state = lock(&conn.state);
            if state.stream.is_some() {
                let why = &shared.counters.closed_shutdown;
                shared.close(&conn, &mut state, why, Release::Now);
            }
        }
        // Deregistrations the kernel refused, made once more; the keys are
        // released all the same (the poller goes with the server).
        for conn in std::mem::take(&mut *lock(&shared.undeleted)) {
            match shared.poller.deregister(conn.token()) {
                Err(e) if e.kind() != ErrorKind::NotFound => {
                    first_error = first_error.and(Err(e));
                }
                _ => {}
            }
            lock(&shared.graveyard).retire(Conn::key(&conn), Vec::new());
        }
        for key in lock(&shared.graveyard).drain() {
            // SAFETY: the key's reference was kept for a worker that may have held
            // its event; no worker runs any more.
            unsafe { Conn::release_key(key) };
        }
        first_error.and(shared.poller.deregister(shared.listener_token))
    }
}

/// What the workers and the sweeper share.
struct Shared {
    poller: Poller,
    listener: TcpListener,
    listener_token: Token,
    /// Every open connection, for the sweeper and the shutdown. An event finds
    /// its connection by its key, never here. (Lock order: a connection, then
    /// this map.)
    conns: Mutex<HashMap<Token, Arc<Conn>>>,
    /// Per worker: how many times it has entered `deliver` (see [`Graveyard`]).
    passes: Passes,
    graveyard: Mutex<Graveyard>,
    /// The kernel refused the listener's arm: the sweeper arms it.
    listener_unarmed: AtomicBool,
    /// Closed connections whose deregister the kernel refused: the sweeper
    /// deregisters them again (their keys wait until then).
    undeleted: Mutex<Vec<Arc<Conn>>>,
    config: Config,
    counters: Arc<Counters>,
}

/// One connection's state. The registration's key is a pointer to it, holding
/// one reference of its own (`Arc::into_raw`); a worker handling an event takes
/// a reference of its own from the key ([`Conn::from_key`]).
struct Conn {
    /// Set once, before the first arm: the key exists before the token.
    token: OnceLock<Token>,
    state: Mutex<ConnState>,
    /// For `Counters::freed`.
    counters: Arc<Counters>,
}

struct ConnState {
    /// `None` once closed: a worker that took an event before the close finds it
    /// so when it gets the lock.
    stream: Option<TcpStream>,
    /// Read, not yet echoed.
    pending: Vec<u8>,
    /// The peer half-closed: nothing more to read; close once `pending` is sent.
    read_closed: bool,
    /// Whether the connection is stopped by backpressure (for counting pauses).
    paused: bool,
    /// Whether any byte came from the peer (the first-byte deadline is over).
    greeted: bool,
    /// When the sweeper closes the connection if nothing happens before.
    deadline: Instant,
}

impl Conn {
    fn token(&self) -> Token {
        *self.token.get().expect("set before the first arm")
    }

    /// The registration's key: a reference to `conn` that the registration owns
    /// until [`Shared::close`] releases it.
    fn into_key(conn: Arc<Conn>) -> usize {
        Arc::into_raw(conn) as usize
    }

    /// The registration's key of `conn` (the pointer `into_key` made).
    fn key(conn: &Arc<Conn>) -> usize {
        Arc::as_ptr(conn) as usize
    }

    /// A reference of the caller's own, from an event's key.
    ///
    /// # Safety
    /// The key's reference must not have been released: its event was taken
    /// before the key was handed to [`Conn::release_key`] by [`Shared::close`]
    /// with `Release::Now` (only the thread holding the event does that), or
    /// the key waits in the [`Graveyard`].
    unsafe fn from_key(key: usize) -> Arc<Conn> {
        let conn = key as *const Conn;
        // SAFETY: the key's reference keeps the state alive (the caller's
        // promise); a second reference is made from it.
        unsafe {
            Arc::increment_strong_count(conn);
            Arc::from_raw(conn)
        }
    }

    /// Drops the key's reference.
    ///
    /// # Safety
    /// Once per key, when no thread can take an event carrying it any more.
    unsafe fn release_key(key: usize) {
        // SAFETY: the reference `into_key` made, released once (the caller's
        // promise).
        drop(unsafe { Arc::from_raw(key as *const Conn) });
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        bump(&self.counters.freed);
    }
}

/// Who releases a closed connection's key.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Release {
    /// The closing thread holds the registration's only event (a delivery
    /// disarmed it and nothing armed it since), or no worker runs: no other
    /// thread can hold the key.
    Now,
    /// The closing thread is not the one holding an event: a worker may have
    /// taken one just before the deregister, and is about to use the key.
    AfterGrace,
}

/// What a connection waits for next.
enum Next {
    Arm(Interest),
    Close(CloseReason),
}

enum CloseReason {
    Eof,
    Error,
}

impl Shared {
    /// A worker: deliver, handle, repeat, until the poller is shut down.
    fn worker(&self, me: usize) -> io::Result<()> {
        // Dropped when this returns or unwinds: from then on this worker holds
        // back no key (`Passes`).
        let worker = self.passes.enter(me);
        let mut events = Events::with_capacity(256);
        loop {
            // Every event of the last batch is handled: a key released from here
            // on cannot be in this worker's hands (`Graveyard`).
            worker.pass();
            match self.poller.deliver(&mut events, None) {
                Ok(_) => {}
                // A signal: wait again.
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                // The kernel refused the wait (poll(2)'s ENOMEM, io_uring's
                // EAGAIN): make it again, after a pause, so that a refusal that
                // lasts does not spin. A worker that stopped would serve no
                // more, and none would take its place.
                Err(e) if e.raw_os_error().is_some() => {
                    eprintln!("echo_server: a wait refused, made again: {e}");
                    thread::sleep(REFUSED_PAUSE);
                    continue;
                }
                Err(e) => {
                    eprintln!("echo_server: a worker stops: {e}");
                    return Err(e);
                }
            }
            for event in events.iter() {
                if event.token() == self.listener_token {
                    self.on_listener();
                } else {
                    // SAFETY: the key's reference is released only by the thread
                    // that holds the registration's event (this one, now) or
                    // after this worker's next pass (`Shared::close`).
                    let conn = unsafe { Conn::from_key(event.key()) };
                    self.on_conn(&conn)?;
                }
            }
            // The events taken with the shutdown are handled: leave.
            if events.is_shutdown() {
                return Ok(());
            }
        }
    }

    /// The listener is readable: accept what is queued (a bounded batch, so one
    /// busy listener does not starve the connections), then arm it again.
    fn on_listener(&self) {
        for _ in 0..64 {
            match self.listener.accept() {
                Ok((stream, _)) => {
                    // A connection that cannot be registered or armed (ENOMEM,
                    // ENOSPC: epoll's `max_user_watches`) is closed; the server
                    // goes on.
                    if let Err(e) = self.add_conn(stream) {
                        eprintln!("echo_server: a new connection: {e}");
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                // The connection was reset while queued, or descriptors ran out
                // (EMFILE): the listener stays armed. (A real server would back off
                // on EMFILE: the level registration reports the queue again at once.)
                Err(e) => {
                    eprintln!("echo_server: accept: {e}");
                    break;
                }
            }
        }
        // Readiness that is still there (more queued) is reported again at once:
        // the registration is level-triggered.
        self.arm_listener();
    }

    /// Arms the listener. The kernel may refuse (ENOMEM; epoll's ENOSPC):
    /// then nobody would ever accept again, so the sweeper arms it at its next
    /// round (nobody else holds the listener's registration meanwhile: it is
    /// not armed).
    fn arm_listener(&self) {
        if let Err(e) = self.poller.arm(self.listener_token, Interest::READABLE) {
            eprintln!("echo_server: the listener's arm refused, made again by the sweeper: {e}");
            self.listener_unarmed.store(true, Ordering::SeqCst);
        }
    }

    /// Registers a new connection with its state's pointer as the key, and arms
    /// it. The state is built without its token; the token is stored before the
    /// first arm, so no event reaches a state without one.
    fn add_conn(&self, stream: TcpStream) -> io::Result<()> {
        stream.set_nonblocking(true)?;
        let conn = Arc::new(Conn {
            token: OnceLock::new(),
            state: Mutex::new(ConnState {
                stream: Some(stream),
                pending: Vec::new(),
                read_closed: false,
                paused: false,
                greeted: false,
                deadline: Instant::now() + self.config.first_byte,
            }),
            counters: Arc::clone(&self.counters),
        });
        let mut state = lock(&conn.state);
        let key = Conn::into_key(Arc::clone(&conn));
        let stream = state.stream.as_ref().expect("open");
        let token = match self.poller.register_with(stream, key) {
            Ok(token) => token, // no system call yet
            Err(e) => {
                // SAFETY: never registered: no event carries the key.
                unsafe { Conn::release_key(key) };
                return Err(e);
            }
        };
        conn.token.set(token).expect("a new connection");
        bump(&self.counters.accepted);
        lock(&self.conns).insert(token, Arc::clone(&conn));
        // Armed under the connection's lock, as every arm here is: the worker
        // that gets the event waits for this thread to let go.
        if let Err(e) = self.poller.arm(token, Interest::READABLE) {
            self.close(&conn, &mut state, &self.counters.closed_error, Release::Now);
            return Err(e);
        }
        Ok(())
    }

    /// An event for a connection. The delivery disarmed the registration, so no
    /// other worker gets an event for it until it is armed again: this worker owns
    /// its I/O. The lock is for the sweeper, which may close it meanwhile.
    fn on_conn(&self, conn: &Arc<Conn>) -> io::Result<()> {
        let mut state = lock(&conn.state);
        if state.stream.is_none() {
            // Closed by the sweeper after this event was taken: nothing to do.
            // pollshot never delivers an event for a registration deregistered
            // before the wait took it; this one was taken first.
            return Ok(());
        }
        let (next, progressed) = match self.drive(&mut state) {
            Ok(done) => done,
            Err(_) => (Next::Close(CloseReason::Error), true),
        };
        if !progressed {
            bump(&self.counters.wasted);
        }
        let closed = match next {
            Next::Arm(interest) => match self.poller.arm(conn.token(), interest) {
                Ok(()) => return Ok(()),
                // The kernel refused the arm for this socket (EBADF would be a bug
                // here: only `close` closes). Close it, keep serving.
                Err(e) if e.raw_os_error().is_some() => &self.counters.closed_error,
                Err(e) => return Err(e),
            },
            Next::Close(CloseReason::Eof) => &self.counters.closed_eof,
            Next::Close(CloseReason::Error) => &self.counters.closed_error,
        };
        // Not armed: this thread holds the registration's only event.
        self.close(conn, &mut state, closed, Release::Now);
        Ok(())
    }

    /// Moves bytes, and says what to wait for next and whether anything moved.
    ///
    /// Try the I/O first; wait only for what would block. The registration is
    /// level-triggered, so the handler does not have to drain: what it leaves
    /// (after a bounded number of rounds, for fairness) is reported again at the
    /// next arm.
    fn drive(&self, conn: &mut ConnState) -> io::Result<(Next, bool)> {
        let max = self.config.max_buffered;
        let mut progressed = false;
        let mut buf = [0u8; 16 * 1024];
        for _ in 0..16 {
            // Echo what is pending.
            while !conn.pending.is_empty() {
                let stream = conn.stream.as_mut().expect("open");
                match stream.write(&conn.pending) {
                    Ok(n) => {
                        conn.pending.drain(..n);
                        progressed = true;
                        self.touch(conn);
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
            if conn.read_closed {
                if conn.pending.is_empty() {
                    // Everything echoed: half-close our side too, then close.
                    let stream = conn.stream.as_ref().expect("open");
                    return match stream.shutdown(Shutdown::Write) {
                        Ok(()) => Ok((Next::Close(CloseReason::Eof), true)),
                        Err(_) => Ok((Next::Close(CloseReason::Error), true)),
                    };
                }
                return Ok((Next::Arm(Interest::WRITABLE), progressed));
            }
            if conn.pending.len() >= max {
                return Ok((Next::Arm(self.wanted(conn)), progressed));
            }
            conn.paused = false;
            let room = (max - conn.pending.len()).min(buf.len());
            let stream = conn.stream.as_mut().expect("open");
            match stream.read(&mut buf[..room]) {
                Ok(0) => {
                    conn.read_closed = true;
                    progressed = true;
                }
                Ok(n) => {
                    conn.pending.extend_from_slice(&buf[..n]);
                    progressed = true;
                    conn.greeted = true;
                    self.touch(conn);
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    return Ok((Next::Arm(self.wanted(conn)), progressed));
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        // Still busy after the rounds: let the other connections have a turn.
        // The level registration reports what is left at once.
        Ok((Next::Arm(self.wanted(conn)), progressed))
    }

    /// What an open connection that is still reading waits for: the peer's bytes
    /// while nothing is pending, room to write while the buffer is full, both in
    /// between (no spin: every readable event is read).
    fn wanted(&self, conn: &mut ConnState) -> Interest {
        if conn.pending.is_empty() {
            Interest::READABLE
        } else if conn.pending.len() >= self.config.max_buffered {
            // Backpressure: the peer does not take what it sends. Stop reading and
            // wait for room only. Arming BOTH here would spin: the registration is
            // level-triggered, the unread bytes keep it readable, and every
            // `deliver` would report it again at once.
            if !conn.paused {
                conn.paused = true;
                bump(&self.counters.paused);
            }
            Interest::WRITABLE
        } else {
            Interest::BOTH
        }
    }

    /// Traffic: the idle deadline moves on (once the first byte came).
    fn touch(&self, conn: &mut ConnState) {
        if conn.greeted {
            conn.deadline = Instant::now() + self.config.idle;
        }
    }

    /// The sweeper: every [`Config::sweep_period`], closes what is past its
    /// deadline, until `stop`'s sender is dropped.
    fn sweeper(&self, stop: mpsc::Receiver<()>) {
        let period = self.config.sweep_period();
        while let Err(RecvTimeoutError::Timeout) = stop.recv_timeout(period) {
            if let Err(e) = self.sweep(Instant::now()) {
                eprintln!("echo_server: sweep: {e}");
            }
        }
    }

    /// Closes every connection past its deadline at `now`, makes again what
    /// the kernel refused (the listener's arm, deregisters), then releases the
    /// keys no worker can hold any more.
    fn sweep(&self, now: Instant) -> io::Result<()> {
        if self.listener_unarmed.swap(false, Ordering::SeqCst) {
            self.arm_listener();
        }
        for conn in std::mem::take(&mut *lock(&self.undeleted)) {
            match self.poller.deregister(conn.token()) {
                // NotFound: a new registration of the number (a connection
                // accepted since) superseded it, which deleted it.
                Err(e) if e.kind() != ErrorKind::NotFound => lock(&self.undeleted).push(conn),
                // Deregistered: a worker may hold an event taken before the
                // refused deregister.
                _ => lock(&self.graveyard).retire(Conn::key(&conn), self.passes.now()),
            }
        }
        let conns: Vec<_> = lock(&self.conns).values().cloned().collect();
        for conn in conns {
            let mut state = lock(&conn.state);
            if state.stream.is_some() && state.deadline <= now {
                // The connection is armed, or in a worker's hands between its
                // delivery and its arm (that worker holds the lock we hold now:
                // it has armed and let go), or its event was just taken by a
                // worker waiting for this lock, which will find it closed and
                // still use the key: the key's reference waits for the grace.
                let why = &self.counters.closed_deadline;
                self.close(&conn, &mut state, why, Release::AfterGrace);
            }
        }
        let passes = self.passes.now();
        let mut graveyard = lock(&self.graveyard);
        for key in graveyard.collect(&passes) {
            // SAFETY: every worker has entered `deliver` again since the key's
            // deregister: none holds an event carrying it (`Graveyard`).
            unsafe { Conn::release_key(key) };
        }
        if !graveyard.is_empty() {
            // A worker blocked in `deliver(None)` would keep the rest for as long
            // as no event comes: wake each once to let it pass.
            for _ in 0..self.passes.running() {
                self.poller.notify()?;
            }
        }
        Ok(())
    }

    /// The close rules: out of the server's map (the sweeper and the shutdown
    /// find it no more), deregistered (no event for it is delivered after this
    /// returns), then closed (the number may be reused at once, by a new
    /// registration that has a new token); then the key's reference is released,
    /// at once or after the grace (`release`).
    ///
    /// A deregister the kernel refuses (ENOMEM) leaves the registration in
    /// place, disarmed: nothing is delivered for it and nothing arms it again.
    /// The socket is closed all the same (its peer is told), and the sweeper
    /// deregisters again (a deregister of a closed number finds it gone: not an
    /// error); the key waits until then, and for the grace after.
    fn close(&self, conn: &Arc<Conn>, state: &mut ConnState, why: &AtomicU64, release: Release) {
        let token = conn.token();
        lock(&self.conns).remove(&token);
        // Counted before the close, so that a peer that sees the close sees the
        // count too.
        bump(why);
        let deregistered = self.poller.deregister(token);
        drop(state.stream.take()); // the close, after the deregister
        state.pending = Vec::new();
        if let Err(e) = deregistered {
            eprintln!("echo_server: a deregister refused, made again by the sweeper: {e}");
            lock(&self.undeleted).push(Arc::clone(conn));
            return;
        }
        let key = Conn::key(conn);
        match release {
            // SAFETY: no other thread can hold an event carrying the key (see
            // `Release::Now`); `conn` is a reference of this thread's own, so the
            // state outlives this call.
            Release::Now => unsafe { Conn::release_key(key) },
            Release::AfterGrace => lock(&self.graveyard).retire(key, self.passes.now()),
        }
    }
}

/// Keys whose registration was deregistered by a thread that did not hold its
/// event (the sweeper), kept until no worker can hold one.
///
/// pollshot delivers no event of a registration after its `deregister` has
/// returned, but a worker may have taken one just before, and use the key after
/// the sweeper's deregister. Each worker counts its passes: it adds one before
/// each `deliver`, once it has handled every event of its last batch. A key
/// retired with a snapshot of the counts is released once every worker's count
/// has moved on: each has finished the batch it held at the deregister, and
/// every `deliver` it makes since began after the deregister returned. (The
/// simplest quiescent-state reclamation; a runtime could use an epoch crate.)
#[derive(Debug, Default)]
pub struct Graveyard {
    retired: Vec<(usize, Vec<u64>)>,
}

impl Graveyard {
    /// Keeps `key`, deregistered after the workers' pass counts were `passes`.
    pub fn retire(&mut self, key: usize, passes: Vec<u64>) {
        self.retired.push((key, passes));
    }

    /// Takes out the keys that no worker can hold any more, the pass counts
    /// being `passes` now.
    /// A worker whose count is [`Passes::LEFT`] has left its loop: it holds
    /// nothing.
    pub fn collect(&mut self, passes: &[u64]) -> Vec<usize> {
        let mut free = Vec::new();
        self.retired.retain(|(key, then)| {
            let passed = then
                .iter()
                .zip(passes)
                .all(|(then, now)| *now == Passes::LEFT || now != then);
            if passed {
                free.push(*key);
            }
            !passed
        });
        free
    }

    /// Takes out every key (when no worker runs).
    pub fn drain(&mut self) -> Vec<usize> {
        self.retired.drain(..).map(|(key, _)| key).collect()
    }

    /// Whether no key is kept.
    pub fn is_empty(&self) -> bool {
        self.retired.is_empty()
    }
}

/// Each worker's pass count, for the [`Graveyard`]: how many times it has
/// entered `deliver`, or [`Passes::LEFT`] once it has left its loop.
///
/// A worker that stops (an error, a panic) makes no more passes: counted as it
/// was, it would hold back every key retired after, for the server's whole
/// life. Its [`Worker`] guard marks it as left when it is dropped, whether the
/// worker returns or unwinds.
#[derive(Debug)]
pub struct Passes {
    counts: Vec<AtomicU64>,
}

impl Passes {
    /// The count of a worker that has left its loop: it holds no event now,
    /// and takes none later.
    pub const LEFT: u64 = u64::MAX;

    /// `workers` workers, none started.
    pub fn new(workers: usize) -> Passes {
        Passes {
            counts: (0..workers).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// Worker `me` starts its loop; it has left when the guard is dropped.
    pub fn enter(&self, me: usize) -> Worker<'_> {
        Worker { passes: self, me }
    }

    /// Every worker's count now.
    pub fn now(&self) -> Vec<u64> {
        self.counts
            .iter()
            .map(|c| c.load(Ordering::SeqCst))
            .collect()
    }

    /// How many workers have not left.
    pub fn running(&self) -> usize {
        self.now().iter().filter(|&&c| c != Passes::LEFT).count()
    }
}

/// A worker's place in [`Passes`], for as long as it runs its loop.
#[derive(Debug)]
pub struct Worker<'a> {
    passes: &'a Passes,
    me: usize,
}

impl Worker<'_> {
    /// Every event of the last batch is handled: about to `deliver` again.
    pub fn pass(&self) {
        self.passes.counts[self.me].fetch_add(1, Ordering::SeqCst);
    }
}

impl Drop for Worker<'_> {
    fn drop(&mut self) {
        self.passes.counts[self.me].store(Passes::LEFT, Ordering::SeqCst);
    }
}

/// How long a worker waits before it makes a refused wait again.
const REFUSED_PAUSE: Duration = Duration::from_millis(10);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[allow(dead_code)] // the test includes this file for `Server`
fn main() -> io::Result<()> {
    let mut config = Config::default();
    let mut port = 0u16;
    let mut seconds = None;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = |name: &str| -> io::Result<u64> {
            let v = args.next().unwrap_or_default();
            v.parse().map_err(|_| {
                io::Error::new(
                    ErrorKind::InvalidInput,
                    format!("{name} needs a number, got {v:?}"),
                )
            })
        };
        match flag.as_str() {
            "--threads" => config.threads = value("--threads")?.max(1) as usize,
            "--port" => port = value("--port")? as u16,
            "--idle-ms" => config.idle = Duration::from_millis(value("--idle-ms")?),
            "--first-byte-ms" => {
                config.first_byte = Duration::from_millis(value("--first-byte-ms")?)
            }
            "--seconds" => seconds = Some(value("--seconds")?),
            other => {
                eprintln!("echo_server: unknown flag {other:?}; see the file's header");
                std::process::exit(2);
            }
        }
    }
    let server = Server::start(SocketAddr::from(([127, 0, 0, 1], port)), config)?;
    println!(
        "echo_server: listening on {} with {} workers ({:?})",
        server.local_addr()?,
        config.threads,
        config
    );
    match seconds {
        Some(s) => thread::sleep(Duration::from_secs(s)),
        None => loop {
            thread::park();
        },
    }
    let c = server.counters();
    println!(
        "accepted {}, closed: eof {}, error {}, deadline {}; paused {}, wasted events {}",
        Counters::get(&c.accepted),
        Counters::get(&c.closed_eof),
        Counters::get(&c.closed_error),
        Counters::get(&c.closed_deadline),
        Counters::get(&c.paused),
        Counters::get(&c.wasted),
    );
    server.shutdown()
}
