//! The driver: counts each scenario's system calls under strace, then runs it once
//! per call position and per error ([`Call::refusals`]), injecting that error at
//! exactly that call, each run a process of its own under a watchdog, several at
//! a time; prints the matrix and every failure with the command that replays it.

use crate::refusals::{self, Call};
use crate::scenarios::{full_name, SCENARIOS};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A run that has not ended after this long is a hang (a run takes well under a
/// second; its own checks give up after 10 s).
const WATCHDOG: Duration = Duration::from_secs(60);

struct Options {
    backends: Vec<String>,
    scenarios: Vec<String>,
    jobs: usize,
    markdown: Option<PathBuf>,
    strace: PathBuf,
    /// Every position of every row, no sampling ([`sample`]).
    full: bool,
}

/// One process to run: a scenario on a backend, counted or with one injection.
#[derive(Clone, Debug)]
struct Job {
    backend: String,
    scenario: String,
    /// `None`: the counting run (every system call traced, none failed).
    inject: Option<(Call, &'static str)>,
}

impl Job {
    fn args(&self, strace: &Path, log: &Path) -> Vec<String> {
        let mut args = vec![
            "run".to_owned(),
            self.backend.clone(),
            self.scenario.clone(),
            "--strace".to_owned(),
            strace.display().to_string(),
            "--log".to_owned(),
            log.display().to_string(),
            "--syscalls".to_owned(),
        ];
        match &self.inject {
            None => args.push("all".to_owned()),
            Some((call, error)) => {
                args.push(call.name.clone());
                args.push("--inject".to_owned());
                args.push(format!("{}:{error}:{}", call.name, call.n));
            }
        }
        args
    }
}

/// How a run ended.
#[derive(Debug)]
struct Outcome {
    job: Job,
    /// Exit status 0 and `RESULT ok`.
    passed: bool,
    /// What went wrong, if it did not pass.
    why: String,
    /// The `MET` lines: the API call that met the refusal and what it got.
    met: Vec<String>,
    /// The calls strace failed (the planned one, if the run reached it).
    injected: Vec<Call>,
    /// The window's calls (counting runs).
    window: Vec<Call>,
    /// The row of the call strace failed where it was not the planned one.
    shifted: Option<String>,
    output: String,
    command: String,
}

fn parse(args: &[String]) -> Result<Options, String> {
    let mut o = Options {
        backends: Vec::new(),
        scenarios: Vec::new(),
        jobs: std::thread::available_parallelism().map_or(2, |n| n.get()),
        markdown: None,
        strace: PathBuf::from("strace"),
        full: false,
    };
    let mut rest = args.iter();
    while let Some(flag) = rest.next() {
        if flag == "--full" {
            o.full = true;
            continue;
        }
        let value = rest
            .next()
            .ok_or_else(|| format!("{flag} needs a value"))?
            .clone();
        match flag.as_str() {
            "--backend" => o.backends.push(value),
            "--scenario" => o.scenarios.push(value),
            "--jobs" => o.jobs = value.parse().map_err(|_| format!("bad --jobs {value}"))?,
            "--markdown" => o.markdown = Some(value.into()),
            "--strace" => o.strace = value.into(),
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    o.jobs = o.jobs.max(1);
    Ok(o)
}

/// The backends compiled here that the kernel accepts; prints SKIPPED for the
/// others.
fn backends() -> Vec<String> {
    let mut out = vec!["epoll".to_owned(), "poll".to_owned()];
    match pollshot::Poller::<pollshot::backends::Uring>::with_backend() {
        Ok(_) => out.push("uring".to_owned()),
        Err(e) => println!("SKIPPED: the io_uring backend: {e}"),
    }
    if cfg!(pollshot_libkqueue) {
        out.push("kqueue".to_owned());
    }
    out
}

pub fn main(args: &[String]) -> i32 {
    let mut o = match parse(args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("faults drive: {e}");
            return 2;
        }
    };
    match Command::new(&o.strace).arg("-V").output() {
        Ok(out) if out.status.success() => {
            let v = String::from_utf8_lossy(&out.stdout);
            println!("{}", v.lines().next().unwrap_or("strace"));
        }
        _ => {
            eprintln!(
                "faults drive: no strace at {:?} (Debian: apt-get install strace)",
                o.strace
            );
            return 1;
        }
    }
    let available = backends();
    if o.backends.is_empty() {
        o.backends = available.clone();
    }
    if let Some(b) = o.backends.iter().find(|b| !available.contains(b)) {
        eprintln!("faults drive: backend {b} is not available here ({available:?})");
        return 2;
    }
    let all: Vec<String> = SCENARIOS
        .iter()
        .flat_map(|s| s.roles.iter().map(|r| full_name(s.name, *r)))
        .collect();
    if o.scenarios.is_empty() {
        o.scenarios = all.clone();
    }
    if let Some(s) = o.scenarios.iter().find(|s| !all.contains(s)) {
        eprintln!("faults drive: no scenario {s} (faults list)");
        return 2;
    }
    let dir = std::env::temp_dir().join(format!("pollshot-faults-{}", std::process::id()));
    if let Err(e) = std::fs::create_dir_all(&dir) {
        eprintln!("faults drive: {}: {e}", dir.display());
        return 1;
    }
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("faults drive: current_exe: {e}");
            return 1;
        }
    };
    let start = Instant::now();

    // The counting runs: each scenario's window, every system call traced.
    let counting: Vec<Job> = o
        .backends
        .iter()
        .flat_map(|b| {
            o.scenarios.iter().map(move |s| Job {
                backend: b.clone(),
                scenario: s.clone(),
                inject: None,
            })
        })
        .collect();
    let counted = run_all(&exe, &o, &dir, counting);
    let mut failures: Vec<&Outcome> = counted.iter().filter(|c| !c.passed).collect();
    let mut plan = Vec::new();
    let mut left_out: BTreeMap<(String, String, &'static str), (usize, &'static str)> =
        BTreeMap::new();
    let mut sampled: Vec<String> = Vec::new();
    for c in counted.iter().filter(|c| c.passed) {
        let mut per_row: BTreeMap<String, u32> = BTreeMap::new();
        for call in &c.window {
            *per_row.entry(call.row()).or_default() += 1;
        }
        let mut seen_in_row: BTreeMap<String, u32> = BTreeMap::new();
        for call in &c.window {
            let row = call.row();
            let k = seen_in_row.entry(row.clone()).or_default();
            *k += 1;
            let total = per_row[&row];
            if !o.full && !sample(*k, total) {
                continue;
            }
            if !o.full && *k == 1 && total > SAMPLED && !call.refusals(&c.job.backend).is_empty() {
                sampled.push(format!(
                    "{} {}: {row}, {SAMPLED} of {total} positions",
                    c.job.backend, c.job.scenario
                ));
            }
            for &error in call.refusals(&c.job.backend) {
                if c.job.backend == "kqueue" {
                    if let Some(why) = refusals::libkqueue_defect(&c.job.scenario, call, error) {
                        left_out
                            .entry((c.job.backend.clone(), call.row(), error))
                            .or_insert((0, why))
                            .0 += 1;
                        continue;
                    }
                }
                plan.push(Job {
                    backend: c.job.backend.clone(),
                    scenario: c.job.scenario.clone(),
                    inject: Some((call.clone(), error)),
                });
            }
        }
    }
    println!(
        "counted {} scenario runs in {:.1} s: {} injections planned",
        counted.len(),
        start.elapsed().as_secs_f64(),
        plan.len()
    );
    for s in &sampled {
        println!("sampled: {s}");
    }
    let runs = run_all(&exe, &o, &dir, plan);
    failures.extend(runs.iter().filter(|r| !r.passed));
    let report = report(&o, &counted, &runs);
    print!("{report}");
    for ((backend, row, error), (n, why)) in &left_out {
        println!("left out on {backend} (libkqueue): {row} {error}, {n} runs: {why}");
    }
    if let Some(path) = &o.markdown {
        if let Err(e) = std::fs::write(path, markdown(&o, &counted, &runs)) {
            eprintln!("faults drive: {}: {e}", path.display());
        }
    }
    for f in &failures {
        println!(
            "\nFAILED {} {} {}: {}\n  replay: {}\n{}",
            f.job.backend,
            f.job.scenario,
            f.job
                .inject
                .as_ref()
                .map_or("(counting run)".to_owned(), |(c, e)| format!(
                    "{} #{} {e}",
                    c.row(),
                    c.n
                )),
            f.why,
            f.command,
            indent(&tail(&f.output, 40))
        );
    }
    println!(
        "\nfaults: {} runs, {} failed, in {:.1} s ({} jobs at a time)",
        counted.len() + runs.len(),
        failures.len(),
        start.elapsed().as_secs_f64(),
        o.jobs
    );
    let _ = std::fs::remove_dir_all(&dir);
    i32::from(!failures.is_empty())
}

/// Positions of one row kept in full up to this many per window; beyond, this
/// many are sampled (a window's many calls of one row are the same command on
/// as many registrations: `arm_many`).
const SAMPLED: u32 = 16;

/// Whether the `k`-th of `total` calls of one row of a window is run: all of
/// them up to [`SAMPLED`]; beyond, the first four, the last four, and eight
/// spread evenly in between.
fn sample(k: u32, total: u32) -> bool {
    if total <= SAMPLED || k <= 4 || k > total - 4 {
        return true;
    }
    let inner = total - 8;
    let step = inner.div_ceil(SAMPLED - 8);
    (k - 4) % step == 0
}

fn tail(s: &str, lines: usize) -> String {
    let all: Vec<&str> = s.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

fn indent(s: &str) -> String {
    s.lines().map(|l| format!("    {l}\n")).collect()
}

/// Runs every job, `o.jobs` at a time.
fn run_all(exe: &Path, o: &Options, dir: &Path, jobs: Vec<Job>) -> Vec<Outcome> {
    let next = AtomicUsize::new(0);
    let out = Mutex::new(Vec::with_capacity(jobs.len()));
    std::thread::scope(|s| {
        for _ in 0..o.jobs {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(job) = jobs.get(i) else { return };
                let outcome = run_one(exe, &o.strace, dir, i, job.clone());
                out.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push((i, outcome));
            });
        }
    });
    let mut out = out.into_inner().unwrap_or_else(|p| p.into_inner());
    out.sort_by_key(|(i, _)| *i);
    out.into_iter().map(|(_, o)| o).collect()
}

