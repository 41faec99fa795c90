//! A thread traces itself: strace attached to this thread alone for a window.
//!
//! strace counts an injection's `when=N` per system call and per tracee (thread),
//! from the moment it attaches ("Accounting of syscalls that are subject to
//! injection is done per syscall and per tracee", strace(1); checked here with
//! strace 6.1: with `-f`, `when=2` failed the second call of *each* thread, and a
//! forked child counts from 1 again). Attaching to one thread id without `-f`
//! therefore makes `N` the N-th call of that thread since the attach, and no other
//! thread's call is touched.
//!
//! The attach is asynchronous: strace seizes the thread and starts stopping it at
//! system calls a little later. So the thread spins on `getppid(2)`, which strace
//! is told to fail with EXDEV on every call, until one fails: from then on every
//! system call of the thread is seen (and counted). The window ends with one more
//! `getppid`, the marker the driver cuts the log at, before strace is told to
//! detach (SIGINT) and reaped.

use std::fs::File;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// What to trace, from the driver.
#[derive(Clone, Debug)]
pub struct Spec {
    pub strace: PathBuf,
    /// Where strace writes the window's system calls (`-o`).
    pub log: PathBuf,
    /// The system calls to trace and count (`-e trace=`), comma-separated, or
    /// `all`.
    pub syscalls: String,
    /// `(system call, errno name, N)`: fail the N-th call with that error.
    pub inject: Option<(String, String, u32)>,
}

/// strace, attached to the calling thread.
pub struct Attached {
    child: Child,
}

/// How long strace may take to attach: only a broken setup takes this long.
const ATTACH_LIMIT: Duration = Duration::from_secs(30);

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn getppid_raw() -> (libc::c_long, i32) {
    // SAFETY: getppid(2) takes no argument and cannot fail (strace fails it).
    let r = unsafe { libc::syscall(libc::SYS_getppid) };
    (r, if r == -1 { errno() } else { 0 })
}

/// Starts strace on the calling thread and returns once it sees every system call.
pub fn attach(spec: &Spec) -> Result<Attached, String> {
    // SAFETY: gettid(2) takes no argument.
    let tid = unsafe { libc::syscall(libc::SYS_gettid) };
    // Under Yama's ptrace_scope 1 only an ancestor may attach: allow strace, our
    // child. Without Yama this answers EINVAL, which changes nothing.
    // SAFETY: PR_SET_PTRACER takes a pid (or ANY) and no pointer.
    unsafe { libc::prctl(libc::PR_SET_PTRACER, libc::PR_SET_PTRACER_ANY, 0, 0, 0) };
    let err_path = spec.log.with_extension("stderr");
    let err = File::create(&err_path).map_err(|e| format!("{}: {e}", err_path.display()))?;
    // The command (and the log's stderr file it holds) is dropped before the
    // window begins: its close is not the scenario's.
    let mut child = {
        let mut cmd = Command::new(&spec.strace);
        cmd.arg("-qq")
            .arg("-p")
            .arg(tid.to_string())
            .arg("-o")
            .arg(&spec.log)
            .arg("-e")
            .arg(match spec.syscalls.as_str() {
                "all" => "trace=all".to_owned(),
                set => format!("trace=getppid,{set}"),
            })
            .arg("-e")
            .arg("inject=getppid:error=EXDEV");
        if let Some((syscall, error, n)) = &spec.inject {
            cmd.arg("-e")
                .arg(format!("inject={syscall}:error={error}:when={n}"));
        }
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(err));
        cmd.spawn()
            .map_err(|e| format!("spawning {}: {e}", spec.strace.display()))?
    };
    let start = Instant::now();
    loop {
        if getppid_raw() == (-1, libc::EXDEV) {
            return Ok(Attached { child });
        }
        if let Ok(Some(status)) = child.try_wait() {
            let said = std::fs::read_to_string(&err_path).unwrap_or_default();
            return Err(format!("strace exited before attaching ({status}): {said}"));
        }
        if start.elapsed() > ATTACH_LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("strace did not attach within {ATTACH_LIMIT:?}"));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

impl Attached {
    /// Ends the window: the marker call, then strace detaches and exits.
    pub fn detach(mut self) -> Result<(), String> {
        let _ = getppid_raw();
        // SAFETY: a signal to our own child, which has not been reaped yet.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGINT) };
        self.child
            .wait()
            .map(drop)
            .map_err(|e| format!("waiting for strace: {e}"))
    }
}
