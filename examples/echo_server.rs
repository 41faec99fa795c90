//! echo_server: a multi-threaded TCP echo server on one shared [`Poller`], the
//! server that the guide (`pollshot::guide`, "Writing a runtime on pollshot")
//! walks through.
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
//! - per-connection deadlines from a timer heap of its own, owned by one waiting
//!   worker at a time, and a `notify` that cuts a blocked `deliver` short when a
//!   sooner deadline is pushed ([`Timers`]);
//! - write backpressure by arming `WRITABLE` only ([`Shared::drive`]);
//! - the close rules: out of the runtime's table, deregister, then close
//!   ([`Shared::close`]);
//! - shutdown of every worker with a stop flag and notifies ([`Server::shutdown`]).
//!
//! `tests/echo_server.rs` runs it under a few hundred connections and checks
//! every byte.

use pollshot::{Events, Interest, Poller, Token};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io::{self, ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
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
    /// A new connection must send its first byte within this. Shorter than `idle`,
    /// so a new connection's deadline can be sooner than the one a worker is
    /// waiting for: that worker's `deliver` must be cut short.
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
    /// Connections closed by their deadline (idle, or no first byte).
    pub closed_deadline: AtomicU64,
    /// Connections closed by the shutdown.
    pub closed_shutdown: AtomicU64,
    /// Times a connection's buffer filled, so that it stopped reading and armed
    /// `WRITABLE` only.
    pub paused: AtomicU64,
    /// Events after which the connection's handler neither read nor wrote a byte,
    /// nor closed it: spurious wake-ups. A spinning registration would count here.
    pub wasted: AtomicU64,
    /// Notifies sent because a pushed deadline was sooner than the timeout the
    /// timers' owner waits with.
    pub timer_notifies: AtomicU64,
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
}

impl Server {
    /// Binds `addr`, registers the listener and starts `config.threads` workers.
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
        let listener_token = poller.register(&listener)?;
        let shared = Arc::new(Shared {
            poller,
            listener,
            listener_token,
            conns: Mutex::new(Vec::new()),
            timers: Mutex::new(Timers::default()),
            stop: AtomicBool::new(false),
            config,
            counters: Counters::default(),
        });
        // Registered before the first arm, as the table entry of a connection is
        // made before its first arm: another worker may take the event before
        // `arm` returns.
        shared.poller.arm(listener_token, Interest::READABLE)?;
        let workers = (0..config.threads)
            .map(|i| {
                let shared = Arc::clone(&shared);
                thread::Builder::new()
                    .name(format!("echo-worker-{i}"))
                    .spawn(move || shared.worker())
            })
            .collect::<io::Result<Vec<_>>>()?;
        Ok(Server { shared, workers })
    }

    /// The address the listener is bound to.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.shared.listener.local_addr()
    }

    /// What the server did so far.
    pub fn counters(&self) -> &Counters {
        &self.shared.counters
    }

    /// Stops every worker, then closes every connection left (deregistered first)
    /// and the listener. Returns the first error a worker stopped on.
    ///
    /// The stop flag is set, then one `notify` per worker. Notifies are counted,
    /// but they coalesce beyond the number of workers blocked in `deliver`: two
    /// notifies sent while both workers are busy end only one later `deliver`. So
    /// each worker that sees the flag and exits notifies once more: the one whose
    /// notify was merged is woken by the worker that exited before it.
    pub fn shutdown(self) -> io::Result<()> {
        let shared = &self.shared;
        shared.stop.store(true, Ordering::SeqCst);
        for _ in 0..self.workers.len() {
            shared.poller.notify()?;
        }
        let mut first_error = Ok(());
        for worker in self.workers {
            let result = worker.join().expect("a worker panicked");
            if first_error.is_ok() {
                first_error = result;
            }
        }
        // No worker runs any more: what is left in the table is ours.
        let left: Vec<_> = lock(&shared.conns).iter().flatten().cloned().collect();
        for (_, conn) in left {
            let mut conn = lock(&conn);
            if conn.stream.is_some() {
                shared.close(&mut conn, &shared.counters.closed_shutdown)?;
            }
        }
        shared.poller.deregister(shared.listener_token)?;
        first_error
    }
}

