//! Which errors each system call is failed with: the errors its man page lists
//! that a kernel can answer to the call pollshot makes (valid arguments, on its
//! own open descriptors): running out of something, being interrupted, being
//! busy. docs/testing.md ("Kernel refusals") gives the table and, for each error
//! left out, why.
//!
//! Left out, for every call: EFAULT and EINVAL (the call's own arguments, fixed in
//! the code), EBADF on the poller's own descriptors (open for its whole life).
//! Left out of epoll_ctl(2): EBADF, EEXIST, ENOENT and EPERM on the registered
//! descriptor. They are not refusals but answers about the descriptor (closed,
//! registered through a dup, number reused, not pollable), each a row of the
//! state table that tests/common provokes for real; injected, they would tell the
//! poller something false about a descriptor that is open and registered. Left out
//! of close(2): every error. Linux frees the descriptor whatever close answers
//! (an injected error skips the close, which Linux never does). fcntl(2) with
//! F_GETFD, F_SETFD, F_GETFL and F_SETFL on an open descriptor has no error to
//! give; futex(2) FUTEX_WAKE neither.

/// One system call of a window, from strace's log.
#[derive(Clone, Debug)]
pub struct Call {
    pub name: String,
    pub args: String,
    /// Its position among the window's calls of the same name, from 1 (strace's
    /// `when=N`).
    pub n: u32,
}

impl Call {
    /// The row of the matrix it belongs to: the system call, and its operation
    /// where the operation decides the errors (`epoll_ctl ADD`, `futex WAIT`).
    pub fn row(&self) -> String {
        let op = |ops: &[(&str, &'static str)]| -> Option<&'static str> {
            ops.iter()
                .find(|(flag, _)| self.args.contains(flag))
                .map(|(_, name)| *name)
        };
        let detail = match self.name.as_str() {
            "epoll_ctl" => op(&[
                ("EPOLL_CTL_ADD", "ADD"),
                ("EPOLL_CTL_MOD", "MOD"),
                ("EPOLL_CTL_DEL", "DEL"),
            ]),
            "futex" => op(&[
                ("FUTEX_WAIT_BITSET", "WAIT_BITSET"),
                ("FUTEX_WAIT", "WAIT"),
                ("FUTEX_WAKE", "WAKE"),
            ]),
            "mmap" => Some(if self.args.contains("MAP_SHARED") {
                "MAP_SHARED"
            } else {
                "MAP_PRIVATE"
            }),
            "fcntl" => op(&[
                ("F_GETFD", "F_GETFD"),
                ("F_SETFD", "F_SETFD"),
                ("F_GETFL", "F_GETFL"),
                ("F_SETFL", "F_SETFL"),
            ]),
            _ => None,
        };
        match detail {
            Some(d) => format!("{} {d}", self.name),
            None => self.name.clone(),
        }
    }

    /// The errors this call is failed with on `backend`, one run each.
    pub fn refusals(&self, backend: &str) -> &'static [&'static str] {
        match self.row().as_str() {
            // epoll_create1(2), eventfd(2), pipe(2), io_uring_setup(2): creating.
            "epoll_create1" => &["EMFILE", "ENFILE", "ENOMEM"],
            "eventfd2" => &["EMFILE", "ENFILE", "ENODEV", "ENOMEM"],
            "pipe2" | "pipe" => &["EMFILE", "ENFILE"],
            "io_uring_setup" => &["EMFILE", "ENFILE", "ENOMEM", "EPERM"],
            // The ring's three mappings (std's own mappings are private).
            "mmap MAP_SHARED" => &["ENOMEM"],
            // MADV_DONTFORK on them (a split of a mapping can fail).
            "madvise" => &["EAGAIN", "ENOMEM"],
            // epoll_ctl(2): ENOSPC is max_user_watches, reached by an ADD only.
            "epoll_ctl ADD" => &["ENOMEM", "ENOSPC"],
            "epoll_ctl MOD" | "epoll_ctl DEL" => &["ENOMEM"],
            "epoll_wait" | "epoll_pwait" | "epoll_pwait2" => &["EINTR"],
            "poll" | "ppoll" => &["EINTR", "ENOMEM"],
            // The waker (eventfd(2): EAGAIN is a full counter; a pipe's, a full
            // pipe) and its drain.
            "write" | "read" => &["EAGAIN", "EINTR"],
            // io_uring_enter(2): EAGAIN (out of resources for the request), EBUSY
            // (completions in the overflow list), EINTR.
            "io_uring_enter" => &["EAGAIN", "EBUSY", "EINTR"],
            // futex(2) FUTEX_WAIT, pollshot's own on io_uring (rustix: the
            // follower's hand-over, a deregister's wait, the ring's lock): the
            // word moved on, a signal. Not elsewhere: std's locks wait with
            // FUTEX_WAIT_BITSET, and glibc's (libkqueue's) are not pollshot's.
            // The N-th futex call of a window may be another operation in
            // another run (a lock contended or not): the driver checks which
            // one was failed.
            "futex WAIT" if backend == "uring" => &["EAGAIN", "EINTR"],
            _ => &[],
        }
    }
}

/// The system calls a window is parsed for, with the marker calls, from strace's
/// log: what lies between the first and the last `getppid` (see `trace.rs`).
pub fn window(log: &str) -> Result<Vec<Call>, String> {
    let lines: Vec<&str> = log.lines().collect();
    let marks: Vec<usize> = (0..lines.len())
        .filter(|&i| lines[i].starts_with("getppid("))
        .collect();
    let (Some(&first), Some(&last)) = (marks.first(), marks.last()) else {
        return Err("no window markers in the strace log".into());
    };
    if first == last {
        return Err("one window marker in the strace log (strace detached early?)".into());
    }
    let mut calls: Vec<Call> = Vec::new();
    for line in &lines[first + 1..last] {
        // `--- SIGxxx ---`, `+++ exited +++`, resumed halves: not calls.
        let Some((name, args)) = line.split_once('(') else {
            continue;
        };
        if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            continue;
        }
        if name == "getppid" {
            continue;
        }
        let n = calls.iter().filter(|c| c.name == name).count() as u32 + 1;
        calls.push(Call {
            name: name.to_owned(),
            args: args.to_owned(),
            n,
        });
    }
    Ok(calls)
}