fn run_one(exe: &Path, strace: &Path, dir: &Path, i: usize, job: Job) -> Outcome {
    let stem = format!(
        "{}-{}-{i}",
        job.backend,
        job.scenario.replace('@', "-"),
        i = i + if job.inject.is_some() { 0 } else { 1_000_000 }
    );
    let log = dir.join(format!("{stem}.strace"));
    let output_path = dir.join(format!("{stem}.out"));
    let args = job.args(strace, &log);
    let command = format!("{} {}", exe.display(), args.join(" "));
    let mut outcome = Outcome {
        job,
        passed: false,
        why: String::new(),
        met: Vec::new(),
        injected: Vec::new(),
        window: Vec::new(),
        shifted: None,
        output: String::new(),
        command,
    };
    let output = match std::fs::File::create(&output_path) {
        Ok(f) => f,
        Err(e) => {
            outcome.why = format!("{}: {e}", output_path.display());
            return outcome;
        }
    };
    let stderr = match output.try_clone() {
        Ok(f) => f,
        Err(e) => {
            outcome.why = format!("dup: {e}");
            return outcome;
        }
    };
    let mut child = match Command::new(exe)
        .args(&args)
        .stdin(Stdio::null())
        .stdout(output)
        .stderr(stderr)
        .process_group(0)
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            outcome.why = format!("spawn: {e}");
            return outcome;
        }
    };
    let start = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if start.elapsed() > WATCHDOG => {
                // The whole group: the scenario and the strace it started, which
                // writes out its log on SIGTERM (which call it failed).
                // SAFETY: signals to our child's process group.
                unsafe { libc::kill(-(child.id() as libc::pid_t), libc::SIGTERM) };
                std::thread::sleep(Duration::from_millis(300));
                // SAFETY: as above.
                unsafe { libc::kill(-(child.id() as libc::pid_t), libc::SIGKILL) };
                let _ = child.wait();
                break None;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(2)),
            Err(e) => {
                outcome.why = format!("wait: {e}");
                return outcome;
            }
        }
    };
    // Whatever the scenario left (a forked child, strace): gone.
    // SAFETY: a signal to our child's process group (ESRCH if empty).
    unsafe { libc::kill(-(child.id() as libc::pid_t), libc::SIGKILL) };
    outcome.output = std::fs::read_to_string(&output_path).unwrap_or_default();
    let log_text = std::fs::read_to_string(&log).unwrap_or_default();
    outcome.met = outcome
        .output
        .lines()
        .filter_map(|l| l.strip_prefix("MET "))
        .map(str::to_owned)
        .collect();
    let result = outcome
        .output
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("RESULT "))
        .map(str::to_owned);
    outcome.why = match (status, result.as_deref()) {
        (None, _) => format!("hang: killed after {WATCHDOG:?}"),
        (Some(s), _) if s.signal().is_some() => {
            format!("killed by signal {} (abort?)", s.signal().unwrap_or(0))
        }
        (Some(s), Some("ok")) if s.success() => String::new(),
        (Some(s), Some(r)) => format!("exit {}: {r}", s.code().unwrap_or(-1)),
        (Some(s), None) => format!("exit {} with no RESULT (panic?)", s.code().unwrap_or(-1)),
    };
    // A run whose N-th call was another operation than the counting run's (a
    // futex wake where a wait was counted: a lock contended in one run and not
    // in the other) failed a call the plan did not choose: not a verdict.
    if let Some((planned, _)) = outcome.job.inject.as_ref() {
        if let Ok(inj) = refusals::injected(&log_text) {
            if let Some(other) = inj.iter().find(|c| c.row() != planned.row()) {
                outcome.shifted = Some(other.row());
                outcome.passed = true;
                outcome.why.clear();
                cleanup(&log, &output_path);
                return outcome;
            }
        }
    }
    if outcome.why.is_empty() {
        match outcome.job.inject.as_ref() {
            None => match refusals::window(&log_text) {
                Ok(w) => {
                    outcome.window = w;
                    outcome.passed = true;
                }
                Err(e) => outcome.why = e,
            },
            Some(_) => match refusals::injected(&log_text) {
                Ok(inj) if inj.len() <= 1 => {
                    outcome.passed = true;
                    outcome.injected = inj;
                }
                Ok(inj) => outcome.why = format!("{} calls injected, one planned", inj.len()),
                Err(e) => outcome.why = e,
            },
        }
    }
    cleanup(&log, &output_path);
    outcome
}