/// What the workers share.
struct Shared {
    poller: Poller,
    listener: TcpListener,
    listener_token: Token,
    /// The runtime's own table: a connection's token and state at its token's
    /// index (the descriptor number). An entry is current for an event only if its
    /// token equals the event's: the number may have been closed and reused since.
    /// (Lock order: a connection, then this table; never the other way round.)
    conns: Mutex<Table>,
    timers: Mutex<Timers>,
    stop: AtomicBool,
    config: Config,
    counters: Counters,
}

/// The runtime's table of connections, by descriptor number.
type Table = Vec<Option<(Token, Arc<Mutex<Conn>>)>>;

/// One connection.
struct Conn {
    token: Token,
    /// `None` once closed: another worker that looked the connection up before the
    /// close finds it so when it gets the lock.
    stream: Option<TcpStream>,
    /// Read, not yet echoed.
    pending: Vec<u8>,
    /// The peer half-closed: nothing more to read; close once `pending` is sent.
    read_closed: bool,
    /// Whether the connection is stopped by backpressure (for counting pauses).
    paused: bool,
    /// Whether any byte came from the peer (the first-byte deadline is over).
    greeted: bool,
    /// When the connection is closed if nothing happens. The timer heap may hold
    /// an earlier entry for it: an entry that finds the deadline moved on is
    /// pushed again for the new time (activity costs no heap operation).
    deadline: Instant,
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
    /// A worker: deliver, handle, repeat, until the stop flag.
    fn worker(&self) -> io::Result<()> {
        let mut events = Events::with_capacity(256);
        let result = self.worker_loop(&mut events);
        if let Err(e) = &result {
            eprintln!("echo_server: a worker stops: {e}");
        }
        // Pass the stop on (see `Server::shutdown`), also when this worker stops
        // on an error.
        self.poller.notify()?;
        result
    }

