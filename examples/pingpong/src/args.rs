//! The command line: `--pairs P --threads T --rounds R --backend NAME`, each flag
//! with a value (`--flag VALUE` or `--flag=VALUE`), and `--help`.

/// What to run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// Socketpairs (P).
    pub pairs: usize,
    /// Threads calling `deliver` on the one poller (T).
    pub threads: usize,
    /// Round trips in all, spread over the pairs (R).
    pub rounds: u64,
    /// A backend name, or `all`.
    pub backend: String,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            pairs: 8,
            threads: 2,
            rounds: 300_000,
            backend: "all".to_owned(),
        }
    }
}

/// What the command line asks for.
#[derive(Debug, PartialEq, Eq)]
pub enum Command {
    /// Run with this configuration.
    Run(Config),
    /// Print [`HELP`] and exit.
    Help,
}

/// The flags, as `--help` and the error messages name them.
pub const FLAGS: &str = "--pairs P, --threads T, --rounds R, --backend NAME, --help";

/// The text `--help` prints.
pub const HELP: &str = "\
pingpong: the main job of pollshot. P socketpairs, T threads delivering on one
shared poller, R round trips of 64 bytes in all; for each backend compiled for
this OS it prints round trips per second and system calls per round trip by kind.

usage: pingpong [--pairs P] [--threads T] [--rounds R] [--backend NAME]
  --pairs P        socketpairs (default 8)
  --threads T      threads calling deliver on the one poller (default 2)
  --rounds R       round trips in all, spread over the pairs (default 300000)
  --backend NAME   epoll, kqueue, ports, blocking, uring or all (default all:
                   those compiled here; uring needs --features io-uring)
  --help           this text
Values are whole numbers above 0; `--flag=VALUE` works too.";

/// Parses the arguments after the program name. The error is the message to
/// print (the caller exits with status 2).
pub fn parse(args: impl IntoIterator<Item = String>) -> Result<Command, String> {
    let mut config = Config::default();
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        if arg == "--help" || arg == "-h" {
            return Ok(Command::Help);
        }
        let Some(body) = arg.strip_prefix("--") else {
            return Err(format!(
                "unexpected argument {arg:?}: every setting is a flag with a value \
                 ({FLAGS})"
            ));
        };
        let (name, inline) = match body.split_once('=') {
            Some((name, value)) => (name, Some(value.to_owned())),
            None => (body, None),
        };
        let what = match name {
            "pairs" | "threads" | "rounds" => "a whole number above 0",
            "backend" => "epoll, kqueue, ports, blocking, uring or all",
            _ => return Err(format!("unknown flag {arg:?}; the flags are {FLAGS}")),
        };
        let value = match inline {
            Some(v) => v,
            None => match args.next() {
                Some(v) if v.starts_with("--") => {
                    return Err(format!(
                        "--{name} needs a value ({what}), but the next argument is the flag {v}"
                    ))
                }
                Some(v) => v,
                None => return Err(format!("--{name} needs a value ({what})")),
            },
        };
        let number = || match value.parse::<u64>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(format!("--{name} {value:?}: expected {what}")),
        };
        match name {
            "pairs" => config.pairs = usize::try_from(number()?).map_err(|e| e.to_string())?,
            "threads" => config.threads = usize::try_from(number()?).map_err(|e| e.to_string())?,
            "rounds" => config.rounds = number()?,
            _ => config.backend = value,
        }
    }
    Ok(Command::Run(config))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_strs(args: &[&str]) -> Result<Command, String> {
        parse(args.iter().map(|s| s.to_string()))
    }

    #[test]
    fn defaults_and_every_flag() {
        assert_eq!(parse_strs(&[]), Ok(Command::Run(Config::default())));
        let want = Config {
            pairs: 1,
            threads: 3,
            rounds: 2000,
            backend: "blocking".to_owned(),
        };
        let spaced = [
            "--pairs",
            "1",
            "--threads",
            "3",
            "--rounds",
            "2000",
            "--backend",
            "blocking",
        ];
        assert_eq!(parse_strs(&spaced), Ok(Command::Run(want.clone())));
        let joined = [
            "--pairs=1",
            "--threads=3",
            "--rounds=2000",
            "--backend=blocking",
        ];
        assert_eq!(parse_strs(&joined), Ok(Command::Run(want)));
        assert_eq!(parse_strs(&["--rounds", "5", "--help"]), Ok(Command::Help));
    }

    #[test]
    fn unknown_flag_names_it_and_lists_the_flags() {
        let e = parse_strs(&["--bogus"]).unwrap_err();
        assert!(e.starts_with("unknown flag \"--bogus\""), "{e}");
        assert!(e.contains(FLAGS), "{e}");
        let e = parse_strs(&["--bogus", "3"]).unwrap_err();
        assert!(e.starts_with("unknown flag \"--bogus\""), "{e}");
    }

    #[test]
    fn stray_word_is_named() {
        let e = parse_strs(&["--pairs", "2", "fast"]).unwrap_err();
        assert!(e.starts_with("unexpected argument \"fast\""), "{e}");
        assert!(e.contains(FLAGS), "{e}");
    }

    #[test]
    fn missing_value_says_so() {
        assert_eq!(
            parse_strs(&["--pairs"]).unwrap_err(),
            "--pairs needs a value (a whole number above 0)"
        );
        assert_eq!(
            parse_strs(&["--backend"]).unwrap_err(),
            "--backend needs a value (epoll, kqueue, ports, blocking, uring or all)"
        );
        let e = parse_strs(&["--threads", "--rounds", "9"]).unwrap_err();
        assert_eq!(
            e,
            "--threads needs a value (a whole number above 0), but the next argument \
             is the flag --rounds"
        );
    }

    #[test]
    fn bad_numbers_are_refused() {
        for bad in ["0", "-1", "x", "1.5", ""] {
            let e = parse_strs(&["--rounds", bad]).unwrap_err();
            assert_eq!(
                e,
                format!("--rounds {bad:?}: expected a whole number above 0")
            );
        }
        let e = parse_strs(&["--pairs=0"]).unwrap_err();
        assert_eq!(e, "--pairs \"0\": expected a whole number above 0");
    }
}