fn cleanup(log: &Path, output: &Path) {
    let _ = std::fs::remove_file(log);
    let _ = std::fs::remove_file(log.with_extension("stderr"));
    let _ = std::fs::remove_file(output);
}

/// One cell of the matrix: a backend's system call (row) and error.
#[derive(Default)]
struct Cell {
    runs: usize,
    survived: usize,
    /// Runs whose scenario did not reach the planned call (a count that varies
    /// with timing): they ran without a fault.
    unreached: usize,
    /// Runs that failed another operation than planned (not counted in `runs`).
    shifted: usize,
    /// What the caller got: `call: errno` or "absorbed", with counts.
    got: BTreeMap<String, usize>,
}

fn cells(runs: &[Outcome]) -> BTreeMap<(String, String, String), Cell> {
    let mut cells: BTreeMap<(String, String, String), Cell> = BTreeMap::new();
    for r in runs {
        let Some((call, error)) = &r.job.inject else {
            continue;
        };
        let cell = cells
            .entry((r.job.backend.clone(), call.row(), (*error).to_owned()))
            .or_default();
        if r.shifted.is_some() {
            cell.shifted += 1;
            continue;
        }
        cell.runs += 1;
        if r.passed {
            cell.survived += 1;
        }
        if r.injected.is_empty() {
            cell.unreached += 1;
            continue;
        }
        let got = if r.met.is_empty() {
            "absorbed".to_owned()
        } else {
            r.met.join(", ")
        };
        *cell.got.entry(got).or_default() += 1;
    }
    cells
}