    fn worker_loop(&self, events: &mut Events) -> io::Result<()> {
        while !self.stop.load(Ordering::SeqCst) {
            // Deadlines first: what is due now, and how long this worker may
            // block (only the worker that owns the timers blocks with a timeout).
            let now = Instant::now();
            let (due, timeout, ownership) = lock(&self.timers).before_wait(now);
            for token in due {
                self.on_deadline(token, now)?;
            }
            let delivered = self.poller.deliver(events, timeout);
            lock(&self.timers).after_wait(ownership);
            match delivered {
                Ok(_) => {}
                // A signal: go round (the deadlines are looked at again).
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
            // `Ok(0)`: the timeout passed (the loop's top runs what is due) or a
            // notify came (a sooner deadline, or the stop).
            for event in events.iter() {
                if event.token() == self.listener_token {
                    self.on_listener()?;
                } else {
                    self.on_conn(event.token())?;
                }
            }
        }
        Ok(())
    }

    /// The listener is readable: accept what is queued (a bounded batch, so one
    /// busy listener does not starve the connections), then arm it again.
    fn on_listener(&self) -> io::Result<()> {
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
        self.poller.arm(self.listener_token, Interest::READABLE)
    }

    fn add_conn(&self, stream: TcpStream) -> io::Result<()> {
        stream.set_nonblocking(true)?;
        let token = self.poller.register(&stream)?; // no system call yet
        bump(&self.counters.accepted);
        let deadline = Instant::now() + self.config.first_byte;
        let conn = Arc::new(Mutex::new(Conn {
            token,
            stream: Some(stream),
            pending: Vec::new(),
            read_closed: false,
            paused: false,
            greeted: false,
            deadline,
        }));
        {
            let mut conns = lock(&self.conns);
            if conns.len() <= token.index() {
                conns.resize(token.index() + 1, None);
            }
            conns[token.index()] = Some((token, Arc::clone(&conn)));
        }
        self.push_deadline(deadline, token)?;
        // In the table before the first arm: the event may reach another worker
        // before `arm` returns. Arm under the connection's lock, as every arm here
        // is, so that the worker that gets the event waits for this one to finish.
        let mut conn = lock(&conn);
        if let Err(e) = self.poller.arm(token, Interest::READABLE) {
            self.close(&mut conn, &self.counters.closed_error)?;
            return Err(e);
        }
        Ok(())
    }

    /// The current connection under `token`, if any.
    fn lookup(&self, token: Token) -> Option<Arc<Mutex<Conn>>> {
        let conns = lock(&self.conns);
        let (current, conn) = conns.get(token.index())?.as_ref()?;
        // Compare the whole token: the index alone may name a later connection
        // that reused the descriptor number.
        (*current == token).then(|| Arc::clone(conn))
    }

    /// An event for a connection. The delivery disarmed the registration, so no
    /// other worker gets an event for it until it is armed again: this worker owns
    /// its I/O. The lock is for the deadline, which another worker may run.
    fn on_conn(&self, token: Token) -> io::Result<()> {
        let Some(conn) = self.lookup(token) else {
            // Closed (by a deadline in another worker) after this event was
            // fetched: nothing to do. pollshot never delivers an event for a
            // registration deregistered before the wait took it; this one was
            // taken first.
            return Ok(());
        };
        let mut conn = lock(&conn);
        if conn.stream.is_none() {
            return Ok(()); // closed while this worker waited for the lock
        }
        let (next, progressed) = match self.drive(&mut conn) {
            Ok(done) => done,
            Err(_) => (Next::Close(CloseReason::Error), true),
        };
        if !progressed {
            bump(&self.counters.wasted);
        }
        match next {
            Next::Arm(interest) => match self.poller.arm(token, interest) {
                Ok(()) => Ok(()),
                // The kernel refused the arm for this descriptor (EBADF would be
                // a bug here: only `close` closes). Close it, keep serving.
                Err(e) if e.raw_os_error().is_some() => {
                    self.close(&mut conn, &self.counters.closed_error)
                }
                Err(e) => Err(e),
            },
            Next::Close(CloseReason::Eof) => self.close(&mut conn, &self.counters.closed_eof),
            Next::Close(CloseReason::Error) => self.close(&mut conn, &self.counters.closed_error),
        }
    }

    /// Moves bytes, and says what to wait for next and whether anything moved.
    ///
    /// Try the I/O first; wait only for what would block. The registration is
    /// level-triggered, so the handler does not have to drain: what it leaves
    /// (after a bounded number of rounds, for fairness) is reported again at the
    /// next arm.
    fn drive(&self, conn: &mut Conn) -> io::Result<(Next, bool)> {
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
    fn wanted(&self, conn: &mut Conn) -> Interest {
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

    /// Traffic: the idle deadline moves on. Only the connection's field changes;
    /// the heap's entry finds the new time when it comes due.
    fn touch(&self, conn: &mut Conn) {
        if conn.greeted {
            conn.deadline = Instant::now() + self.config.idle;
        }
    }

    /// A deadline entry came due for `token`.
    fn on_deadline(&self, token: Token, now: Instant) -> io::Result<()> {
        let Some(conn) = self.lookup(token) else {
            return Ok(()); // closed already
        };
        let mut conn = lock(&conn);
        if conn.stream.is_none() {
            return Ok(());
        }
        if conn.deadline > now {
            // There was traffic since the entry was pushed: wait for the new time.
            return self.push_deadline(conn.deadline, token);
        }
        // The connection may be armed (nobody handles it) or in a worker's hands
        // between its delivery and its arm: that worker holds the lock we hold
        // now, so it has armed and let go. Either way closing is ours.
        self.close(&mut conn, &self.counters.closed_deadline)
    }

    fn push_deadline(&self, at: Instant, token: Token) -> io::Result<()> {
        let cut_short = lock(&self.timers).push(at, token);
        if cut_short {
            // The owner would wake too late: cut one `deliver` short (a blocked
            // one, or the next one to block). It comes back with `Ok(0)`, and at
            // the loop's top its worker takes the timers with the sooner timeout.
            bump(&self.counters.timer_notifies);
            self.poller.notify()?;
        }
        Ok(())
    }

    /// The close rules: out of the runtime's table (a worker holding an event for
    /// it finds nothing), deregistered (no event for it is delivered after this
    /// returns), then closed (the number may be reused at once, by a new
    /// registration that has a new token).
    fn close(&self, conn: &mut Conn, why: &AtomicU64) -> io::Result<()> {
        {
            let mut conns = lock(&self.conns);
            if let Some(entry) = conns.get_mut(conn.token.index()) {
                // Ours: the number cannot be reused while our stream is open.
                *entry = None;
            }
        }
        // Counted before the close, so that a peer that sees the close sees the
        // count too.
        bump(why);
        let result = self.poller.deregister(conn.token);
        drop(conn.stream.take()); // the close, after the deregister
        conn.pending = Vec::new();
        result
    }
}

/// Deadlines: a min-heap of `(when, token)`, and which waiting worker owns it.
///
/// Several workers deliver on one poller, and any of them may be blocked when a
/// deadline comes due. One worker at a time *owns* the timers: it blocks with a
/// timeout until the earliest deadline; the others block with no timeout, woken by
/// events and notifies only. The owner gives ownership up when its `deliver`
/// returns, for whatever reason, and the next worker to wait takes it. A deadline
/// pushed sooner than the owner's wake-up revokes the ownership and asks for one
/// `notify`: the worker whose `deliver` it ends (a blocked one, or the next to
/// block: notifies are counted) takes the timers with the sooner timeout. With no
/// owner, no notify: deadlines are pushed by workers only, and the pushing worker
/// takes the timers itself at its next wait. (A runtime whose other threads add
/// timers notifies then too.)
#[derive(Default)]
pub struct Timers {
    heap: BinaryHeap<Reverse<(Instant, u64)>>,
    /// The owner's ownership number, and when it wakes.
    owner: Option<(u64, Instant)>,
    /// Ownership numbers handed out.
    handed_out: u64,
}

impl Timers {
    /// Before a `deliver`: takes what is due at `now`, and returns it with the
    /// timeout to wait with and, if this worker took the timers, its ownership.
    pub fn before_wait(&mut self, now: Instant) -> (Vec<Token>, Option<Duration>, Option<u64>) {
        let mut due = Vec::new();
        while let Some(&Reverse((at, token))) = self.heap.peek() {
            if at > now {
                break;
            }
            self.heap.pop();
            due.push(Token::from_u64(token));
        }
        if !due.is_empty() {
            // Handling them takes time: wait no longer than zero, so that this
            // worker looks again before blocking.
            return (due, Some(Duration::ZERO), None);
        }
        match (self.owner, self.heap.peek()) {
            (None, Some(&Reverse((at, _)))) => {
                self.handed_out += 1;
                self.owner = Some((self.handed_out, at));
                (due, Some(at - now), Some(self.handed_out))
            }
            _ => (due, None, None),
        }
    }

    /// After a `deliver`: gives the timers up if this worker still owns them.
    pub fn after_wait(&mut self, ownership: Option<u64>) {
        if let (Some(mine), Some((owner, _))) = (ownership, self.owner) {
            if mine == owner {
                self.owner = None;
            }
        }
    }

    /// Adds a deadline (from a worker); returns whether the caller must `notify`:
    /// the owner is blocked until later than `at`.
    pub fn push(&mut self, at: Instant, token: Token) -> bool {
        self.heap.push(Reverse((at, token.to_u64())));
        match self.owner {
            Some((_, wakes)) if wakes > at => {
                // Revoked: the old owner wakes late, and finds it so.
                self.owner = None;
                true
            }
            _ => false,
        }
    }
}

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