/// The window's injected call, if any: strace marks it `(INJECTED)`.
pub fn injected(log: &str) -> Result<Vec<Call>, String> {
    Ok(window(log)?
        .into_iter()
        .filter(|c| c.args.ends_with("(INJECTED)"))
        .collect())
}

/// Why a run is left out on libkqueue, if it is. On libkqueue the system calls
/// are libkqueue's own (kevent(2) is a library call there), and these refusals
/// break libkqueue itself, whatever its caller does; a BSD kernel has none of
/// them. docs/testing.md ("Kernel refusals") tells how each was shown.
pub fn libkqueue_defect(scenario: &str, call: &Call, error: &str) -> Option<&'static str> {
    let scenario = scenario.split('@').next().unwrap_or(scenario);
    match (call.row().as_str(), error) {
        ("epoll_ctl DEL", "ENOMEM") => Some(
            "libkqueue frees the knote although its epoll entry stays: the next event \
             reads freed memory (SIGSEGV in linux_kevent_copyout)",
        ),
        ("write", "EAGAIN") => Some(
            "libkqueue takes EAGAIN from its eventfd write as raised (eventfd_raise in \
             src/linux/user.c): nothing is woken",
        ),
        ("eventfd2", _) if scenario == "new" || scenario == "fork" => Some(
            "kqueue() whose own eventfd is refused closes -1 on its way out and \
             answers EBADF, and so does its retry",
        ),
        _ => None,
    }
}