fn got_text(cell: &Cell) -> String {
    cell.got
        .iter()
        .map(|(k, n)| {
            if cell.got.len() == 1 {
                k.clone()
            } else {
                format!("{k} ({n})")
            }
        })
        .collect::<Vec<_>>()
        .join("; ")
}

fn report(o: &Options, counted: &[Outcome], runs: &[Outcome]) -> String {
    let mut s = String::new();
    for b in &o.backends {
        let shifted = runs
            .iter()
            .filter(|r| &r.job.backend == b && r.shifted.is_some())
            .count();
        let mine: Vec<&Outcome> = runs
            .iter()
            .filter(|r| &r.job.backend == b && r.shifted.is_none())
            .collect();
        let survived = mine.iter().filter(|r| r.passed).count();
        let unreached = mine
            .iter()
            .filter(|r| r.passed && r.injected.is_empty())
            .count();
        let _ = writeln!(
            s,
            "\n== {b}: {} runs, {survived} survived, {} failed ({unreached} did not reach \
             their call; {shifted} more failed another operation than planned)",
            mine.len(),
            mine.len() - survived
        );
        for c in counted.iter().filter(|c| &c.job.backend == b) {
            let mut per: BTreeMap<String, usize> = BTreeMap::new();
            for call in &c.window {
                *per.entry(call.row()).or_default() += 1;
            }
            let runs_here = mine
                .iter()
                .filter(|r| r.job.scenario == c.job.scenario)
                .count();
            let calls: Vec<String> = per.iter().map(|(k, n)| format!("{k} x{n}")).collect();
            let _ = writeln!(
                s,
                "  {:<22} {:>4} runs; window: {}",
                c.job.scenario,
                runs_here,
                if calls.is_empty() {
                    "no system call".to_owned()
                } else {
                    calls.join(", ")
                }
            );
        }
        for ((backend, row, error), cell) in cells(runs) {
            if &backend != b {
                continue;
            }
            let _ = writeln!(
                s,
                "  {row:<22} {error:<7} {:>4} runs {:>4} survived{}  caller gets: {}",
                cell.runs,
                cell.survived,
                match (cell.unreached, cell.shifted) {
                    (0, 0) => String::new(),
                    (u, 0) => format!(" ({u} unreached)"),
                    (u, s) => format!(" ({u} unreached, {s} shifted)"),
                },
                got_text(&cell)
            );
        }
    }
    s
}

/// The matrix for docs/testing.md.
fn markdown(o: &Options, counted: &[Outcome], runs: &[Outcome]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "| backend | system call | error | runs | survived | the caller gets |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|");
    for ((backend, row, error), cell) in cells(runs) {
        let _ = writeln!(
            s,
            "| {backend} | `{row}` | {error} | {} | {} | {} |",
            cell.runs,
            cell.survived,
            got_text(&cell)
        );
    }
    let _ = writeln!(s);
    let _ = writeln!(s, "| scenario | {} |", o.backends.join(" | "));
    let _ = writeln!(s, "|---|{}", "---|".repeat(o.backends.len()));
    for sc in SCENARIOS {
        for role in sc.roles {
            let name = full_name(sc.name, *role);
            let mut line = format!("| `{name}` |");
            for b in &o.backends {
                let window = counted
                    .iter()
                    .find(|c| &c.job.backend == b && c.job.scenario == name)
                    .map_or(0, |c| c.window.len());
                let n = runs
                    .iter()
                    .filter(|r| &r.job.backend == b && r.job.scenario == name)
                    .count();
                let ok = runs
                    .iter()
                    .filter(|r| &r.job.backend == b && r.job.scenario == name && r.passed)
                    .count();
                let _ = write!(line, " {window} calls, {ok}/{n} |");
            }
            let _ = writeln!(s, "{line}");
        }
    }
    s
}
